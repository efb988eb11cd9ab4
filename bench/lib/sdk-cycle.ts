/**
 * `pnpm bench --sdk`: the task cycle and the plain call as SDK clients run them (issue 37), against the in-memory SDK
 * peer, in interleaved windows. Each virtual client is `Client` 1.32.2 with `StreamableHTTPClientTransport` and its
 * defaults, so it opens a GET stream on its session; a task call goes through `client.experimental.tasks
 * .callToolStream`: `tools/call` with `task`, then `tasks/get` every `pollInterval` the server suggests until the task
 * is terminal, then `tasks/result`. A plain call is `client.callTool`. Tool: `bench_noop`. `bench/lib/scenarios.ts`'s
 * `cycles` measures the raw-HTTP cycle (`tools/call` → `tasks/result`, no GET stream) that `pnpm bench` reports.
 *
 * Reported per C (1, 8, 32): throughput, p50, p99, and CPU per operation of each role (gateway, worker, Redis for
 * taskrelay; the peer's one process), so the ratio is taskrelay's server side against the peer's.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { setMaxListeners } from 'node:events';
import { loadavg } from 'node:os';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { startPeer, startStack, type RedisAdmin } from './procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './report.js';
import { CpuMeter, type CpuRoles } from './scenarios.js';
import { latency, now } from './stats.js';

export interface SdkCycleOptions {
  redis: TestRedis;
  admin: RedisAdmin;
  reps: number;
  windowMs: number;
  cleanup: Array<() => Promise<void> | void>;
  log: (message: string) => void;
}

const CS = [1, 8, 32] as const;

// The SDK client's transport adds an abort listener to its session's one signal per request and keeps it (1.32.2): a
// window of thousands of calls trips Node's leak warning in this load generator only. Quiet, not fixed: it is the
// client's, and what the bench measures is the servers.
setMaxListeners(0);
const KINDS = ['task', 'plain'] as const;
const TTL_MS = 5_000;

export async function openClients(url: string, count: number): Promise<Client[]> {
  return Promise.all(
    Array.from({ length: count }, async () => {
      const client = new Client(
        { name: 'bench-sdk', version: '0.0.0' },
        { capabilities: { tasks: { list: {}, cancel: {}, requests: {} } } },
      );
      await client.connect(new StreamableHTTPClientTransport(new URL(url)));
      return client;
    }),
  );
}

/** One operation as an SDK client runs it; throws when it did not complete. */
async function operation(client: Client, kind: 'task' | 'plain'): Promise<void> {
  const params = { name: 'bench_noop', arguments: {} };
  if (kind === 'plain') {
    const result = await client.callTool(params);
    if (result.isError) throw new Error(`tool error: ${JSON.stringify(result).slice(0, 200)}`);
    return;
  }
  for await (const message of client.experimental.tasks.callToolStream(params, CallToolResultSchema, {
    task: { ttl: TTL_MS },
  })) {
    if (message.type === 'error') throw message.error;
    if (message.type === 'result') return;
  }
  throw new Error('the task stream ended without a result');
}

/** A closed loop of `concurrency` clients for `durationMs`, with each role's CPU per operation. */
export async function sdkWindow(
  clients: Client[],
  kind: 'task' | 'plain',
  concurrency: number,
  durationMs: number,
  cpu: CpuRoles,
  totalRoles: string[],
): Promise<Record<string, number>> {
  const samples: number[] = [];
  let errors = 0;
  let firstError = '';
  const meter = new CpuMeter(cpu).start();
  const started = now();
  const deadline = started + durationMs;
  await Promise.all(
    Array.from({ length: concurrency }, (_, i) => clients[i % clients.length]!).map(async (client) => {
      while (now() < deadline) {
        const t0 = now();
        try {
          await operation(client, kind);
          samples.push(now() - t0);
        } catch (error) {
          errors++;
          firstError ||= error instanceof Error ? error.message : String(error);
          if (errors > 20) throw new Error(`${errors} failed operations; first: ${firstError}`, { cause: error });
        }
      }
    }),
  );
  if (samples.length === 0) throw new Error(`no operation succeeded; first error: ${firstError}`);
  const elapsedS = (now() - started) / 1000;
  const perOp = meter.perOp(samples.length);
  const lat = latency(samples);
  const total = totalRoles.reduce((n, r) => n + (perOp[`cpu.${r}`] ?? 0), 0);
  return { opsPerS: samples.length / elapsedS, p50: lat.p50, p99: lat.p99, errors, ...perOp, 'cpu.total': total };
}

export async function runSdkCycle(o: SdkCycleOptions): Promise<number> {
  const startedAt = new Date();
  const info = machine(o.admin.version);
  const [stack, peer] = await Promise.all([
    startStack({
      redisUrl: o.redis.url,
      prefix: uniquePrefix('sdk'),
      name: 'tr',
      gateways: 1,
      workers: 1,
      workerConcurrency: 64,
    }),
    startPeer(),
  ]);
  const redisPids = o.admin.pid > 0 ? [o.admin.pid] : [];
  const [trClients, peerClients] = await Promise.all([
    openClients(stack.gateways[0]!.url, 32),
    openClients(peer.url, 32),
  ]);
  o.cleanup.push(async () => {
    await Promise.all([...trClients, ...peerClients].map((c) => c.close().catch(() => undefined)));
  });
  const targets: Array<{ name: string; clients: Client[]; cpu: CpuRoles; totalRoles: string[] }> = [
    {
      name: 'tr',
      clients: trClients,
      cpu: {
        gateway: stack.gateways.map((p) => p.pid),
        worker: stack.workers.map((p) => p.pid),
        redis: redisPids,
      },
      totalRoles: ['gateway', 'worker', 'redis'],
    },
    { name: 'peer', clients: peerClients, cpu: { server: [peer.pid] }, totalRoles: ['server'] },
  ];
  const results = new Results();
  // Warm-up (JIT, connections): a window each, not recorded.
  for (const t of targets)
    for (const kind of KINDS) await sdkWindow(t.clients, kind, 32, o.windowMs / 2, t.cpu, t.totalRoles);
  for (let rep = 1; rep <= o.reps; rep++) {
    const order = rep % 2 === 1 ? targets : [...targets].reverse();
    for (const kind of KINDS) {
      for (const c of CS) {
        for (const t of order) {
          const name = `${t.name}.sdk.${kind}.c${c}`;
          try {
            results.addAll(name, await sdkWindow(t.clients, kind, c, o.windowMs, t.cpu, t.totalRoles));
            o.log(`rep ${rep} ${name}: done`);
          } catch (error) {
            const message = error instanceof Error ? error.message : String(error);
            results.errors.push({ scenario: name, rep, message });
            o.log(`rep ${rep} ${name}: FAILED: ${message}`);
          }
        }
      }
    }
  }
  const specs: RowSpec[] = [];
  for (const kind of KINDS) {
    const group =
      kind === 'task'
        ? 'SDK-client task cycle: tools/call+task → tasks/get (every pollInterval) → tasks/result, GET stream open'
        : 'SDK-client plain call: client.callTool, GET stream open';
    for (const c of CS) {
      const id = (t: string, k: string) => `${t}.sdk.${kind}.c${c}.${k}`;
      const ref = (k: string) => ({ id: id('peer', k), name: 'peer' });
      specs.push(
        {
          group,
          label: `C=${c} throughput`,
          unit: 'ops/s',
          id: id('tr', 'opsPerS'),
          ref: ref('opsPerS'),
          better: 'higher',
        },
        { group, label: `C=${c} latency p50`, unit: 'ms', id: id('tr', 'p50'), ref: ref('p50'), better: 'lower' },
        {
          group,
          label: `C=${c} CPU per op, gateway + worker + Redis (peer: its process)`,
          unit: 'CPU-ms',
          id: id('tr', 'cpu.total'),
          ref: ref('cpu.total'),
          better: 'lower',
        },
        { group, label: `C=${c} CPU per op, gateway`, unit: 'CPU-ms', id: id('tr', 'cpu.gateway') },
        { group, label: `C=${c} CPU per op, worker`, unit: 'CPU-ms', id: id('tr', 'cpu.worker') },
        { group, label: `C=${c} CPU per op, Redis`, unit: 'CPU-ms', id: id('tr', 'cpu.redis') },
      );
    }
  }
  const rows = buildRows(results, specs);
  info.loadavgAtEnd = loadavg().map((v) => Math.round(v * 100) / 100);
  console.log(
    `\ntaskrelay bench --sdk — ${o.reps} interleaved repetitions, ${o.windowMs} ms windows, ` +
      `wall ${((Date.now() - startedAt.getTime()) / 1000).toFixed(0)} s`,
  );
  console.log(renderTable(rows));
  for (const e of results.errors) console.log(`error: ${e.scenario} rep ${e.rep}: ${e.message}`);
  const file = await writeResults(
    {
      mode: 'sdk',
      machine: info,
      parameters: { reps: o.reps, windowMs: o.windowMs, concurrency: [...CS] },
      rows,
      metrics: Object.fromEntries([...results.values.keys()].sort().map((k) => [k, results.get(k) ?? null])),
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return results.errors.length > 0 ? 1 : 0;
}

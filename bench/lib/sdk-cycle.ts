/**
 * `pnpm bench --sdk`: the task cycle and the plain call as SDK clients run them (issue 37), against the in-memory SDK
 * peer, in interleaved windows. Each virtual client is `Client` 1.32.2 with `StreamableHTTPClientTransport` and its
 * defaults, so it opens a GET stream on its session; a task call goes through `client.experimental.tasks
 * .callToolStream`: `tools/call` with `task`, then `tasks/get` every `pollInterval` the server suggests until the task
 * is terminal, then `tasks/result`. A plain call is `client.callTool`. Tool: `bench_noop`. `bench/lib/scenarios.ts`'s
 * `cycles` measures the raw-HTTP cycle (`tools/call` → `tasks/result`, no GET stream) that `pnpm bench` reports.
 *
 * The 2026-07-28 era's SDK client runs in the same windows against taskrelay (bench/lib/ext-tasks.ts: v2 `Client` +
 * ext-tasks, its rows referenced to taskrelay's SDK 1.32.2 rows: no SDK peer serves that era). With `--fastmcp`,
 * FastMCP + Docket (bench/fastmcp_peer.py, bench/lib/fastmcp.ts) is a third target: its task cycle with the ext-tasks
 * client (FastMCP 4 serves tasks on 2026-07-28 only), its plain call with both clients.
 *
 * Reported per C (1, 8, 32): throughput, p50, p99, and CPU per operation of each role (gateway, worker, Redis for
 * taskrelay; the peer's one process; FastMCP's process and Redis), so the ratio is taskrelay's server side against
 * the peer's.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { setMaxListeners } from 'node:events';
import { loadavg } from 'node:os';
import { FIRST_POLL_MS } from '@taskrelay/shared';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import type { ManagedProcess } from '../../test/helpers/processes.js';
import { openExtClients, type ExtRunner } from './ext-tasks.js';
import { ensureFastmcpVenv, startFastmcpPeer } from './fastmcp.js';
import { assertAlive, startPeer, startStack, type RedisAdmin } from './procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './report.js';
import { CpuMeter, type CpuRoles } from './scenarios.js';
import { latency, now } from './stats.js';

export interface SdkCycleOptions {
  redis: TestRedis;
  admin: RedisAdmin;
  reps: number;
  windowMs: number;
  /** Also FastMCP + Docket (bench/fastmcp_peer.py, installed into .venv-bench on first use). */
  fastmcp: boolean;
  /** The `pollIntervalMs` FastMCP suggests (one value for every answer); default `FASTMCP_POLL_MS`. */
  fastmcpPollMs?: number;
  cleanup: Array<() => Promise<void> | void>;
  log: (message: string) => void;
}

const CS = [1, 8, 32] as const;
const WORKER_CONCURRENCY = 64;

// The SDK client's transport adds an abort listener to its session's one signal per request and keeps it (1.32.2): a
// window of thousands of calls trips Node's leak warning in this load generator only. Quiet, not fixed: it is the
// client's, and what the bench measures is the servers.
setMaxListeners(0);
const KINDS = ['task', 'plain'] as const;
const TTL_MS = 5_000;

export async function openClients(url: string, count: number, token?: string): Promise<Client[]> {
  const options = token === undefined ? {} : { requestInit: { headers: { Authorization: `Bearer ${token}` } } };
  return Promise.all(
    Array.from({ length: count }, async () => {
      const client = new Client(
        { name: 'bench-sdk', version: '0.0.0' },
        { capabilities: { tasks: { list: {}, cancel: {}, requests: {} } } },
      );
      await client.connect(new StreamableHTTPClientTransport(new URL(url), options));
      return client;
    }),
  );
}

/**
 * The `tasks/get` answers SDK 1.32.2 task cycles read, all clients together: a window reports them per cycle
 * (`polls`). One is the least a cycle reads (its first poll finds the task ended); each more cost the client a
 * `pollInterval` of waiting.
 */
const polls = { count: 0 };

/** One operation as an SDK client runs it; throws when it did not complete. */
export async function operation(client: Client, kind: 'task' | 'plain'): Promise<void> {
  const params = { name: 'bench_noop', arguments: {} };
  if (kind === 'plain') {
    const result = await client.callTool(params);
    if (result.isError) throw new Error(`tool error: ${JSON.stringify(result).slice(0, 200)}`);
    return;
  }
  for await (const message of client.experimental.tasks.callToolStream(params, CallToolResultSchema, {
    task: { ttl: TTL_MS },
  })) {
    if (message.type === 'taskStatus') polls.count++;
    if (message.type === 'error') throw message.error;
    if (message.type === 'result') return;
  }
  throw new Error('the task stream ended without a result');
}

/** One virtual client's operation of a kind; throws when it did not complete. */
export type Runner = () => Promise<void>;

/** A closed loop of `concurrency` SDK 1.32.2 clients for `durationMs`, with each role's CPU per operation. */
export function sdkWindow(
  clients: Client[],
  kind: 'task' | 'plain',
  concurrency: number,
  durationMs: number,
  cpu: CpuRoles,
  totalRoles: string[],
): Promise<Record<string, number>> {
  const runners = clients.map((client) => () => operation(client, kind));
  return closedLoop(runners, concurrency, durationMs, cpu, totalRoles);
}

/** A closed loop of `concurrency` runners (client i runs `runners[i % n]`) for `durationMs`, with CPU per op. */
export async function closedLoop(
  runners: Runner[],
  concurrency: number,
  durationMs: number,
  cpu: CpuRoles,
  totalRoles: string[],
): Promise<Record<string, number>> {
  const samples: number[] = [];
  let errors = 0;
  let firstError = '';
  const meter = new CpuMeter(cpu).start();
  const pollsBefore = polls.count;
  const started = now();
  const deadline = started + durationMs;
  await Promise.all(
    Array.from({ length: concurrency }, (_, i) => runners[i % runners.length]!).map(async (run) => {
      while (now() < deadline) {
        const t0 = now();
        try {
          await run();
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
  const metrics = {
    opsPerS: samples.length / elapsedS,
    p50: lat.p50,
    p99: lat.p99,
    errors,
    ...perOp,
    'cpu.total': total,
  };
  const polled = polls.count - pollsBefore;
  return polled > 0 ? { ...metrics, polls: polled / samples.length } : metrics;
}

/** What one target serves and how it is measured: per kind, one runner per virtual client. */
interface Target {
  name: string;
  runners: Partial<Record<Kind, Runner[]>>;
  cpu: CpuRoles;
  totalRoles: string[];
  deps: ManagedProcess[];
}
type Kind = (typeof KINDS)[number];

/** Docket's db on the bench's Redis (taskrelay's stacks use db 0 under their own prefixes). */
const DOCKET_DB = 1;
/**
 * The `pollIntervalMs` the FastMCP peer suggests by default: what taskrelay's create suggests (`FIRST_POLL_MS`, 10 ms,
 * PROTOCOL.md §28.2), so the ext-tasks client reads both first at the same time. FastMCP suggests one value for every
 * answer; its own default (5 s) would make every no-op task cost 5 s. `--fastmcp-poll-ms` runs it at another value:
 * at 50 ms (taskrelay's shortest later suggestion, this bench's default until §28.2) it did fewer cycles at every C.
 */
const FASTMCP_POLL_MS = FIRST_POLL_MS;

export async function runSdkCycle(o: SdkCycleOptions): Promise<number> {
  const startedAt = new Date();
  const info = machine(o.admin.version);
  const python = o.fastmcp ? ensureFastmcpVenv(o.log) : undefined;
  const [stack, peer, fastmcp] = await Promise.all([
    startStack({
      redisUrl: o.redis.url,
      prefix: uniquePrefix('sdk'),
      name: 'tr',
      gateways: 1,
      workers: 1,
      workerConcurrency: WORKER_CONCURRENCY,
    }),
    startPeer(),
    python === undefined
      ? undefined
      : startFastmcpPeer({
          python,
          redisUrl: o.redis.url,
          db: DOCKET_DB,
          name: uniquePrefix('fastmcp'),
          pollIntervalMs: o.fastmcpPollMs ?? FASTMCP_POLL_MS,
          concurrency: WORKER_CONCURRENCY,
        }),
  ]);
  const redisPids = o.admin.pid > 0 ? [o.admin.pid] : [];
  const trUrl = stack.gateways[0]!.url;
  const [trClients, peerClients, trExt, fmClients, fmExt] = await Promise.all([
    openClients(trUrl, 32),
    openClients(peer.url, 32),
    openExtClients(trUrl, 32),
    fastmcp === undefined ? [] : openClients(fastmcp.url, 32),
    fastmcp === undefined ? [] : openExtClients(fastmcp.url, 32),
  ]);
  o.cleanup.push(async () => {
    await Promise.all([
      ...[...trClients, ...peerClients, ...fmClients].map((c) => c.close().catch(() => undefined)),
      ...[...trExt, ...fmExt].map((c) => c.close().catch(() => undefined)),
    ]);
  });
  const sdk = (clients: Client[]) => ({
    task: clients.map((c) => () => operation(c, 'task')),
    plain: clients.map((c) => () => operation(c, 'plain')),
  });
  const ext = (runners: ExtRunner[]) => ({
    task: runners.map((r) => () => r.task()),
    plain: runners.map((r) => () => r.plain()),
  });
  const trRoles = {
    cpu: {
      gateway: stack.gateways.map((p) => p.pid),
      worker: stack.workers.map((p) => p.pid),
      redis: redisPids,
    },
    totalRoles: ['gateway', 'worker', 'redis'],
    deps: [...stack.gateways, ...stack.workers],
  };
  const targets: Target[] = [
    { name: 'tr', runners: sdk(trClients), ...trRoles },
    { name: 'peer', runners: sdk(peerClients), cpu: { server: [peer.pid] }, totalRoles: ['server'], deps: [peer] },
    { name: 'tr26', runners: ext(trExt), ...trRoles },
  ];
  if (fastmcp !== undefined) {
    // Docket's worker runs inside the FastMCP process (the tasks extension's lifespan); its queue is in Redis.
    const fmRoles = {
      cpu: { server: [fastmcp.pid], redis: redisPids },
      totalRoles: ['server', 'redis'],
      deps: [fastmcp],
    };
    // FastMCP 4 serves tasks on 2026-07-28 only: SDK 1.32.2's callToolStream gets no task from it, so its task
    // cycle is the ext-tasks client's; the SDK 1.32.2 client still makes its plain calls.
    targets.push({ name: 'fm', runners: { plain: sdk(fmClients).plain }, ...fmRoles });
    targets.push({ name: 'fm26', runners: ext(fmExt), ...fmRoles });
  }
  const results = new Results();
  const window = (t: Target, kind: Kind, c: number, ms: number) =>
    closedLoop(t.runners[kind]!, c, ms, t.cpu, t.totalRoles);
  // Warm-up (JIT, connections): a window each, not recorded.
  for (const t of targets) {
    for (const kind of KINDS) {
      if (!t.runners[kind]) continue;
      await window(t, kind, 32, o.windowMs / 2).catch((error: unknown) => {
        o.log(`warm-up ${t.name}.sdk.${kind}: FAILED: ${error instanceof Error ? error.message : String(error)}`);
      });
    }
  }
  const taskKinds = (runners: ExtRunner[]) =>
    runners.reduce((n, r) => ({ task: n.task + r.kinds.task, immediate: n.immediate + r.kinds.immediate }), {
      task: 0,
      immediate: 0,
    });
  for (let rep = 1; rep <= o.reps; rep++) {
    const order = rep % 2 === 1 ? targets : [...targets].reverse();
    for (const kind of KINDS) {
      for (const c of CS) {
        for (const t of order) {
          if (!t.runners[kind]) continue;
          const name = `${t.name}.sdk.${kind}.c${c}`;
          try {
            assertAlive(t.deps, name);
            const extRunners = t.name === 'tr26' ? trExt : t.name === 'fm26' ? fmExt : undefined;
            const before = extRunners && taskKinds(extRunners);
            const metrics = await window(t, kind, c, o.windowMs);
            if (kind === 'task' && extRunners && before) {
              // The share of ext-tasks calls the server answered with a task (the rest came back at once).
              const after = taskKinds(extRunners);
              const tasks = after.task - before.task;
              metrics['taskShare'] = tasks / Math.max(1, tasks + after.immediate - before.immediate);
            }
            results.addAll(name, metrics);
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
  const rows = buildRows(results, rowSpecs(fastmcp !== undefined));
  info.loadavgAtEnd = loadavg().map((v) => Math.round(v * 100) / 100);
  console.log(
    `\ntaskrelay bench --sdk${o.fastmcp ? ' --fastmcp' : ''} — ${o.reps} interleaved repetitions, ${o.windowMs} ms ` +
      `windows, wall ${((Date.now() - startedAt.getTime()) / 1000).toFixed(0)} s`,
  );
  console.log(
    `machine: ${info.cpuModel}, ${info.cores} cores, node ${info.node}, redis ${info.redis}, ` +
      `load average ${info.loadavgAtStart.join(' ')} → ${info.loadavgAtEnd.join(' ')}`,
  );
  console.log('ratio = taskrelay / reference (medians); ↑ higher is better, ↓ lower is better. CPU-ms per op.');
  console.log(renderTable(rows));
  for (const e of results.errors) console.log(`error: ${e.scenario} rep ${e.rep}: ${e.message}`);
  const file = await writeResults(
    {
      mode: o.fastmcp ? 'sdk+fastmcp' : 'sdk',
      machine: info,
      parameters: {
        reps: o.reps,
        windowMs: o.windowMs,
        concurrency: [...CS],
        ...(o.fastmcp
          ? { fastmcpPollIntervalMs: o.fastmcpPollMs ?? FASTMCP_POLL_MS, docketConcurrency: WORKER_CONCURRENCY }
          : {}),
      },
      rows,
      metrics: Object.fromEntries([...results.values.keys()].sort().map((k) => [k, results.get(k) ?? null])),
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return results.errors.length > 0 ? 1 : 0;
}

/** The table: taskrelay's rows against the SDK peer, the 2026-07-28 client's, and (with --fastmcp) FastMCP's. */
function rowSpecs(withFastmcp: boolean): RowSpec[] {
  const specs: RowSpec[] = [];
  /** Throughput, p50 and CPU per op of `t` against `ref`, then `t`'s per-role CPU when it is taskrelay. */
  const rows = (group: string, kind: Kind, c: number, t: string, ref: { t: string; name: string }, refCpu: string) => {
    const id = (target: string, k: string) => `${target}.sdk.${kind}.c${c}.${k}`;
    const r = (k: string) => ({ id: id(ref.t, k), name: ref.name });
    specs.push(
      { group, label: `C=${c} throughput`, unit: 'ops/s', id: id(t, 'opsPerS'), ref: r('opsPerS'), better: 'higher' },
      { group, label: `C=${c} latency p50`, unit: 'ms', id: id(t, 'p50'), ref: r('p50'), better: 'lower' },
      {
        group,
        label: `C=${c} CPU per op, gateway + worker + Redis (${refCpu})`,
        unit: 'CPU-ms',
        id: id(t, 'cpu.total'),
        ref: r('cpu.total'),
        better: 'lower',
      },
    );
  };
  const perRole = (group: string, kind: Kind, c: number, t: string) => {
    const id = (k: string) => `${t}.sdk.${kind}.c${c}.${k}`;
    specs.push(
      { group, label: `C=${c} CPU per op, gateway`, unit: 'CPU-ms', id: id('cpu.gateway') },
      { group, label: `C=${c} CPU per op, worker`, unit: 'CPU-ms', id: id('cpu.worker') },
      { group, label: `C=${c} CPU per op, Redis`, unit: 'CPU-ms', id: id('cpu.redis') },
    );
  };
  for (const kind of KINDS) {
    const group =
      kind === 'task'
        ? 'SDK 1.32.2 task cycle: tools/call+task → tasks/get (every pollInterval) → tasks/result, GET stream open'
        : 'SDK 1.32.2 plain call: client.callTool, GET stream open';
    for (const c of CS) {
      rows(group, kind, c, 'tr', { t: 'peer', name: 'SDK peer' }, 'peer: its process');
      if (kind === 'task') {
        const id = (t: string) => `${t}.sdk.task.c${c}.polls`;
        specs.push({
          group,
          label: `C=${c} tasks/get per cycle`,
          unit: '',
          id: id('tr'),
          ref: { id: id('peer'), name: 'SDK peer' },
          better: 'lower',
        });
      }
      perRole(group, kind, c, 'tr');
    }
  }
  for (const kind of KINDS) {
    const group =
      kind === 'task'
        ? '2026-07-28 SDK client (v2 Client + ext-tasks) task cycle: tools/call → tasks/get (every pollIntervalMs), ' +
          "result inlined; reference: taskrelay's SDK 1.32.2 rows above (no SDK peer serves 2026-07-28)"
        : "2026-07-28 SDK client (v2 Client) plain call: client.callTool; reference: taskrelay's SDK 1.32.2 rows above";
    for (const c of CS) {
      rows(group, kind, c, 'tr26', { t: 'tr', name: 'tr 2025' }, 'both taskrelay');
      perRole(group, kind, c, 'tr26');
      if (kind === 'task')
        specs.push({
          group,
          label: `C=${c} share answered with a task`,
          unit: '',
          id: `tr26.sdk.task.c${c}.taskShare`,
        });
    }
  }
  if (!withFastmcp) return specs;
  const fmCpu = 'FastMCP: its process, Docket inside, + Redis';
  {
    const group =
      'FastMCP 4.1.4 + Docket task cycle, the 2026-07-28 ext-tasks client on both (FastMCP 4 serves tasks on 2026-07-28 only)';
    for (const c of CS) {
      rows(group, 'task', c, 'tr26', { t: 'fm26', name: 'FastMCP' }, fmCpu);
      specs.push(
        {
          group,
          label: `C=${c} FastMCP CPU per op, its process`,
          unit: 'CPU-ms',
          id: `fm26.sdk.task.c${c}.cpu.server`,
        },
        { group, label: `C=${c} FastMCP CPU per op, Redis`, unit: 'CPU-ms', id: `fm26.sdk.task.c${c}.cpu.redis` },
        { group, label: `C=${c} FastMCP share answered with a task`, unit: '', id: `fm26.sdk.task.c${c}.taskShare` },
      );
    }
  }
  {
    const group = 'FastMCP 4.1.4 plain call, SDK 1.32.2 client.callTool on both (GET stream open)';
    for (const c of CS) rows(group, 'plain', c, 'tr', { t: 'fm', name: 'FastMCP' }, fmCpu);
  }
  {
    const group = 'FastMCP 4.1.4 plain call, 2026-07-28 v2 client.callTool on both';
    for (const c of CS) rows(group, 'plain', c, 'tr26', { t: 'fm26', name: 'FastMCP' }, fmCpu);
  }
  return specs;
}

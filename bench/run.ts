/**
 * `pnpm bench` — one command that starts everything it measures (its own redis-server, taskrelay gateways and
 * workers from the built dist, the SDK peer, a raw BullMQ worker), runs every scenario in interleaved repetitions,
 * prints one table (median and min–max over repetitions, a reference, the ratio) and writes bench/results/<date>.json.
 *
 *   pnpm bench                      full run (5 repetitions, 5 s windows)
 *   pnpm bench --quick              smoke test (2 repetitions, 1 s windows; well under 3 minutes)
 *   pnpm bench --soak [--minutes N] steady mixed load over ~50 sessions for N minutes (default 5), short ttls
 *   pnpm bench --load               1,000 concurrent tasks over 50 sessions
 *   pnpm bench --fair               fair share (PROTOCOL §25): one principal's task behind another's backlog, and
 *                                   the cost per enqueue
 *   pnpm bench --batch              a 10,000-child batch (PROTOCOL §26) on 1, 2 and 4 workers against a raw BullMQ
 *                                   FlowProducer of the same size
 *   pnpm bench --ab DIR [--auth]    A/B: another built checkout (A) against this one (B), interleaved windows of
 *                                   plain calls and task cycles at C=1 and 32 (bench/lib/ab.ts)
 *   pnpm bench --sdk [--fastmcp]    the cycles as SDK clients run them (Client + its GET stream, callToolStream's
 *                                   tasks/get polling, callTool) against the peer, C=1, 8, 32, and the 2026-07-28
 *                                   client (v2 Client + ext-tasks) on taskrelay (bench/lib/sdk-cycle.ts); --fastmcp
 *                                   adds FastMCP + Docket (bench/fastmcp_peer.py, installed into .venv-bench);
 *                                   --fastmcp-poll-ms N: the pollIntervalMs FastMCP suggests (default 10)
 *   pnpm bench --redis-work [--trace] [--python] [--reps N]
 *                                   Redis commands (by name, scripts' own included) and CPU per task cycle, plain
 *                                   call, progress update and cancel, beside the raw BullMQ floor's, on a Redis of its
 *                                   own (bench/lib/redis-work.ts), and each call's time inside Redis by script;
 *                                   --reps N repeats the floor, task and plain windows (the median ratio to the
 *                                   floor); --trace prints one cycle through MONITOR. The full run ends with the same
 *                                   section.
 *   pnpm bench --create-path        the gateway's create path alone: BullMQ's add in the create script vs after it
 *   pnpm bench --outputs            task output as resources (PROTOCOL §34): gateway and Redis memory for 50
 *                                   concurrent reads of a 16 MiB result, and ctx.output → notification latency
 *   pnpm bench --webhooks           webhook fairness (PROTOCOL §27.3): another principal's webhook while 1, 4 and 16
 *                                   principals' receivers hang (bench/lib/webhooks.ts)
 *   pnpm bench --limits             keyed limits (PROTOCOL §3.5, issue 48 F2): alice's wait behind bob's 6 runs on one
 *                                   tenant, per principal and acrossPrincipals, concurrency and rate keys
 *                                   (bench/lib/limits.ts)
 *   options: --reps N, --window-ms N (compare and A/B modes)
 *
 * Exit code 0 when every scenario ran, 1 when one failed (it is reported and the others still run).
 * Everything started is stopped by PID (test/helpers/processes.ts), also on error or Ctrl-C. Loopback only.
 * See docs/PERFORMANCE.md for the method.
 */
import { parseArgs } from 'node:util';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { runAb } from './lib/ab.js';
import { runCreatePath } from './lib/create-path.js';
import { runOutputs } from './lib/outputs.js';
import { runSdkCycle } from './lib/sdk-cycle.js';
import { runBatch } from './lib/batch.js';
import { renderRedisWork, runRedisWork } from './lib/redis-work.js';
import { startRedis, uniquePrefix, type TestRedis } from '../test/helpers/redis.js';
import { PYTHON, stopAll, type GatewayProcess } from '../test/helpers/processes.js';
import { modernClients, openSessions, type McpSession, type ModernClient } from './lib/mcp-http.js';
import {
  RedisAdmin,
  assertAlive,
  removeProbeDir,
  startFloorWorker,
  startPeer,
  startStack,
  type Stack,
} from './lib/procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './lib/report.js';
import {
  BullFloor,
  cancelLatency,
  cycles,
  memoryPerTask,
  peerMemoryPerTask,
  progressLatency,
  rawPubSub,
  retainedBytes,
  slotHandoff,
  type CpuRoles,
} from './lib/scenarios.js';
import { latency, sleep } from './lib/stats.js';
import { runLoad } from './lib/load.js';
import { runFair } from './lib/fair.js';
import { runLimits } from './lib/limits.js';
import { runWebhooks } from './lib/webhooks.js';
import { runSoak } from './lib/soak.js';
import { pollingClient } from './lib/polling.js';

const { values: args } = parseArgs({
  // `pnpm bench -- --quick` passes the `--` through; `pnpm bench --quick` does not.
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    quick: { type: 'boolean', default: false },
    soak: { type: 'boolean', default: false },
    load: { type: 'boolean', default: false },
    fair: { type: 'boolean', default: false },
    limits: { type: 'boolean', default: false },
    batch: { type: 'boolean', default: false },
    sdk: { type: 'boolean', default: false },
    fastmcp: { type: 'boolean', default: false },
    'fastmcp-poll-ms': { type: 'string' },
    ab: { type: 'string' },
    'create-path': { type: 'boolean', default: false },
    'redis-work': { type: 'boolean', default: false },
    trace: { type: 'boolean', default: false },
    python: { type: 'boolean', default: false },
    outputs: { type: 'boolean', default: false },
    webhooks: { type: 'boolean', default: false },
    auth: { type: 'boolean', default: false },
    minutes: { type: 'string' },
    reps: { type: 'string' },
    'window-ms': { type: 'string' },
  },
  allowPositionals: false,
});

const QUICK = args.quick === true;
const REPS = Number(args.reps ?? (QUICK ? 2 : 5));
const WINDOW_MS = Number(args['window-ms'] ?? (QUICK ? 1_000 : 5_000));
/**
 * Warm-up per target, in operations (capped in time): a gateway spends up to twice the CPU per operation during its
 * first few thousand operations (JIT tiering), so a stack that only serves the scaling rows needs them before it is
 * measured.
 */
const WARMUP_OPS = QUICK ? 2_000 : 6_000;
const WARMUP_MS = QUICK ? 6_000 : 30_000;
const CONCURRENCY = [1, 8, 32] as const;
/**
 * Short ttl for the throughput scenarios, so their terminal tasks do not pile up. It was 1 s (the gateway's minimum):
 * on a machine busy enough that a gateway took over a second between a task's end and the client's `tasks/result`,
 * the task had expired (`Task not found`), which failed whole windows; 5 s keeps a few thousand hashes at most.
 */
const CYCLE_TTL_MS = 5_000;
/** The tool of the controls rows: bench_noop under a concurrency and a rate limit that never bind (§3.3). */
const LIMITED = { name: 'bench_limited', arguments: {} };
const KEYED = { name: 'bench_keyed', arguments: {} };
/** Outlives one memory measurement; the next repetition's waits until these have expired. */
const MEMORY_TTL_MS = QUICK ? 15_000 : 60_000;
const MEMORY_TASKS = QUICK ? 400 : 2_000;
/** Failed tasks kept for a week per repetition, to measure the Redis bytes of each (PROTOCOL.md §30.1). */
const RETAINED_TASKS = QUICK ? 200 : 1_000;
const PROGRESS_UPDATES = QUICK ? 10 : 20;
const PROGRESS_INTERVAL_MS = 75; // above the 50 ms default throttle: no update is coalesced away
const CANCEL_ROUNDS_1 = QUICK ? 3 : 20;
const CANCEL_ROUNDS_32 = QUICK ? 1 : 2;
const WORKER_CONCURRENCY = 64;
/**
 * Slot-bound scaling: task cycles of `bench_hold` (HOLD_MS) from HOLD_CLIENTS clients. One worker's 64 slots finish at
 * most 64 / HOLD_MS tasks per second, so the rows show capacity added by workers (and gateways) while the gateway
 * still has CPU to spare, the case of tools that wait on I/O.
 */
const HOLD_MS = 100;
/** The polling-client rows (§28): the task's run time, and how many tasks one after another per repetition. */
const POLL_HOLD_MS = 300;
const POLL_TASKS = QUICK ? 3 : 10;
const HOLD_CLIENTS = 128;
/** The slot hand-off rows (§3.3, §3.5): runs one at a time per lane, each holding SLOT_HOLD_MS. */
const SLOT_RUNS = QUICK ? 8 : 20;
const SLOT_HOLD_MS = 20;
const SLOT_TOOLS = { keyed: 'bench_slot_keyed', queue: 'bench_slot_queue' } as const;

/** Anything started here, for the finally block and signals. */
const cleanup: Array<() => Promise<void> | void> = [];
let stopping = false;
async function stopEverything(): Promise<void> {
  if (stopping) return;
  stopping = true;
  for (const fn of cleanup.reverse()) await Promise.resolve(fn()).catch(() => undefined);
  await stopAll();
  removeProbeDir();
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    console.error(`\n${signal}: stopping every process the benchmark started`);
    void stopEverything().finally(() => process.exit(130));
  });
}

async function startInfra(): Promise<{ redis: TestRedis; admin: RedisAdmin }> {
  const redis = await startRedis({ owned: true });
  cleanup.push(() => redis.stop());
  const admin = new RedisAdmin(redis.url);
  cleanup.push(() => admin.close());
  await admin.init();
  return { redis, admin };
}

/** A whole number above 0 given as `flag`'s value; anything else stops the bench with one line. */
function positiveInt(flag: string, value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0)
    throw new Error(`${flag}: expected a whole number above 0, got ${JSON.stringify(value)}`);
  return n;
}

function log(message: string): void {
  process.stderr.write(`bench: ${message}\n`);
}

/** Runs one scenario of one repetition with a time bound; a failure is recorded, reported and the run goes on. */
async function guarded(
  results: Results,
  name: string,
  rep: number,
  timeoutMs: number,
  deps: Array<{ child: GatewayProcess['child']; pid: number; output(): string }>,
  sessions: Array<McpSession | ModernClient>,
  fn: () => Promise<Record<string, number> | void>,
): Promise<void> {
  const started = Date.now();
  try {
    assertAlive(deps as never, name);
    let timer: NodeJS.Timeout | undefined;
    const metrics = await Promise.race([
      fn(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
      }),
    ]).finally(() => clearTimeout(timer));
    if (metrics) results.addAll(name, metrics);
    log(`rep ${rep} ${name}: ${Date.now() - started} ms`);
  } catch (error) {
    for (const s of sessions) s.abortInflight();
    const message = error instanceof Error ? error.message : String(error);
    results.errors.push({ scenario: name, rep, message });
    log(`rep ${rep} ${name}: FAILED: ${message}`);
  }
}

interface Target {
  name: string;
  sessions: Array<McpSession | ModernClient>;
  cpu: CpuRoles;
  totalRoles: string[];
  deps: Array<{ child: GatewayProcess['child']; pid: number; output(): string }>;
}

function rowSpecs(): RowSpec[] {
  const rows: RowSpec[] = [];
  const g = 'floors';
  rows.push(
    { group: g, label: 'raw BullMQ no-op jobs, C=32', unit: 'jobs/s', id: 'floor.bullmq.c32.opsPerS' },
    { group: g, label: 'raw BullMQ add→completed, C=1, p50', unit: 'ms', id: 'floor.bullmq.c1.p50' },
    { group: g, label: 'raw BullMQ add→completed, C=1, p99', unit: 'ms', id: 'floor.bullmq.c1.p99' },
    { group: g, label: 'raw BullMQ add→completed, C=32, p50', unit: 'ms', id: 'floor.bullmq.c32.p50' },
    { group: g, label: 'raw BullMQ add→completed, C=32, p99', unit: 'ms', id: 'floor.bullmq.c32.p99' },
    { group: g, label: 'raw BullMQ worker CPU per job, C=32', unit: 'CPU-ms', id: 'floor.bullmq.c32.cpu.worker' },
    { group: g, label: 'raw BullMQ Redis CPU per job, C=32', unit: 'CPU-ms', id: 'floor.bullmq.c32.cpu.redis' },
    { group: g, label: 'raw ioredis pub/sub, 1 publisher, p50', unit: 'ms', id: 'floor.pubsub.n1.p50' },
    { group: g, label: 'raw ioredis pub/sub, 1 publisher, p99', unit: 'ms', id: 'floor.pubsub.n1.p99' },
    { group: g, label: 'raw ioredis pub/sub, 32 publishers, p50', unit: 'ms', id: 'floor.pubsub.n32.p50' },
    { group: g, label: 'raw ioredis pub/sub, 32 publishers, p99', unit: 'ms', id: 'floor.pubsub.n32.p99' },
  );
  for (const kind of ['task', 'plain'] as const) {
    const group = kind === 'task' ? 'task cycle: tools/call+task → tasks/result' : 'plain call: tools/call';
    for (const c of CONCURRENCY) {
      const id = (t: string, k: string) => `${t}.${kind}.c${c}.${k}`;
      rows.push(
        {
          group,
          label: `C=${c} throughput`,
          unit: 'ops/s',
          id: id('tr', 'opsPerS'),
          ref: { id: id('peer', 'opsPerS'), name: 'peer' },
          better: 'higher',
        },
        {
          group,
          label: `C=${c} latency p50`,
          unit: 'ms',
          id: id('tr', 'p50'),
          ref: { id: id('peer', 'p50'), name: 'peer' },
          better: 'lower',
        },
        {
          group,
          label: `C=${c} latency p99`,
          unit: 'ms',
          id: id('tr', 'p99'),
          ref: { id: id('peer', 'p99'), name: 'peer' },
          better: 'lower',
        },
      );
    }
  }
  for (const kind of ['task', 'plain'] as const) {
    const group = `CPU per ${kind === 'task' ? 'task cycle' : 'plain call'}, C=32`;
    /** Per role: CPU-ms (`cpu`), or read + write syscalls (`sys`: the hops of an operation, several per queue hop). */
    const perRole = (metric: 'cpu' | 'sys', label: (role: string) => string, unit: string): RowSpec[] => {
      const id = (t: string, k: string) => `${t}.${kind}.c32.${metric}.${k}`;
      const peer = { id: id('peer', 'server'), name: 'peer server' };
      return [
        { group, label: label('gateway'), unit, id: id('tr', 'gateway'), ref: peer, better: 'lower' },
        { group, label: label('worker'), unit, id: id('tr', 'worker') },
        { group, label: label('Redis'), unit, id: id('tr', 'redis') },
        { group, label: label('taskrelay total'), unit, id: id('tr', 'total'), ref: peer, better: 'lower' },
      ];
    };
    const cpu = perRole(
      'cpu',
      (role) => (role === 'taskrelay total' ? 'taskrelay total (gateway + worker + Redis)' : role),
      'CPU-ms',
    );
    rows.push(...cpu, {
      group,
      label: 'load generator',
      unit: 'CPU-ms',
      id: `tr.${kind}.c32.cpu.loadgen`,
      ref: { id: `peer.${kind}.c32.cpu.loadgen`, name: 'at peer' },
      better: 'lower',
    });
    rows.push(...perRole('sys', (role) => `read + write syscalls: ${role}`, 'count'));
  }
  {
    const group = 'tool controls (PROTOCOL §3.3): task cycle, C=32, a tool with concurrency + rate limit vs none';
    const ref = (k: string) => ({ id: `tr.task.c32.${k}`, name: 'no limits' });
    rows.push(
      {
        group,
        label: 'throughput',
        unit: 'ops/s',
        id: 'tr.limited.c32.opsPerS',
        ref: ref('opsPerS'),
        better: 'higher',
      },
      { group, label: 'latency p50', unit: 'ms', id: 'tr.limited.c32.p50', ref: ref('p50'), better: 'lower' },
      {
        group,
        label: 'CPU per task (gateway + worker + Redis)',
        unit: 'CPU-ms',
        id: 'tr.limited.c32.cpu.total',
        ref: ref('cpu.total'),
        better: 'lower',
      },
    );
  }
  {
    const group =
      'keyed and shared limits (PROTOCOL §3.5): task cycle, C=32, a tool with a concurrency per key + a shared rate limit vs none';
    const ref = (k: string) => ({ id: `tr.task.c32.${k}`, name: 'no limits' });
    rows.push(
      { group, label: 'throughput', unit: 'ops/s', id: 'tr.keyed.c32.opsPerS', ref: ref('opsPerS'), better: 'higher' },
      { group, label: 'latency p50', unit: 'ms', id: 'tr.keyed.c32.p50', ref: ref('p50'), better: 'lower' },
      {
        group,
        label: 'CPU per task (gateway + worker + Redis)',
        unit: 'CPU-ms',
        id: 'tr.keyed.c32.cpu.total',
        ref: ref('cpu.total'),
        better: 'lower',
      },
    );
  }
  {
    const group =
      'Python worker (PROTOCOL §29): task cycle, C=32, one Python worker vs one Node worker (same gateway, bench_noop)';
    const ref = (k: string) => ({ id: `tr.task.c32.${k}`, name: 'Node worker' });
    rows.push(
      {
        group,
        label: 'throughput',
        unit: 'ops/s',
        id: 'tr-py.task.c32.opsPerS',
        ref: ref('opsPerS'),
        better: 'higher',
      },
      { group, label: 'latency p50', unit: 'ms', id: 'tr-py.task.c32.p50', ref: ref('p50'), better: 'lower' },
      {
        group,
        label: 'worker CPU per task',
        unit: 'CPU-ms',
        id: 'tr-py.task.c32.cpu.worker',
        ref: ref('cpu.worker'),
        better: 'lower',
      },
      {
        group,
        label: 'CPU per task (gateway + worker + Redis)',
        unit: 'CPU-ms',
        id: 'tr-py.task.c32.cpu.total',
        ref: ref('cpu.total'),
        better: 'lower',
      },
    );
  }
  {
    const group =
      '2026-07-28 wire (sessionless; the SDK 1.32.2 peer does not serve it: reference = its 2025-11-25 figures)';
    for (const kind of ['plain', 'task'] as const) {
      const what = kind === 'task' ? 'task cycle (tools/call → subscriptions/listen)' : 'plain call';
      for (const c of [1, 32]) {
        const id = (t: string, k: string) => `${t}.${kind}.c${c}.${k}`;
        const peer = (k: string) => ({ id: id('peer', k), name: 'peer 2025' });
        rows.push(
          {
            group,
            label: `${what}, C=${c} throughput`,
            unit: 'ops/s',
            id: id('tr26', 'opsPerS'),
            ref: peer('opsPerS'),
            better: 'higher',
          },
          { group, label: `${what}, C=${c} p50`, unit: 'ms', id: id('tr26', 'p50'), ref: peer('p50'), better: 'lower' },
        );
        if (kind === 'task') {
          rows.push({
            group,
            label: `${what}, C=${c} listen streams stuck (task read by tasks/get)`,
            unit: 'count',
            id: id('tr26', 'stuckListens'),
          });
        }
        if (c === 32) {
          rows.push(
            {
              group,
              label: `${what}, C=32 gateway CPU`,
              unit: 'CPU-ms',
              id: id('tr26', 'cpu.gateway'),
              ref: peer('cpu.server'),
              better: 'lower',
            },
            {
              group,
              label: `${what}, C=32 total CPU`,
              unit: 'CPU-ms',
              id: id('tr26', 'cpu.total'),
              ref: peer('cpu.server'),
              better: 'lower',
            },
          );
        }
      }
    }
  }
  {
    // Why two runs of this bench can disagree: the rest of the machine. taskrelay's three processes need more than
    // one core at C=32, the peer's one process at most one, so another tenant's load costs taskrelay more.
    const group = 'machine: cores busy outside the measured processes during the window';
    for (const kind of ['task', 'plain'] as const) {
      for (const c of [1, 32]) {
        rows.push({
          group,
          label: `${kind === 'task' ? 'task cycle' : 'plain call'}, C=${c}, taskrelay window (peer window)`,
          unit: 'cores',
          id: `tr.${kind}.c${c}.otherCores`,
          ref: { id: `peer.${kind}.c${c}.otherCores`, name: 'peer window' },
        });
      }
    }
  }
  {
    const group = 'progress worker → client (GET stream)';
    for (const n of [1, 32]) {
      for (const p of ['p50', 'p99']) {
        rows.push({
          group,
          label: `${n} task${n > 1 ? 's' : ''}, ${p}`,
          unit: 'ms',
          id: `tr.progress.n${n}.${p}`,
          ref: { id: `floor.pubsub.n${n}.${p}`, name: 'raw pub/sub' },
          better: 'lower',
        });
      }
      rows.push({
        group,
        label: `${n} task${n > 1 ? 's' : ''}, updates missing`,
        unit: 'count',
        id: `tr.progress.n${n}.missing`,
      });
    }
  }
  {
    const group = 'cancel: tasks/cancel sent → AbortSignal in the worker';
    for (const n of [1, 32]) {
      for (const p of ['p50', 'p99']) {
        rows.push({
          group,
          label: `${n} task${n > 1 ? 's' : ''}, ${p}`,
          unit: 'ms',
          id: `tr.cancel.n${n}.${p}`,
          ref: { id: `floor.pubsub.n${n}.${p}`, name: 'raw pub/sub' },
          better: 'lower',
        });
      }
      rows.push({
        group,
        label: `${n} task${n > 1 ? 's' : ''}, tasks/cancel round trip p50`,
        unit: 'ms',
        id: `tr.cancel.n${n}.rt50`,
      });
    }
  }
  {
    const group = `slot hand-off: a run's end → the next waiting run's start, one at a time per lane, 2 workers`;
    const what = { keyed: 'per key (worker-admitted, §3.5)', queue: 'queue concurrency (BullMQ, §3.3)' } as const;
    for (const kind of Object.keys(SLOT_TOOLS) as Array<keyof typeof SLOT_TOOLS>) {
      for (const p of ['p50', 'p99'] as const) {
        rows.push({ group, label: `${what[kind]}, ${p}`, unit: 'ms', id: `tr.slot.${kind}.${p}`, better: 'lower' });
      }
      rows.push({
        group,
        label: `${what[kind]}, runs overlapping (must be 0)`,
        unit: 'count',
        id: `tr.slot.${kind}.overlaps`,
      });
    }
  }
  {
    const group = `polling client: SDK callToolStream, a ${POLL_HOLD_MS} ms task, one at a time`;
    rows.push(
      {
        group,
        label: 'time to result p50 (target ≤ 400 ms)',
        unit: 'ms',
        id: 'tr.polling.p50',
        ref: { id: 'peer.polling.p50', name: 'peer' },
        better: 'lower',
      },
      {
        group,
        label: 'time to result p99',
        unit: 'ms',
        id: 'tr.polling.p99',
        ref: { id: 'peer.polling.p99', name: 'peer' },
        better: 'lower',
      },
      {
        group,
        label: 'tasks/get reads per task',
        unit: 'count',
        id: 'tr.polling.readsPerTask',
        ref: { id: 'peer.polling.readsPerTask', name: 'peer' },
        better: 'lower',
      },
    );
  }
  {
    const group = 'memory per task (after a full GC)';
    rows.push(
      { group, label: 'gateway heap per open task', unit: 'bytes', id: 'tr.memory.heapPerOpen' },
      { group, label: 'Redis used_memory per open task', unit: 'bytes', id: 'tr.memory.redisPerOpen' },
      {
        group,
        label: 'gateway heap per terminal task',
        unit: 'bytes',
        id: 'tr.memory.heapPerTerminal',
        ref: { id: 'peer.memory.heapPerTerminal', name: 'peer heap' },
        better: 'lower',
      },
      { group, label: 'Redis used_memory per terminal task', unit: 'bytes', id: 'tr.memory.redisPerTerminal' },
      {
        group,
        label: 'Redis used_memory per retained failed task (tags, arguments, index; §30.1)',
        unit: 'bytes',
        id: 'tr.retained.bytes',
      },
      {
        group,
        label: 'gateway heap + Redis per terminal task',
        unit: 'bytes',
        id: 'tr.memory.totalPerTerminal',
        ref: { id: 'peer.memory.totalPerTerminal', name: 'peer heap' },
        better: 'lower',
      },
    );
  }
  {
    const group = 'scaling: task cycle, C=32';
    const peer = (k: string) => ({ id: `peer.task.c32.${k}`, name: 'peer' });
    for (const [label, t] of [
      ['1 gateway, 1 worker', 'tr'],
      ['1 gateway, 2 workers', 'tr-w2'],
      ['1 gateway, 4 workers', 'tr-w4'],
      ['2 gateways, 2 workers', 'tr-g2'],
    ] as const) {
      rows.push(
        {
          group,
          label: `${label}: throughput`,
          unit: 'ops/s',
          id: `${t}.task.c32.opsPerS`,
          ref: peer('opsPerS'),
          better: 'higher',
        },
        { group, label: `${label}: p99`, unit: 'ms', id: `${t}.task.c32.p99`, ref: peer('p99'), better: 'lower' },
        {
          group,
          label: `${label}: CPU total per cycle`,
          unit: 'CPU-ms',
          id: `${t}.task.c32.cpu.total`,
          ref: { id: 'peer.task.c32.cpu.server', name: 'peer server' },
          better: 'lower',
        },
      );
    }
  }
  {
    const group = `scaling: slot-bound tool (bench_hold ${HOLD_MS} ms, ${WORKER_CONCURRENCY} slots per worker), C=${HOLD_CLIENTS}`;
    const one = { id: `tr.hold.c${HOLD_CLIENTS}.opsPerS`, name: '1 worker' };
    const ceiling = (workers: number) => Math.round((workers * WORKER_CONCURRENCY * 1000) / HOLD_MS);
    for (const [label, t, workers] of [
      ['1 gateway, 1 worker', 'tr', 1],
      ['1 gateway, 2 workers', 'tr-w2', 2],
      ['1 gateway, 4 workers', 'tr-w4', 4],
      ['2 gateways, 2 workers', 'tr-g2', 2],
    ] as const) {
      rows.push(
        {
          group,
          label: `${label}: throughput (slots allow ${Math.min(ceiling(workers), Math.round((HOLD_CLIENTS * 1000) / HOLD_MS))})`,
          unit: 'ops/s',
          id: `${t}.hold.c${HOLD_CLIENTS}.opsPerS`,
          ...(t === 'tr' ? {} : { ref: one }),
          better: 'higher',
        },
        { group, label: `${label}: latency p50`, unit: 'ms', id: `${t}.hold.c${HOLD_CLIENTS}.p50` },
      );
    }
  }
  return rows;
}

async function compare(): Promise<number> {
  const startedAt = new Date();
  const mode = QUICK ? 'quick' : 'full';
  log(`mode ${mode}: ${REPS} repetitions, ${WINDOW_MS} ms windows; starting redis, peer, gateways, workers…`);
  const { redis, admin } = await startInfra();
  const info = machine(admin.version);
  const results = new Results();
  const redisPids = admin.pid > 0 ? [admin.pid] : [];
  if (admin.pid <= 0)
    results.errors.push({ scenario: 'setup', rep: 0, message: 'Redis pid unknown: its CPU is not counted' });

  const prefixes = { tr: uniquePrefix('b1'), w2: uniquePrefix('b2'), w4: uniquePrefix('b4'), py: uniquePrefix('bpy') };
  // The Python worker's rows need `.venv` (made by `npm test` or this command's bootstrap); without it they are empty.
  if (PYTHON === undefined) log('no .venv/bin/python: the Python worker rows are skipped (needs Python 3.11+)');
  const [peer, tr, w2, w4, floorWorker, py] = await Promise.all([
    startPeer(),
    startStack({
      name: 'tr',
      prefix: prefixes.tr,
      redisUrl: redis.url,
      gateways: 1,
      workers: 1,
      workerConcurrency: WORKER_CONCURRENCY,
      // Failed tasks are kept a week (PROTOCOL.md §30.1): the retained-task row; no other row fails a task.
      env: { TASKRELAY_RETAIN_FAILED_MS: String(7 * 86_400_000) },
    }),
    startStack({
      name: 'tr-w2',
      prefix: prefixes.w2,
      redisUrl: redis.url,
      gateways: 2,
      workers: 2,
      workerConcurrency: WORKER_CONCURRENCY,
    }),
    startStack({
      name: 'tr-w4',
      prefix: prefixes.w4,
      redisUrl: redis.url,
      gateways: 1,
      workers: 4,
      workerConcurrency: WORKER_CONCURRENCY,
    }),
    startFloorWorker(redis.url, 'bench-floor', 32),
    PYTHON === undefined
      ? undefined
      : startStack({
          name: 'tr-py',
          prefix: prefixes.py,
          redisUrl: redis.url,
          gateways: 1,
          workers: 1,
          workerConcurrency: WORKER_CONCURRENCY,
          python: true,
        }),
  ]);
  const floor = new BullFloor(redis.url, 'bench-floor');
  cleanup.push(() => floor.close());
  await floor.ready();

  const allSessions: McpSession[] = [];
  const open = async (url: string | string[], n: number) => {
    const s = await openSessions(url, n);
    allSessions.push(...s);
    return s;
  };
  cleanup.push(() => Promise.all(allSessions.map((s) => s.close())).then(() => undefined));
  const [peerSessions, trSessions, w2Sessions, w2bSessions, w4Sessions, pySessions] = await Promise.all([
    open(peer.url, 32),
    open(tr.gateways[0]!.url, 32),
    open(w2.gateways[0]!.url, 32),
    open(w2.gateways[1]!.url, 16),
    open(w4.gateways[0]!.url, 32),
    py === undefined ? Promise.resolve([]) : open(py.gateways[0]!.url, 32),
  ]);
  const stackTarget = (
    name: string,
    stack: Stack,
    sessions: Array<McpSession | ModernClient>,
    gateways = stack.gateways,
  ): Target => ({
    name,
    sessions,
    cpu: { gateway: gateways.map((p) => p.pid), worker: stack.workers.map((p) => p.pid), redis: redisPids },
    totalRoles: ['gateway', 'worker', 'redis'],
    deps: [...gateways, ...stack.workers],
  });
  const targets = {
    peer: {
      name: 'peer',
      sessions: peerSessions,
      cpu: { server: [peer.pid], redis: redisPids },
      totalRoles: ['server'],
      deps: [peer],
    } as Target,
    tr: stackTarget('tr', tr, trSessions),
    w2: stackTarget('tr-w2', w2, w2Sessions, [w2.gateways[0]!]),
    w4: stackTarget('tr-w4', w4, w4Sessions),
    g2: stackTarget('tr-g2', w2, [...w2Sessions.slice(0, 16), ...w2bSessions]),
    // The 2026-07-28 wire on the same stack: task-declaring clients for the task cycle, plain ones for plain calls.
    tr26task: stackTarget('tr26', tr, modernClients(tr.gateways[0]!.url, 32, { tasks: true })),
    tr26plain: stackTarget('tr26', tr, modernClients(tr.gateways[0]!.url, 32)),
    ...(py === undefined ? {} : { py: stackTarget('tr-py', py, pySessions) }),
  };
  log(`started in ${Date.now() - startedAt.getTime()} ms; warming up`);

  const runCycle = (
    rep: number,
    t: Target,
    kind: 'task' | 'plain',
    c: number,
    durationMs = WINDOW_MS,
    record = true,
    maxOps?: number,
    tool?: { name: string; arguments: Record<string, unknown> },
  ) =>
    guarded(
      record ? results : new Results(),
      `${t.name}.${tool ? ({ bench_limited: 'limited', bench_keyed: 'keyed' }[tool.name] ?? 'hold') : kind}.c${c}`,
      rep,
      durationMs + 60_000,
      t.deps,
      t.sessions,
      () =>
        cycles({
          sessions: t.sessions,
          kind,
          concurrency: c,
          durationMs,
          cpu: t.cpu,
          totalRoles: t.totalRoles,
          ttlMs: CYCLE_TTL_MS,
          ...(maxOps === undefined ? {} : { maxOps }),
          ...(tool === undefined ? {} : { tool }),
        }),
    );

  for (const t of Object.values(targets)) {
    if (t === targets.tr26task || t === targets.tr26plain) {
      await runCycle(0, t, t === targets.tr26task ? 'task' : 'plain', 32, WARMUP_MS / 3, false, WARMUP_OPS / 3);
      continue;
    }
    // Each worker of a stack must see the warm-up's number of jobs too: scale it with the workers.
    const workers = Math.max(1, t.cpu['worker']?.length ?? 1);
    await runCycle(0, t, 'task', 32, WARMUP_MS * workers, false, WARMUP_OPS * workers);
    if (t.name === 'peer' || t.name === 'tr') await runCycle(0, t, 'plain', 32, WARMUP_MS / 2, false, WARMUP_OPS / 2);
  }
  await guarded(new Results(), 'floor.bullmq.warmup', 0, 60_000, [floorWorker], [], () =>
    floor.run(8, WARMUP_MS / 3, { worker: [floorWorker.pid], redis: redisPids }),
  );

  let memoryQuietAt = 0;
  for (let rep = 1; rep <= REPS; rep++) {
    const repStarted = Date.now();
    // Floors.
    for (const c of [1, 32]) {
      await guarded(results, `floor.bullmq.c${c}`, rep, WINDOW_MS + 60_000, [floorWorker], [], () =>
        floor.run(c, WINDOW_MS, { worker: [floorWorker.pid], redis: redisPids }),
      );
    }
    for (const n of [1, 32]) {
      await guarded(results, `floor.pubsub.n${n}`, rep, 60_000, [], [], () =>
        rawPubSub(redis.url, n, PROGRESS_UPDATES, PROGRESS_INTERVAL_MS),
      );
    }
    // Peer and taskrelay, alternating which goes first from one repetition to the next.
    const pair = rep % 2 === 1 ? [targets.peer, targets.tr] : [targets.tr, targets.peer];
    for (const kind of ['task', 'plain'] as const) {
      for (const c of CONCURRENCY) for (const t of pair) await runCycle(rep, t, kind, c);
    }
    // Tool controls (PROTOCOL.md §3.3): the task cycle through a tool with a generous concurrency and rate limit,
    // right after the same cycle through bench_noop (tr.task.c32), so the pair shares the machine's state.
    await runCycle(rep, targets.tr, 'task', 32, WINDOW_MS, true, undefined, LIMITED);
    // Limits per key and shared by name (PROTOCOL.md §3.5): the worker's own admission, same pairing.
    await runCycle(rep, targets.tr, 'task', 32, WINDOW_MS, true, undefined, KEYED);
    // The Python worker (PROTOCOL.md §29), right after the same cycle on the Node worker.
    if (targets.py) await runCycle(rep, targets.py, 'task', 32);
    // The 2026-07-28 wire on the same stack, right after (no peer serves it).
    for (const kind of ['plain', 'task'] as const) {
      for (const c of [1, 32]) await runCycle(rep, kind === 'task' ? targets.tr26task : targets.tr26plain, kind, c);
    }
    // taskrelay only: progress and cancel latency.
    for (const n of [1, 32]) {
      await guarded(results, `tr.progress.n${n}`, rep, 60_000, targets.tr.deps, trSessions, () =>
        progressLatency(trSessions, n, PROGRESS_UPDATES, PROGRESS_INTERVAL_MS),
      );
    }
    for (const [n, rounds] of [
      [1, CANCEL_ROUNDS_1],
      [32, CANCEL_ROUNDS_32],
    ] as const) {
      await guarded(
        results,
        `tr.cancel.n${n}`,
        rep,
        30_000 + rounds * 20_000,
        targets.tr.deps,
        trSessions,
        async () => {
          const fromSend: number[] = [];
          const roundTrip: number[] = [];
          for (let r = 0; r < rounds; r++) {
            const s = await cancelLatency(trSessions, redis.url, prefixes.tr, n);
            fromSend.push(...s.fromSend);
            roundTrip.push(...s.roundTrip);
          }
          const a = latency(fromSend);
          const b = latency(roundTrip);
          return { p50: a.p50, p99: a.p99, rt50: b.p50, rt99: b.p99 };
        },
      );
    }
    // A freed slot → the waiting run's start, on two workers (§3.3 BullMQ's queue concurrency, §3.5 the admission).
    for (const [kind, tool] of Object.entries(SLOT_TOOLS)) {
      await guarded(results, `tr.slot.${kind}`, rep, 60_000, targets.w2.deps, w2Sessions, () =>
        slotHandoff({
          sessions: w2Sessions,
          redisUrl: redis.url,
          prefix: prefixes.w2,
          tool,
          runs: SLOT_RUNS,
          holdMs: SLOT_HOLD_MS,
        }),
      );
    }
    // What a polling client sees (§28), peer and taskrelay in the same alternating order.
    for (const t of pair) {
      const url = t.name === 'peer' ? peer.url : tr.gateways[0]!.url;
      await guarded(results, `${t.name}.polling`, rep, 60_000 + POLL_TASKS * 5_000, t.deps, [], () =>
        pollingClient(url, POLL_HOLD_MS, POLL_TASKS),
      );
    }
    // Memory: wait until the previous repetition's memory tasks have expired, and the cycles' 1 s ttl tasks too.
    const quietIn = Math.max(memoryQuietAt - Date.now(), CYCLE_TTL_MS + 2_000);
    await sleep(quietIn);
    await guarded(results, 'tr.memory', rep, 180_000, targets.tr.deps, trSessions, () =>
      memoryPerTask({
        sessions: trSessions,
        gatewayPid: tr.gateways[0]!.pid,
        admin,
        count: MEMORY_TASKS,
        ttlMs: MEMORY_TTL_MS,
      }),
    );
    await guarded(results, 'tr.retained', rep, 120_000, targets.tr.deps, trSessions, () =>
      retainedBytes({
        sessions: trSessions,
        admin,
        count: RETAINED_TASKS,
        redisUrl: redis.url,
        prefix: prefixes.tr,
        queueName: createKeys(prefixes.tr).queueName(toolQueue('default', 'bench_fail')),
      }),
    );
    await guarded(results, 'peer.memory', rep, 120_000, [peer], peerSessions, () =>
      peerMemoryPerTask(peerSessions, peer.pid, MEMORY_TASKS, MEMORY_TTL_MS),
    );
    memoryQuietAt = Date.now() + MEMORY_TTL_MS + 3_000;
    // Scaling (the 1-worker row is tr.task.c32 above).
    for (const t of [targets.w2, targets.w4, targets.g2]) await runCycle(rep, t, 'task', 32);
    const hold = { name: 'bench_hold', arguments: { ms: HOLD_MS } };
    for (const t of [targets.tr, targets.w2, targets.w4, targets.g2]) {
      await runCycle(rep, t, 'task', HOLD_CLIENTS, WINDOW_MS, true, undefined, hold);
    }
    log(`rep ${rep} done in ${Date.now() - repStarted} ms`);
  }

  info.loadavgAtEnd = [];
  const { loadavg } = await import('node:os');
  info.loadavgAtEnd = loadavg().map((v) => Math.round(v * 100) / 100);
  const rows = buildRows(results, rowSpecs());
  const wallS = (Date.now() - startedAt.getTime()) / 1000;
  const out: string[] = [];
  out.push('');
  out.push(
    `taskrelay bench — ${mode} mode, ${REPS} interleaved repetitions, ${WINDOW_MS} ms windows, wall ${wallS.toFixed(0)} s`,
  );
  out.push(
    `machine: ${info.cpuModel}, ${info.cores} cores, ${info.memoryGiB} GiB, node ${info.node}, redis ${info.redis}, ` +
      `load average ${info.loadavgAtStart.join(' ')} → ${info.loadavgAtEnd.join(' ')}`,
  );
  out.push(
    'ratio = taskrelay / reference (medians); ↑ higher is better, ↓ lower is better. CPU-ms = utime+stime per op.',
  );
  out.push('');
  out.push(renderTable(rows));
  if (results.errors.length > 0) {
    out.push('');
    out.push(`FAILED scenarios (${results.errors.length}):`);
    for (const e of results.errors) out.push(`  rep ${e.rep} ${e.scenario}: ${e.message}`);
  }
  console.log(out.join('\n'));
  // The Redis work per operation (issue 46): on a Redis of its own, once the interleaved rows are done.
  const redisWork = await runRedisWork({ log, cleanup }).catch((error: unknown) => {
    const message = error instanceof Error ? error.message : String(error);
    results.errors.push({ scenario: 'redis-work', rep: 0, message });
    return undefined;
  });
  if (redisWork) console.log(`\n${renderRedisWork(redisWork)}`);
  const file = await writeResults(
    {
      mode,
      startedAt: startedAt.toISOString(),
      wallSeconds: wallS,
      machine: info,
      config: {
        reps: REPS,
        windowMs: WINDOW_MS,
        warmupOps: WARMUP_OPS,
        warmupCapMs: WARMUP_MS,
        workerConcurrency: WORKER_CONCURRENCY,
        cycleTtlMs: CYCLE_TTL_MS,
        memoryTasks: MEMORY_TASKS,
        progressUpdates: PROGRESS_UPDATES,
        progressIntervalMs: PROGRESS_INTERVAL_MS,
        cancelRounds: { n1: CANCEL_ROUNDS_1, n32: CANCEL_ROUNDS_32 },
      },
      rows,
      ...(redisWork ? { redisWork } : {}),
      metrics: Object.fromEntries([...results.values.keys()].sort().map((k) => [k, results.get(k) ?? null])),
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return results.errors.length > 0 ? 1 : 0;
}

async function main(): Promise<number> {
  try {
    if (args.soak) {
      const { redis, admin } = await startInfra();
      return await runSoak({ redis, admin, minutes: Number(args.minutes ?? 5), cleanup, log });
    }
    if (args.load) {
      const { redis, admin } = await startInfra();
      return await runLoad({ redis, admin, cleanup, log });
    }
    if (args.batch) {
      const { redis } = await startInfra();
      return await runBatch({ redis, log });
    }
    if (args.outputs) {
      const { redis, admin } = await startInfra();
      return await runOutputs({ redis, admin, log });
    }
    if (args.webhooks) {
      const { redis } = await startInfra();
      return await runWebhooks({ redis, log });
    }
    if (args['redis-work']) {
      const report = await runRedisWork({
        log,
        cleanup,
        python: args.python === true,
        withTrace: args.trace === true,
        reps: Number(args.reps ?? 1),
      });
      console.log(renderRedisWork(report));
      const file = await writeResults({ mode: 'redis-work', machine: machine(''), redisWork: report }, new Date());
      console.log(`\nresults: ${file}`);
      return 0;
    }
    if (args['create-path']) {
      const { redis } = await startInfra();
      return await runCreatePath({ redis, log });
    }
    if (args.ab !== undefined) {
      const { redis, admin } = await startInfra();
      return await runAb({
        redis,
        admin,
        root: args.ab,
        auth: args.auth === true,
        reps: Number(args.reps ?? 5),
        windowMs: Number(args['window-ms'] ?? 3_000),
        cleanup,
        log,
      });
    }
    if (args.fair) {
      const { redis } = await startInfra();
      return await runFair({ redis, cleanup, log });
    }
    if (args.limits) {
      const { redis } = await startInfra();
      return await runLimits({ redis, cleanup, log });
    }
    if (args.sdk) {
      const { redis, admin } = await startInfra();
      return await runSdkCycle({
        redis,
        admin,
        reps: Number(args.reps ?? (args.quick ? 2 : 3)),
        windowMs: Number(args['window-ms'] ?? (args.quick ? 1_000 : 5_000)),
        fastmcp: args.fastmcp === true,
        ...(args['fastmcp-poll-ms'] === undefined
          ? {}
          : { fastmcpPollMs: positiveInt('--fastmcp-poll-ms', args['fastmcp-poll-ms']) }),
        cleanup,
        log,
      });
    }
    return await compare();
  } finally {
    await stopEverything();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  },
);

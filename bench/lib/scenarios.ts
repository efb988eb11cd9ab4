/**
 * The measurements. Each returns plain numbers for one repetition; the runner interleaves repetitions and keeps
 * min / median / max. Every loop is bounded by a duration or a count, and every wait by a timeout.
 */
import { Queue, QueueEvents } from 'bullmq';
import { Redis } from 'ioredis';
import { waitFor } from '../../test/helpers/wait-for.js';
import { readFileSync } from 'node:fs';
import { ModernClient, type JsonRpcMessage, type McpSession } from './mcp-http.js';
import { cpuMs, ioSyscalls, probeHeap, type RedisAdmin } from './procs.js';
import { latency, now, sleep } from './stats.js';

/** The processes whose CPU a scenario charges to its operations, by role. */
export type CpuRoles = Record<string, number[]>;

/** Busy CPU time of the whole machine (every process, user + system + irq + steal), in ms, from /proc/stat. */
function machineBusyMs(): number {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '';
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    const busy = (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0) + (f[5] ?? 0) + (f[6] ?? 0) + (f[7] ?? 0);
    return (busy * 1000) / CLK_TCK_STAT;
  } catch {
    return Number.NaN;
  }
}
/** /proc/stat counts in USER_HZ, which Linux fixes at 100 for user space. */
const CLK_TCK_STAT = 100;

/** CPU-ms of each role (sum over its processes) and of this process (the load generator) since `start()`. */
export class CpuMeter {
  private before: Record<string, number> = {};
  private syscallsBefore: Record<string, number> = {};
  private self = process.cpuUsage();
  private machineBefore = 0;
  private startedAt = 0;
  constructor(private readonly roles: CpuRoles) {}

  start(): this {
    this.before = Object.fromEntries(Object.entries(this.roles).map(([role, pids]) => [role, sum(pids.map(cpuMs))]));
    this.syscallsBefore = Object.fromEntries(
      Object.entries(this.roles).map(([role, pids]) => [role, sum(pids.map(ioSyscalls))]),
    );
    this.syscallsBefore['loadgen'] = ioSyscalls('self');
    this.self = process.cpuUsage();
    this.machineBefore = machineBusyMs();
    this.startedAt = now();
    return this;
  }

  /**
   * Cores the rest of the machine kept busy during the window (every process but the measured roles and the load
   * generator: other tenants, idle stacks): what a drift between two runs of the same bench comes from.
   */
  otherCores(): number {
    const elapsed = now() - this.startedAt;
    let mine = 0;
    for (const [role, pids] of Object.entries(this.roles)) mine += sum(pids.map(cpuMs)) - (this.before[role] ?? 0);
    const self = process.cpuUsage(this.self);
    mine += (self.user + self.system) / 1000;
    return Math.max(0, machineBusyMs() - this.machineBefore - mine) / elapsed;
  }

  /** CPU-ms and read + write syscalls (`sys.<role>`) per operation of every role, plus `loadgen`. */
  perOp(ops: number): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [role, pids] of Object.entries(this.roles)) {
      out[`cpu.${role}`] = (sum(pids.map(cpuMs)) - (this.before[role] ?? 0)) / ops;
      out[`sys.${role}`] = (sum(pids.map(ioSyscalls)) - (this.syscallsBefore[role] ?? 0)) / ops;
    }
    out['sys.loadgen'] = (ioSyscalls('self') - (this.syscallsBefore['loadgen'] ?? 0)) / ops;
    const self = process.cpuUsage(this.self);
    out['cpu.loadgen'] = (self.user + self.system) / 1000 / ops;
    return out;
  }
}

const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);

/** How long a 2026-07-28 listen stream may outlive its task before the cycle counts it stuck and reads the task. */
const LISTEN_WATCHDOG_MS = 1_000;

export interface CycleOptions {
  /** 2025-11-25 sessions, or clients of the sessionless 2026-07-28 transport (`ModernClient`, tasks declared). */
  sessions: Array<McpSession | ModernClient>;
  kind: 'task' | 'plain';
  concurrency: number;
  durationMs: number;
  cpu: CpuRoles;
  /** Roles summed into `cpu.total` (the server side: gateway + worker + redis, or the peer). */
  totalRoles: string[];
  ttlMs: number;
  /** Stop issuing once this many operations have started (warm-ups: a count, with durationMs as the cap). */
  maxOps?: number;
  /** The tool called. Default `bench_noop` with no arguments. */
  tool?: { name: string; arguments: Record<string, unknown> };
}

/**
 * Closed loop: `concurrency` virtual clients, each on its own session, each running one operation after the other
 * until `durationMs` has passed (operations in flight then are finished and counted). A task cycle is
 * `tools/call` + `params.task` → `tasks/result`; a plain call is `tools/call` without `task`. Tool: `bench_noop`.
 */
export async function cycles(o: CycleOptions): Promise<Record<string, number>> {
  if (o.sessions.length === 0) throw new Error('no sessions');
  const tool = o.tool ?? { name: 'bench_noop', arguments: {} };
  const samples: number[] = [];
  let stuckListens = 0;
  let errors = 0;
  let firstError = '';
  const meter = new CpuMeter(o.cpu).start();
  const started = now();
  const deadline = started + o.durationMs;
  const maxOps = o.maxOps ?? Infinity;
  let issued = 0;
  await Promise.all(
    // One virtual client per session; beyond as many clients as sessions, they share sessions round-robin.
    Array.from({ length: o.concurrency }, (_, i) => o.sessions[i % o.sessions.length]!).map(async (session) => {
      while (now() < deadline && issued++ < maxOps) {
        const t0 = now();
        try {
          if (o.kind === 'task' && session instanceof ModernClient) {
            // 2026-07-28: the call creates a task (the extension is declared); its listen stream pushes the status
            // changes and ends once the task is terminal (PROTOCOL.md §18) — the push a client waits with.
            const created = await session.call('tools/call', tool);
            const taskId = created?.taskId as string | undefined;
            if (!taskId) throw new Error(`no task in ${JSON.stringify(created).slice(0, 200)}`);
            let last: JsonRpcMessage | undefined;
            const listened = session
              .call('subscriptions/listen', { notifications: { taskIds: [taskId] } }, (m) => {
                if (m.method === 'notifications/tasks') last = m;
              })
              .then(() => true);
            // A stream that has not ended a second after its task did is stuck (a status event it missed): counted,
            // closed, and the task read with tasks/get, as a client with a watchdog would.
            let timer: NodeJS.Timeout | undefined;
            const ended = await Promise.race([
              listened,
              new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), LISTEN_WATCHDOG_MS))),
            ]).finally(() => clearTimeout(timer));
            let task = last?.params as { status?: string; result?: { isError?: boolean } } | undefined;
            if (!ended) {
              stuckListens++;
              listened.catch(() => undefined);
              session.abortInflight();
              task = (await session.call('tasks/get', { taskId })) as typeof task;
            }
            if (task?.status !== 'completed' || task.result?.isError) {
              throw new Error(`task did not complete: ${JSON.stringify(task).slice(0, 200)}`);
            }
          } else if (o.kind === 'task') {
            const created = await session.call('tools/call', { ...tool, task: { ttl: o.ttlMs } });
            const taskId = created?.task?.taskId as string | undefined;
            if (!taskId) throw new Error(`no task in ${JSON.stringify(created).slice(0, 200)}`);
            const result = await session.call('tasks/result', { taskId });
            if (result?.isError) throw new Error(`tool error: ${JSON.stringify(result).slice(0, 200)}`);
          } else {
            const result = await session.call('tools/call', tool);
            if (result?.isError || !Array.isArray(result?.content)) {
              throw new Error(`unexpected result: ${JSON.stringify(result).slice(0, 200)}`);
            }
          }
          samples.push(now() - t0);
        } catch (error) {
          errors++;
          firstError ||= error instanceof Error ? error.message : String(error);
          if (errors > 20) throw new Error(`${errors} failed operations; first: ${firstError}`, { cause: error });
        }
      }
    }),
  );
  const elapsedS = (now() - started) / 1000;
  if (samples.length === 0) throw new Error(`no operation succeeded; first error: ${firstError}`);
  const otherCores = meter.otherCores();
  const cpu = meter.perOp(samples.length);
  const lat = latency(samples);
  return {
    opsPerS: samples.length / elapsedS,
    p50: lat.p50,
    p99: lat.p99,
    ops: samples.length,
    errors,
    ...cpu,
    'cpu.total': sum(o.totalRoles.map((r) => cpu[`cpu.${r}`] ?? 0)),
    'sys.total': sum(o.totalRoles.map((r) => cpu[`sys.${r}`] ?? 0)),
    otherCores,
    stuckListens,
  };
}

/**
 * Raw BullMQ floor: the same closed loop, with `Queue.add` of a no-op job and the `completed` event from QueueEvents
 * (a client-side waiter, as a producer that wants the result would use). The worker is its own process.
 */
export class BullFloor {
  private readonly connection: Redis;
  private readonly eventsConnection: Redis;
  readonly queue: Queue;
  readonly events: QueueEvents;
  private readonly pending = new Map<string, () => void>();
  private seq = 0;

  constructor(redisUrl: string, queueName: string) {
    this.connection = new Redis(redisUrl, { maxRetriesPerRequest: null });
    this.eventsConnection = new Redis(redisUrl, { maxRetriesPerRequest: null });
    this.queue = new Queue(queueName, { connection: this.connection, prefix: 'benchfloor' });
    this.events = new QueueEvents(queueName, { connection: this.eventsConnection, prefix: 'benchfloor' });
    this.events.on('completed', ({ jobId }) => {
      const done = this.pending.get(jobId);
      this.pending.delete(jobId);
      done?.();
    });
  }

  async ready(): Promise<void> {
    await this.queue.waitUntilReady();
    await this.events.waitUntilReady();
    // QueueEvents starts reading a moment after waitUntilReady (bullmq#2874): wait until a job's event is seen.
    await waitFor(
      async () => {
        const seen = await Promise.race([this.job(), sleep(500).then(() => false)]);
        return seen !== false;
      },
      { timeoutMs: 20_000, message: 'BullMQ QueueEvents did not start' },
    );
  }

  private job(): Promise<true> {
    const jobId = `f${this.seq++}`;
    const done = new Promise<true>((resolve) => this.pending.set(jobId, () => resolve(true)));
    return this.queue
      .add('noop', {}, { jobId, removeOnComplete: true, removeOnFail: true })
      .then(() => done)
      .finally(() => this.pending.delete(jobId));
  }

  async run(concurrency: number, durationMs: number, cpu: CpuRoles): Promise<Record<string, number>> {
    const samples: number[] = [];
    const meter = new CpuMeter(cpu).start();
    const started = now();
    const deadline = started + durationMs;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (now() < deadline) {
          const t0 = now();
          const ok = await Promise.race([this.job(), sleep(10_000).then(() => false)]);
          if (!ok) throw new Error('a BullMQ job did not complete within 10 s');
          samples.push(now() - t0);
        }
      }),
    );
    const elapsedS = (now() - started) / 1000;
    const lat = latency(samples);
    return {
      opsPerS: samples.length / elapsedS,
      p50: lat.p50,
      p99: lat.p99,
      ops: samples.length,
      ...meter.perOp(samples.length),
    };
  }

  /** `count` jobs, `concurrency` at a time (a count, not a window: bench/lib/redis-work.ts). */
  async runCount(count: number, concurrency: number, cpu: CpuRoles): Promise<Record<string, number>> {
    const meter = new CpuMeter(cpu).start();
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next++ < count) {
          const ok = await Promise.race([this.job(), sleep(10_000).then(() => false)]);
          if (!ok) throw new Error('a BullMQ job did not complete within 10 s');
        }
      }),
    );
    return { ops: count, ...meter.perOp(count) };
  }

  async close(): Promise<void> {
    await this.events.close().catch(() => undefined);
    await this.queue.close().catch(() => undefined);
    this.connection.disconnect();
    this.eventsConnection.disconnect();
  }
}

/** Raw ioredis floor: `publishers` loops, each publishing its send time `updates` times, `intervalMs` apart. */
export async function rawPubSub(url: string, publishers: number, updates: number, intervalMs: number) {
  const pub = new Redis(url);
  const sub = new Redis(url);
  const channel = `bench:raw:${Math.random().toString(36).slice(2)}`;
  const samples: number[] = [];
  try {
    await sub.subscribe(channel);
    sub.on('message', (_c, m: string) => samples.push(now() - Number(m)));
    await Promise.all(
      Array.from({ length: publishers }, async () => {
        for (let i = 0; i < updates; i++) {
          await sleep(intervalMs);
          await pub.publish(channel, String(now()));
        }
      }),
    );
    await waitFor(() => samples.length >= publishers * updates, { timeoutMs: 10_000, message: 'pub/sub messages' });
    const lat = latency(samples);
    return { p50: lat.p50, p99: lat.p99 };
  } finally {
    pub.disconnect();
    sub.disconnect();
  }
}

let tokenSeq = 0;
const token = (label: string) => `${label}-${process.pid}-${tokenSeq++}`;

/**
 * Progress latency worker → client: `tasks` tasks (one per session) of `bench_progress`, each reporting `updates`
 * updates `intervalMs` apart (above the 50 ms throttle, so none is coalesced away). Each update's message is the
 * worker's send time; the sample is its arrival on the session's GET stream minus that.
 */
export async function progressLatency(sessions: McpSession[], tasks: number, updates: number, intervalMs: number) {
  const samples: number[] = [];
  const tokens = new Set<string>();
  const mine = sessions.slice(0, tasks);
  for (const s of mine) {
    s.onNotification = (m) => {
      if (m.method === 'notifications/progress' && tokens.has(String(m.params?.progressToken))) {
        samples.push(now() - Number(m.params?.message));
      }
    };
  }
  try {
    const ids = await Promise.all(
      mine.map(async (s) => {
        const progressToken = token('pg');
        tokens.add(progressToken);
        const created = await s.call('tools/call', {
          name: 'bench_progress',
          arguments: { count: updates, intervalMs },
          task: { ttl: 60_000 },
          _meta: { progressToken },
        });
        return { s, taskId: created.task.taskId as string };
      }),
    );
    await Promise.all(ids.map(({ s, taskId }) => s.call('tasks/result', { taskId })));
    const expected = tasks * updates;
    // The last updates may still be on their way when tasks/result answers.
    await waitFor(() => samples.length >= expected, { timeoutMs: 2_000 }).catch(() => undefined);
    const lat = latency(samples);
    return { p50: lat.p50, p99: lat.p99, missing: expected - samples.length };
  } finally {
    for (const s of mine) s.onNotification = undefined;
  }
}

/**
 * Cancel → abort: `tasks` tasks of `bench_cancel` (wait for the signal, record the abort time in Redis); once each
 * has reported it started, `tasks/cancel` them all at once. Samples: abort time − cancel send time (the worker's
 * clock and ours are the same machine's), and the cancel's round trip.
 */
export async function cancelLatency(sessions: McpSession[], redisUrl: string, prefix: string, tasks: number) {
  const redis = new Redis(redisUrl);
  const started = new Set<string>();
  const mine = sessions.slice(0, tasks);
  for (const s of mine) {
    s.onNotification = (m) => {
      if (m.method === 'notifications/progress') started.add(String(m.params?.progressToken));
    };
  }
  try {
    const list = await Promise.all(
      mine.map(async (s) => {
        const progressToken = token('cx');
        const key = `${prefix}:bench:abort:${progressToken}`;
        const created = await s.call('tools/call', {
          name: 'bench_cancel',
          arguments: { key },
          task: { ttl: 60_000 },
          _meta: { progressToken },
        });
        return { s, key, progressToken, taskId: created.task.taskId as string, sent: 0, answered: 0 };
      }),
    );
    await waitFor(() => list.every((t) => started.has(t.progressToken)), {
      timeoutMs: 15_000,
      message: 'bench_cancel tasks did not start',
    });
    await Promise.all(
      list.map(async (t) => {
        t.sent = now();
        await t.s.call('tasks/cancel', { taskId: t.taskId });
        t.answered = now();
      }),
    );
    const values = await waitFor(
      async () => {
        const v = await redis.mget(list.map((t) => t.key));
        return v.every((x) => x !== null) ? v : undefined;
      },
      { timeoutMs: 15_000, message: 'the tools did not see their signal abort' },
    );
    const fromSend = values.map((v, i) => Number(v) - list[i]!.sent);
    const roundTrip = list.map((t) => t.answered - t.sent);
    await redis.del(list.map((t) => t.key));
    return { fromSend, roundTrip };
  } finally {
    for (const s of mine) s.onNotification = undefined;
    redis.disconnect();
  }
}

/** Runs `count` operations over the sessions, `concurrency` at a time. */
async function fanOut<T>(
  sessions: McpSession[],
  count: number,
  concurrency: number,
  op: (s: McpSession, i: number) => Promise<T>,
) {
  const out: T[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, lane) => {
      const s = sessions[lane % sessions.length]!;
      for (let i = next++; i < count; i = next++) out[i] = await op(s, i);
    }),
  );
  return out;
}

/**
 * Memory per task. Terminal: `count` no-op task cycles (ttl long enough to outlive the measurement), then the
 * gateway's heap after a full GC and Redis `used_memory`, minus the same before. Open: `count` `bench_hold` tasks
 * (running or queued), measured the same way, then cancelled. The peer: the terminal measurement of its heap.
 */
export async function memoryPerTask(o: {
  sessions: McpSession[];
  gatewayPid: number;
  admin: RedisAdmin;
  count: number;
  ttlMs: number;
}): Promise<Record<string, number>> {
  const measure = async () => ({ heap: (await probeHeap(o.gatewayPid)).heapUsed, redis: await o.admin.usedMemory() });
  const base = await measure();
  await fanOut(o.sessions, o.count, 32, async (s) => {
    const created = await s.call('tools/call', { name: 'bench_noop', arguments: {}, task: { ttl: o.ttlMs } });
    await s.call('tasks/result', { taskId: created.task.taskId });
  });
  const terminal = await measure();
  const ids = await fanOut(o.sessions, o.count, 32, async (s) => {
    const created = await s.call('tools/call', {
      name: 'bench_hold',
      arguments: { ms: 600_000 },
      task: { ttl: o.ttlMs },
    });
    return { s, taskId: created.task.taskId as string };
  });
  const open = await measure();
  await fanOut(o.sessions, ids.length, 32, async (_s, i) => {
    const t = ids[i]!;
    await t.s.call('tasks/cancel', { taskId: t.taskId });
  });
  const heapPerTerminal = (terminal.heap - base.heap) / o.count;
  const redisPerTerminal = (terminal.redis - base.redis) / o.count;
  return {
    heapPerTerminal,
    redisPerTerminal,
    totalPerTerminal: heapPerTerminal + redisPerTerminal,
    heapPerOpen: (open.heap - terminal.heap) / o.count,
    redisPerOpen: (open.redis - terminal.redis) / o.count,
  };
}

export async function peerMemoryPerTask(sessions: McpSession[], peerPid: number, count: number, ttlMs: number) {
  const before = (await probeHeap(peerPid)).heapUsed;
  await fanOut(sessions, count, 32, async (s) => {
    const created = await s.call('tools/call', { name: 'bench_noop', arguments: {}, task: { ttl: ttlMs } });
    await s.call('tasks/result', { taskId: created.task.taskId });
  });
  const after = (await probeHeap(peerPid)).heapUsed;
  return { heapPerTerminal: (after - before) / count, totalPerTerminal: (after - before) / count };
}

/**
 * Slot hand-off (PROTOCOL.md §3.3, §3.5 step 4): `runs` tasks of a tool that runs one at a time per lane, all sent
 * at once over the sessions, each holding `holdMs`. The tool logs its handler's start and end; sorted by start, each
 * sample is one run's start minus the previous run's end: the time from a slot freeing (the handler returning; the
 * release follows it in the envelope) to the waiting run's handler starting, across the stack's workers.
 */
export async function slotHandoff(o: {
  sessions: McpSession[];
  redisUrl: string;
  prefix: string;
  tool: 'bench_slot_keyed' | 'bench_slot_queue';
  runs: number;
  holdMs: number;
}) {
  const redis = new Redis(o.redisUrl);
  const lane = token('slot');
  const key = `${o.prefix}:bench:slot:${lane}`;
  try {
    const created = await Promise.all(
      Array.from({ length: o.runs }, async (_v, i) => {
        const s = o.sessions[i % o.sessions.length]!;
        const answer = await s.call('tools/call', {
          name: o.tool,
          arguments: { lane, ms: o.holdMs },
          task: { ttl: 60_000 },
        });
        return { s, taskId: answer.task.taskId as string };
      }),
    );
    await Promise.all(created.map(({ s, taskId }) => s.call('tasks/result', { taskId })));
    const spans = (await redis.lrange(key, 0, -1))
      .map((line) => line.split(' ').map(Number) as [number, number])
      .sort((a, b) => a[0] - b[0]);
    if (spans.length !== o.runs) throw new Error(`${o.tool}: ${spans.length} of ${o.runs} runs logged`);
    const gaps = spans.slice(1).map(([start], i) => start - spans[i]![1]);
    const overlaps = gaps.filter((g) => g < 0).length;
    const lat = latency(gaps);
    return { p50: lat.p50, p99: lat.p99, overlaps };
  } finally {
    await redis.del(key).catch(() => undefined);
    redis.disconnect();
  }
}

/**
 * Redis bytes one retained failed task holds (PROTOCOL.md §30.1): `count` task calls of `bench_fail` (tagged by the
 * call and by the tool, with realistic arguments) on a stack that keeps failed tasks a week, measured once BullMQ's
 * own failed jobs are removed (they go after an hour anyway, bounded per queue): the hash, the kept arguments and the
 * index entries are what stays for the retention.
 */
export async function retainedBytes(o: {
  sessions: McpSession[];
  admin: RedisAdmin;
  count: number;
  redisUrl: string;
  prefix: string;
  queueName: string;
}): Promise<Record<string, number>> {
  const queue = new Queue(o.queueName, { connection: { url: o.redisUrl }, prefix: o.prefix });
  try {
    await queue.clean(0, 100_000, 'failed');
    const before = await o.admin.usedMemory();
    await fanOut(o.sessions, o.count, 32, async (s, i) => {
      const created = await s.call('tools/call', {
        name: 'bench_fail',
        arguments: { report: `r${i}`, items: 50 },
        task: { ttl: 60_000 },
        _meta: { 'dev.taskrelay/tags': ['nightly', 'team:data'] },
      });
      await s.call('tasks/result', { taskId: created.task.taskId });
    });
    await queue.clean(0, 100_000, 'failed');
    return { bytes: ((await o.admin.usedMemory()) - before) / o.count };
  } finally {
    await queue.close();
  }
}

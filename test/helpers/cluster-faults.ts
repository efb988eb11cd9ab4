/**
 * The cluster fault suites' shared pieces (test/faults/cluster-failover.fault.test.ts on the single layout,
 * test/faults/cluster-shards-failover.fault.test.ts on the sharded one): client sessions that keep every error a
 * client was answered, load that polls every task through a fault, the outcome of each task (runs and side effects
 * from the fault tools' records) and the checks that nothing was lost, stuck or completed twice.
 */
import { afterAll, beforeAll, expect } from 'vitest';
import type { Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix, type TestRedis } from './redis.js';
import type { TestCluster } from './redis-cluster.js';
import { waitFor } from './wait-for.js';
import { connectClient, type GatewayProcess, type ManagedProcess } from './processes.js';
import { useStack, type TestStack } from './stack.js';
import { FaultRecords, TERMINAL, WorkerPool, startTask, testRedis } from './faults.js';

const IDEMPOTENCY_KEY = 'dev.taskrelay/idempotency-key';

/** What the helpers need of a suite's stack, read at each use (a suite replaces its gateway after a SIGKILL). */
export interface FaultStack {
  gatewayUrl(): string;
  records: FaultRecords;
  /** Every process whose log lines a failed assertion shows. */
  procs(): ManagedProcess[];
}

export interface ClusterFaultOptions {
  /** Names the key prefix. */
  name: string;
  /** The workers' tools module (TASKRELAY_TOOLS): fault tools that record their runs and effects. */
  tools: string;
  /** False: an unbraced prefix, the sharded layout (PROTOCOL.md §1.1). Default: braces, the single layout. */
  braces?: boolean;
  /** A dead master is failed over after this (plus the election, about a second). */
  nodeTimeoutMs: number;
  /** Workers started before the gateway, so its first catalog read has every tool's shards. Default: none. */
  workersFirst?: { count: number; lockMs: number };
}

/** A cluster fault suite's stack: the cluster's stack, its one gateway (restarted in place) and a worker pool. */
export interface ClusterFaults extends FaultStack {
  readonly stack: TestStack;
  readonly cluster: TestCluster;
  readonly prefix: string;
  /** The pool `workers` made last (undefined before). */
  readonly pool: WorkerPool | undefined;
  /** `count` workers of lock duration `lockMs`: the pool as it is when it has them, else a fresh one. */
  workers(count: number, lockMs: number): Promise<WorkerPool>;
  /** SIGKILLs the gateway and starts another behind the same address. */
  restartGateway(): Promise<void>;
  /** Another process (a Python worker) whose log lines a failed assertion shows. */
  watch(proc: ManagedProcess): void;
}

/**
 * The cluster fault suites' stack: a Redis Cluster of `masters: 3` with a replica each (test/helpers/stack.ts), one
 * gateway, and workers from `workers`. The fault tools record to a standalone Redis of their own
 * (FAULT_RECORD_REDIS_URL), so the records are true through the cluster's outage.
 */
export function useClusterFaults(options: ClusterFaultOptions): ClusterFaults {
  const stack = useStack({
    name: options.name,
    cluster: { replicas: 1, nodeTimeoutMs: options.nodeTimeoutMs, braces: options.braces },
    gateways: [],
    workers: [],
    hookTimeoutMs: 120_000,
  });
  let recordRedis: TestRedis | undefined;
  let r: Redis | undefined;
  let records: FaultRecords | undefined;
  let gateway: GatewayProcess | undefined;
  let pool: WorkerPool | undefined;
  let poolLockMs = 0;
  const watched: ManagedProcess[] = [];
  const started = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`cluster faults ${options.name} have no ${what} (read it inside a test)`);
    return value;
  };
  const faults: ClusterFaults = {
    stack,
    get cluster() {
      return stack.cluster;
    },
    get prefix() {
      return stack.prefix;
    },
    get records() {
      return started(records, 'records');
    },
    get pool() {
      return pool;
    },
    gatewayUrl: () => started(gateway, 'gateway').url,
    procs: () => [started(gateway, 'gateway'), ...(pool ? pool.procs.values() : []), ...watched],
    async workers(count, lockMs) {
      if (pool && poolLockMs === lockMs && pool.procs.size >= count) return pool;
      await pool?.stopAll();
      pool = new WorkerPool(
        {
          TASKRELAY_TOOLS: options.tools,
          FAULT_RECORD_REDIS_URL: started(recordRedis, 'record Redis').url,
          FAULT_RECORD_PREFIX: stack.prefix,
          WORKER_CONCURRENCY: '20',
          WORKER_HEARTBEAT_MS: '1000',
          WORKER_LOCK_DURATION_MS: String(lockMs),
        },
        (env) => stack.addWorker(env),
      );
      poolLockMs = lockMs;
      await pool.start(count);
      return pool;
    },
    async restartGateway() {
      gateway = await stack.restartGateway(started(gateway, 'gateway'));
    },
    watch(proc) {
      watched.push(proc);
    },
  };
  beforeAll(async () => {
    recordRedis = await startRedis({ owned: true });
    r = testRedis(recordRedis.url);
    records = new FaultRecords(r, stack.prefix);
    if (options.workersFirst) await faults.workers(options.workersFirst.count, options.workersFirst.lockMs);
    // The reaper's default interval (5 s): its first look at a new task comes after a failover, not during one.
    gateway = await stack.addGateway();
  }, 120_000);
  afterAll(async () => {
    r?.disconnect();
    await recordRedis?.stop();
  });
  return faults;
}

/**
 * The kill loop under load: `count` tasks of 0.5–2 s polled through three rounds of worker SIGKILLs (1 and the
 * gateway, then 2, then 1) in a pool of 3 workers of `lockMs`, topped up after each round, a second apart.
 */
export async function killLoopUnderLoad(
  faults: ClusterFaults,
  sessions: Session[],
  load: { count: number; lockMs: number; toolOf?: (i: number) => string },
): Promise<{ outcomes: Outcome[]; kills: { workers: number; gateways: number } }> {
  const size = 3;
  const pool = await faults.workers(size, load.lockMs);
  const kills = { workers: 0, gateways: 0 };
  const fault = async () => {
    for (const round of [{ workers: 1, gateway: true }, { workers: 2 }, { workers: 1 }]) {
      const victims = [...pool.procs.values()].slice(0, round.workers);
      await Promise.all(victims.map((w) => w.kill('SIGKILL')));
      kills.workers += victims.length;
      if (round.gateway) {
        await faults.restartGateway();
        kills.gateways += 1;
      }
      await pool.start(size - pool.procs.size);
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  };
  const outcomes = await underLoad(faults, sessions, load.count, (i) => 500 + ((i * 379) % 1_501), fault, {
    toolOf: load.toolOf,
  });
  return { outcomes, kills };
}

/** A master's first replica, which a failover promotes. */
export async function replicaOf(cluster: TestCluster, master: number): Promise<number> {
  const [replica] = await cluster.replicasOf(master);
  if (replica === undefined) throw new Error(`master ${master} has no replica`);
  return replica;
}

/**
 * Fails `slot`'s master over to `replica`: gracefully (`CLUSTER FAILOVER` on the replica) or by a SIGKILL of the
 * master (`kill`). Waits until the replica serves the slot, then a second more. `startedAt` is when the fault began.
 */
export async function failOver(
  cluster: TestCluster,
  fault: { slot: number; master: number; replica: number; kill?: boolean },
): Promise<{ startedAt: number; promotedMs: number }> {
  const { slot, master, replica } = fault;
  const startedAt = Date.now();
  if (fault.kill) await cluster.kill(master);
  else await cluster.node(replica).cluster('FAILOVER');
  await waitFor(async () => (await cluster.masterOf(slot, replica).catch(() => undefined)) === replica, {
    timeoutMs: 30_000,
    intervalMs: 50,
    message: `replica ${replica} did not take over slot ${slot}`,
  });
  const promotedMs = Date.now() - startedAt;
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  return { startedAt, promotedMs };
}

export interface FailoverUnderLoad {
  outcomes: Outcome[];
  /** The tasks a client created while the fault lasted (`creating`), and how often a create was retried. */
  createdIds: string[];
  retries: number;
  replica: number;
  startedAt: number;
  promotedMs: number;
}

/**
 * A failover (`failOver`) of `slot`'s master under load: `count` tasks of `msOf(i)` ms polled through it, and a
 * client creating tasks until it is over. Each session's errors are cleared first, so they are the fault's.
 */
export async function failOverUnderLoad(
  faults: ClusterFaults,
  sessions: Session[],
  load: { count: number; msOf: (i: number) => number; toolOf?: (i: number) => string },
  fault: { slot: number; master: number; kill?: boolean },
): Promise<FailoverUnderLoad> {
  for (const s of sessions) s.errors.length = 0;
  const replica = await replicaOf(faults.cluster, fault.master);
  let faultOver = false;
  const creator = creating(sessions[1] as Session, () => faultOver, load.toolOf);
  let promotion = { startedAt: 0, promotedMs: 0 };
  const outcomes = await underLoad(
    faults,
    sessions,
    load.count,
    load.msOf,
    async () => {
      promotion = await failOver(faults.cluster, { ...fault, replica });
      faultOver = true;
    },
    { toolOf: load.toolOf },
  );
  return { outcomes, createdIds: await creator.done, retries: creator.retries(), replica, ...promotion };
}

/** An error a client saw: when, and what it said. */
export interface SeenError {
  at: number;
  message: string;
  dataCode: string | undefined;
}

/**
 * One client session of the gateway, replaced when the gateway went away (a SIGKILL) or forgot it (its restart).
 * Every JSON-RPC error answered meanwhile is kept, with its time.
 */
export class Session {
  readonly errors: SeenError[] = [];
  private current: Promise<Client> | undefined;

  constructor(private readonly stack: FaultStack) {}

  private client(): Promise<Client> {
    this.current ??= waitFor(() => connectClient(this.stack.gatewayUrl()).catch(() => undefined), {
      timeoutMs: 30_000,
      message: 'could not reconnect to the gateway',
    });
    return this.current;
  }

  async request<T>(send: (client: Client) => Promise<T>): Promise<T> {
    const client = await this.client();
    try {
      return await send(client);
    } catch (error) {
      if (error instanceof McpError) {
        const data = error.data as { code?: unknown } | undefined;
        this.errors.push({
          at: Date.now(),
          message: error.message,
          dataCode: typeof data?.code === 'string' ? data.code : undefined,
        });
      } else if ((await this.current) === client) {
        // Not an answer: the gateway is gone or does not know the session. A new one, on the next request.
        this.current = undefined;
        void client.close().catch(() => undefined);
      }
      throw error;
    }
  }

  async close(): Promise<void> {
    const client = await this.current?.catch(() => undefined);
    await client?.close().catch(() => undefined);
  }
}

export interface Outcome {
  taskId: string;
  tool: string;
  status: string;
  runs: number;
  effects: number;
  /** From creation to the last update, less the time the tool sleeps: queueing, takeovers, pauses. */
  extraMs: number;
}

/**
 * Submits `count` tasks of a chaos_job-like tool (`toolOf(i)`, default chaos_job; progress every 200 ms), runs
 * `fault` once every one of them has started, keeps polling all of them by id through it, and returns each task's
 * outcome once all ended (or the bound passed: the assertions then name the stuck ones).
 */
export async function underLoad(
  stack: FaultStack,
  sessions: Session[],
  count: number,
  msOf: (i: number) => number,
  fault: () => Promise<void>,
  options: { boundMs?: number; toolOf?: (i: number) => string } = {},
): Promise<Outcome[]> {
  const toolOf = options.toolOf ?? (() => 'chaos_job');
  const submitted = await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      const session = sessions[i % sessions.length] as Session;
      const ms = msOf(i);
      const tool = toolOf(i);
      const taskId = await session.request((c) => startTask(c, tool, { ms, stepMs: 200 }));
      return { taskId, tool, session, ms };
    }),
  );
  await waitFor(
    async () => (await Promise.all(submitted.map((s) => stack.records.counter('runs', s.taskId)))).every((n) => n >= 1),
    { timeoutMs: 30_000, message: 'the tasks did not all start' },
  );
  const ended = new Map<string, { status: string; extraMs: number }>();
  const poll = async () => {
    await Promise.all(
      submitted
        .filter((s) => !ended.has(s.taskId))
        .map(async (s) => {
          const task = await s.session.request((c) => c.experimental.tasks.getTask(s.taskId, { timeout: 5_000 }));
          if (!TERMINAL.has(task.status)) return;
          const took = Date.parse(task.lastUpdatedAt) - Date.parse(task.createdAt);
          ended.set(s.taskId, { status: task.status, extraMs: took - s.ms });
        }),
    ).catch(() => undefined);
    return ended.size === submitted.length;
  };
  const polling = waitFor(poll, { timeoutMs: options.boundMs ?? 60_000, intervalMs: 100 }).catch(() => undefined);
  await fault();
  await polling;
  return Promise.all(
    submitted.map(async (s) => ({
      taskId: s.taskId,
      tool: s.tool,
      status: ended.get(s.taskId)?.status ?? 'not ended',
      runs: await stack.records.counter('runs', s.taskId),
      effects: await stack.records.counter('effects', s.taskId),
      extraMs: ended.get(s.taskId)?.extraMs ?? Number.NaN,
    })),
  );
}

/**
 * Creates short tasks (`toolOf(i)`, default chaos_job) with an idempotency key, as a client would, retrying each
 * while the store is unavailable, until `until()`.
 */
export function creating(
  session: Session,
  until: () => boolean,
  toolOf: (i: number) => string = () => 'chaos_job',
): { done: Promise<string[]>; retries: () => number } {
  let retries = 0;
  const done = (async () => {
    const ids: string[] = [];
    for (let i = 0; !until(); i++) {
      const key = `${uniquePrefix('create')}-${i}`;
      const tool = toolOf(i);
      const taskId = await waitFor(
        () =>
          session
            .request((c) =>
              startTask(c, tool, { ms: 200, stepMs: 100 }, { meta: { [IDEMPOTENCY_KEY]: key }, timeoutMs: 5_000 }),
            )
            .catch(() => {
              retries += 1;
              return undefined;
            }),
        { timeoutMs: 30_000, intervalMs: 100, message: 'a create was not answered once the store was back' },
      );
      ids.push(taskId);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return ids;
  })();
  return { done, retries: () => retries };
}

/**
 * A request the client gave up on (the SDK's own timeout, -32001): no answer of the gateway's, but a wait longer than
 * the client's timeout, which a suite prints.
 */
function timedOut(e: SeenError): boolean {
  return / -32001: Request timed out$/.test(e.message);
}

/** The requests the clients gave up on waiting for. */
export function timeouts(sessions: Session[]): SeenError[] {
  return sessions.flatMap((s) => s.errors).filter(timedOut);
}

/** Every error a gateway answered that did not say the store was unavailable and to retry: an opaque one. */
export function opaque(sessions: Session[]): SeenError[] {
  return sessions
    .flatMap((s) => s.errors)
    .filter((e) => !timedOut(e))
    .filter((e) => e.dataCode !== 'REDIS_UNAVAILABLE' || !/Task store unavailable: .*retry shortly$/.test(e.message));
}

/** The errors clients saw, in time order, and the window they span (first to last). */
export function errorWindow(sessions: Session[]): { errors: SeenError[]; windowMs: number } {
  const errors = sessions.flatMap((s) => s.errors).sort((a, b) => a.at - b.at);
  return { errors, windowMs: errors.length > 0 ? (errors.at(-1)?.at ?? 0) - (errors[0]?.at ?? 0) : 0 };
}

export function summary(outcomes: Outcome[]): string {
  const extras = outcomes.map((o) => o.extraMs).filter((n) => Number.isFinite(n));
  const runs = outcomes.reduce((m, o) => m.set(o.runs, (m.get(o.runs) ?? 0) + 1), new Map<number, number>());
  return (
    `runs per task → tasks ${JSON.stringify(Object.fromEntries(runs))}, ` +
    `extra time per task max ${Math.max(...extras)} ms, median ${extras.sort((a, b) => a - b)[extras.length >> 1]} ms`
  );
}

/** The log lines of the stack's processes that name a task: what a failed assertion shows. */
export function linesAbout(stack: FaultStack, taskId: string): string {
  return stack
    .procs()
    .flatMap((p) => p.logs())
    .filter((line) => JSON.stringify(line).includes(taskId))
    .map((line) => `${String(line['level'])} ${String(line['msg'])} ${JSON.stringify(line['err'] ?? '')}`.slice(0, 400))
    .join('\n');
}

/** Every task completed with its side effect applied once, those created during the fault too. */
export async function endedOnce(
  stack: FaultStack,
  session: Session,
  outcomes: Outcome[],
  createdIds: string[] = [],
): Promise<void> {
  expect(
    outcomes.filter((o) => o.status !== 'completed'),
    outcomes
      .filter((o) => o.status !== 'completed')
      .map((o) => linesAbout(stack, o.taskId))
      .join('\n'),
  ).toEqual([]);
  expect(outcomes.filter((o) => o.effects !== 1)).toEqual([]);
  for (const taskId of createdIds) {
    const task = await waitFor(
      async () => {
        const t = await session.request((c) => c.experimental.tasks.getTask(taskId)).catch(() => undefined);
        return t && TERMINAL.has(t.status) ? t : undefined;
      },
      { timeoutMs: 30_000, message: `task ${taskId} created during the fault did not end` },
    );
    expect(task.status, `${taskId}: ${task.statusMessage ?? ''}\n${linesAbout(stack, taskId)}`).toBe('completed');
    expect(await stack.records.counter('effects', taskId), taskId).toBe(1);
  }
}

/** Each run's own log lines naming a lost result write, and the writes retried once Redis answered again. */
export function workerWrites(procs: ManagedProcess[]): { lost: unknown[]; rewritten: unknown[] } {
  const lines = procs.flatMap((w) => w.logs());
  return {
    lost: lines.filter((line) => /lost: Redis unreachable/.test(String(line['msg']))),
    rewritten: lines.filter((line) => /written after Redis answered again/.test(String(line['msg']))),
  };
}

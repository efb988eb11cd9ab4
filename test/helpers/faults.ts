/**
 * Shared pieces of the fault suite (test/faults): the fault tools' records, a client that keeps what a user would see
 * (progress, status notifications), and task calls with a bounded wait.
 */
import { afterAll, beforeAll } from 'vitest';
import { Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  McpError,
  ProgressNotificationSchema,
  TaskStatusNotificationSchema,
  type CallToolResult,
  type GetTaskResult,
  type ProgressNotification,
  type TaskStatusNotification,
} from '@modelcontextprotocol/sdk/types.js';
import { resolve } from 'node:path';
import { ROOT, connectClient, startWorkerProcess, type ManagedProcess } from './processes.js';
import { useStack, type StackOptions, type TestStack } from './stack.js';
import { waitFor } from './wait-for.js';

export const FAULT_TOOLS = resolve(ROOT, 'test/fixtures/fault-tools.mjs');

/** Statuses that never change (docs/MCP.md). */
export const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

/** One line of `<prefix>:fault:events:<taskId>`, as test/fixtures/fault-tools.mjs writes it. */
export interface FaultEvent {
  e: 'start' | 'progress' | 'end';
  run: string;
  pid: number;
  attempt: number;
  taskId: string;
  step?: number;
  message?: string;
  outcome?: 'returned' | 'threw';
  reason?: string;
  /** When the tool recorded it (Date.now() in the worker): orders the runs of one worker across tasks. */
  at?: number;
  /** Written by the test itself (markFault), not by a tool. */
  fault?: string;
}

/** The Redis keys the fault tools write (mirrors `faultKeys` in fault-tools.mjs). */
export function faultKeys(prefix: string) {
  return {
    events: (taskId: string) => `${prefix}:fault:events:${taskId}`,
    runs: (taskId: string) => `${prefix}:runs:${taskId}`,
    effects: (taskId: string) => `${prefix}:effects:${taskId}`,
    effectRuns: (taskId: string) => `${prefix}:effect-runs:${taskId}`,
  };
}

export class FaultRecords {
  private readonly keys: ReturnType<typeof faultKeys>;
  constructor(
    readonly redis: Redis,
    readonly prefix: string,
  ) {
    this.keys = faultKeys(prefix);
  }

  /** The ids of every task a fault tool has recorded anything for. */
  async taskIds(): Promise<string[]> {
    const pattern = this.keys.events('*');
    const ids: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await this.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      cursor = next;
      for (const key of keys) ids.push(key.slice(pattern.length - 1));
    } while (cursor !== '0');
    return ids;
  }

  async events(taskId: string): Promise<FaultEvent[]> {
    const lines = await this.redis.lrange(this.keys.events(taskId), 0, -1);
    return lines.map((line) => JSON.parse(line) as FaultEvent);
  }

  /** The runs of a task in the order they started, each with its events. */
  async runs(taskId: string): Promise<Array<{ run: string; pid: number; attempt: number; events: FaultEvent[] }>> {
    const byRun = new Map<string, { run: string; pid: number; attempt: number; events: FaultEvent[] }>();
    for (const event of await this.events(taskId)) {
      if (event.fault !== undefined) continue;
      let entry = byRun.get(event.run);
      if (!entry)
        byRun.set(event.run, (entry = { run: event.run, pid: event.pid, attempt: event.attempt, events: [] }));
      entry.events.push(event);
    }
    return [...byRun.values()];
  }

  /** Waits until a run of the task has started (on `pid`, when given) and returns it. */
  async waitForStart(taskId: string, options: { pid?: number; nth?: number; timeoutMs?: number } = {}) {
    const nth = options.nth ?? 1;
    return waitFor(
      async () => {
        const starts = (await this.events(taskId)).filter(
          (e) => e.e === 'start' && (options.pid === undefined || e.pid === options.pid),
        );
        return starts[nth - 1];
      },
      { timeoutMs: options.timeoutMs ?? 15_000, message: `run ${nth} of task ${taskId} did not start` },
    );
  }

  /** Waits until the given run has recorded at least `steps` progress steps. */
  async waitForSteps(taskId: string, run: string, steps: number, timeoutMs = 10_000): Promise<void> {
    await waitFor(
      async () => (await this.events(taskId)).filter((e) => e.run === run && e.e === 'progress').length >= steps,
      { timeoutMs, message: `run ${run} of task ${taskId} did not report ${steps} steps` },
    );
  }

  /** Writes a marker into the task's event list: everything after it happened after the fault. */
  async markFault(taskId: string, fault: string): Promise<void> {
    await this.redis.rpush(this.keys.events(taskId), JSON.stringify({ fault }));
  }

  /** Marks the runs of a process as over (call after it exited): a SIGKILLed run records no `end`. */
  markKilled(taskId: string, pid: number): Promise<void> {
    return this.markFault(taskId, `killed:${pid}`);
  }

  async counter(kind: 'runs' | 'effects' | 'effectRuns', taskId: string): Promise<number> {
    return Number((await this.redis.get(this.keys[kind](taskId))) ?? 0);
  }
}

/**
 * Pairs of runs of one task that were running at the same time. A run is open from its `start` until its `end`, or
 * until a `killed:<pid>` marker (markKilled) for its process: a start while another run is open is an overlap.
 */
export function overlappingRuns(events: FaultEvent[]): Array<[FaultEvent, FaultEvent]> {
  const open = new Map<string, FaultEvent>();
  const overlaps: Array<[FaultEvent, FaultEvent]> = [];
  for (const event of events) {
    if (event.fault !== undefined) {
      const killed = /^killed:(\d+)$/.exec(event.fault);
      for (const [run, other] of open) if (killed && other.pid === Number(killed[1])) open.delete(run);
      continue;
    }
    if (event.e === 'start') {
      for (const other of open.values()) overlaps.push([other, event]);
      open.set(event.run, event);
    } else if (event.e === 'end') open.delete(event.run);
  }
  return overlaps;
}

/** A client that records what a user sees: every progress notification and every task status notification. */
export interface WatchingClient {
  client: Client;
  progress: ProgressNotification['params'][];
  statuses: TaskStatusNotification['params'][];
  close(): Promise<void>;
}

export async function watchingClient(url: string, headers: Record<string, string> = {}): Promise<WatchingClient> {
  const client = await connectClient(url, headers);
  const progress: ProgressNotification['params'][] = [];
  const statuses: TaskStatusNotification['params'][] = [];
  client.setNotificationHandler(ProgressNotificationSchema, (n) => {
    progress.push(n.params);
  });
  client.setNotificationHandler(TaskStatusNotificationSchema, (n) => {
    statuses.push(n.params);
  });
  return { client, progress, statuses, close: () => client.close() };
}

// Task calls live in tasks.ts; the fault suites import them from here with the rest of their kit.
export { startTask, taskResult } from './tasks.js';

/** Polls `tasks/get` until the task is terminal. */
export async function waitForTerminal(client: Client, taskId: string, timeoutMs = 20_000): Promise<GetTaskResult> {
  return waitFor(
    async () => {
      const task = await client.experimental.tasks.getTask(taskId, { timeout: 5_000 });
      return TERMINAL.has(task.status) ? task : undefined;
    },
    { timeoutMs, intervalMs: 100, message: `task ${taskId} did not end` },
  );
}

/** The error a promise rejected with (undefined when it resolved). */
export async function rejectionOf(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => undefined,
    (error: unknown) => error,
  );
}

export function isMcpError(error: unknown, code: number): error is McpError {
  return error instanceof McpError && error.code === code;
}

/**
 * `call`, made again (at most `tries` times in all) while the gateway answers `-32603 Task store unavailable … retry
 * shortly`: its fail-fast answer when Redis does not answer in time (a flood beside other suites on a loaded machine),
 * and what a client is told to do then. `onRetry` hears each retry (a suite bounding what its calls produced).
 */
export async function retryingUnavailable<T>(call: () => Promise<T>, tries = 3, onRetry?: () => void): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (error) {
      const unavailable = isMcpError(error, -32603) && /Task store unavailable/.test(error.message);
      if (!unavailable || attempt >= tries) throw error;
      onRetry?.();
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
}

/** The text of a tool result (its text content items, joined). */
export function textOf(result: CallToolResult | undefined): string {
  return (result?.content ?? []).flatMap((item) => (item.type === 'text' ? [item.text] : [])).join('\n');
}

/** A Redis client for the test process itself; remember to disconnect it. */
export function testRedis(url: string): Redis {
  const client = new Redis(url, { maxRetriesPerRequest: null });
  // Outages are on purpose here; commands wait for the reconnect.
  client.on('error', () => undefined);
  return client;
}

/** Worker processes of one test file, by pid, so a test can kill exactly the one running a task. */
export class WorkerPool {
  readonly procs = new Map<number, ManagedProcess>();
  /** `start` starts one worker: a stack's `addWorker`, so the stack stops them too, or a bare process. */
  constructor(
    private readonly env: Record<string, string | undefined>,
    private readonly startOne: (
      env: Record<string, string | undefined>,
    ) => Promise<ManagedProcess> = startWorkerProcess,
  ) {}

  async start(count = 1, env: Record<string, string> = {}): Promise<ManagedProcess[]> {
    const started = await Promise.all(Array.from({ length: count }, () => this.startOne({ ...this.env, ...env })));
    for (const proc of started) {
      this.procs.set(proc.pid, proc);
      void proc.exited.then(() => this.procs.delete(proc.pid));
    }
    return started;
  }

  get(pid: number): ManagedProcess {
    const proc = this.procs.get(pid);
    if (!proc) throw new Error(`no live worker with pid ${pid}`);
    return proc;
  }

  /** Kills one worker and waits until it is gone. */
  async kill(pid: number, signal: NodeJS.Signals = 'SIGKILL'): Promise<number | null> {
    return this.get(pid).kill(signal);
  }

  async stopAll(): Promise<void> {
    await Promise.all([...this.procs.values()].map((p) => p.kill('SIGKILL')));
  }
}

export interface FaultStack {
  readonly stack: TestStack;
  /** The fault tools' records under the stack's prefix. */
  readonly records: FaultRecords;
  /** A watching client of the stack's first gateway. */
  readonly watcher: WatchingClient;
}

/**
 * A fault suite's stack (test/helpers/stack.ts's `useStack`, on a Redis of its own unless `redis` says otherwise),
 * with its records and a watching client of its first gateway (`watch`: its headers, or false for none), made in a
 * `beforeAll` that runs before the file's own.
 */
export function useFaultStack(options: StackOptions & { watch?: false | Record<string, string> }): FaultStack {
  const { watch = {}, ...stackOptions } = options;
  const stack = useStack({ redis: { owned: true }, ...stackOptions });
  let records: FaultRecords | undefined;
  let watcher: WatchingClient | undefined;
  beforeAll(async () => {
    records = new FaultRecords(stack.r, stack.prefix);
    if (watch !== false && stack.gateways.length > 0) watcher = await watchingClient(stack.gateway.url, watch);
  });
  afterAll(async () => {
    await watcher?.close();
  });
  const started = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`fault stack ${options.name} has no ${what} (read it inside a test)`);
    return value;
  };
  return {
    stack,
    get records() {
      return started(records, 'records');
    },
    get watcher() {
      return started(watcher, 'watching client');
    },
  };
}

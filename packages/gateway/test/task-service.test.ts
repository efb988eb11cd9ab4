/**
 * TaskService against an in-memory store, dispatcher and router (no Redis): what it promises its two transports.
 * Tasks belong to a principal, never a session; a cancel is stored before the worker is told; a job that cannot be
 * queued leaves no task that could run later; an idempotency key returns the first task without a second job.
 */
import { randomBytes } from 'node:crypto';
import { beforeEach, describe, expect, it } from 'vitest';
import {
  canTransition,
  createLogger,
  type AnswerOutcome,
  type CancelReason,
  type CreateOutcome,
  type CreateTaskInput,
  type JobData,
  type TaskStore,
  type TaskPage,
  type TaskRecord,
  type TaskStatus,
  type TransitionOutcome,
} from '@taskrelay/shared';
import type { CatalogTool, ToolCatalog } from '../src/tasks/catalog.js';
import type { JobDispatcher } from '../src/tasks/job-dispatcher.js';
import { GatewayMetrics } from '../src/metrics/gateway-metrics.js';
import type { TaskRouter } from '../src/tasks/task-router.js';
import { MIN_TTL_MS, grantTtl, runDeadlineAt } from '../src/tasks/task-policy.js';
import { TaskService } from '../src/tasks/task-service.js';
import type { StartTaskInput } from '../src/tasks/task-start.js';
import { checkAnswer } from '../src/wire/input-answers.js';
import { renderResult, renderTask } from '../src/wire/task-wire.js';

describe('granted ttl', () => {
  const config = { defaultTtlMs: 3_600_000, maxTtlMs: 86_400_000 };
  it('uses the default when none is asked and clamps to [1 s, max] in whole ms', () => {
    expect(grantTtl(undefined, config)).toBe(3_600_000);
    expect(grantTtl(0, config)).toBe(MIN_TTL_MS);
    expect(grantTtl(-5, config)).toBe(MIN_TTL_MS);
    expect(grantTtl(1500.5, config)).toBe(1501);
    expect(grantTtl(1e12, config)).toBe(86_400_000);
    expect(grantTtl(Number.NaN, config)).toBe(3_600_000);
  });
});

describe('2025-11-25 rendering of a stored task', () => {
  const base: TaskRecord = {
    taskId: 't',
    status: 'working',
    createdAt: 'c',
    lastUpdatedAt: 'u',
    ttl: 1000,
    pollInterval: 500,
    tool: 'x',
    queue: 'q',
    principal: 'p',
    mode: 'task',
    progressToken: 'secret-of-the-caller',
    sessionId: 'sid',
  };

  it('shows only the wire fields of a Task', () => {
    expect(renderTask({ ...base, statusMessage: 'half' })).toEqual({
      taskId: 't',
      status: 'working',
      statusMessage: 'half',
      createdAt: 'c',
      lastUpdatedAt: 'u',
      ttl: 1000,
      pollInterval: 500,
    });
  });

  it('gives the stored result for completed and failed tasks and an error result for cancelled ones', () => {
    const result = { content: [{ type: 'text', text: 'ok' }] };
    expect(renderResult({ ...base, status: 'completed', result })).toEqual(result);
    expect(renderResult({ ...base, status: 'cancelled' })).toMatchObject({ isError: true });
    expect(renderResult({ ...base, status: 'failed', error: { code: 'TOOL_FAILED', message: 'boom' } })).toEqual({
      content: [{ type: 'text', text: 'boom' }],
      isError: true,
    });
  });
});

/** The store methods TaskService uses, kept in a Map and checked against the task model's transition table. */
class FakeStore {
  readonly tasks = new Map<string, TaskRecord>();
  readonly idempotency = new Map<string, string>();
  readonly log: string[] = [];

  createTask(input: CreateTaskInput, now = new Date()): Promise<CreateOutcome> {
    const idem = input.idempotencyKey === undefined ? undefined : `${input.principal}\n${input.idempotencyKey}`;
    const existing = idem === undefined ? undefined : this.tasks.get(this.idempotency.get(idem) ?? '');
    if (existing) return Promise.resolve({ record: existing, created: false });
    const taskId = input.taskId ?? randomBytes(16).toString('hex');
    const record: TaskRecord = {
      taskId,
      status: 'working',
      createdAt: now.toISOString(),
      lastUpdatedAt: now.toISOString(),
      ttl: input.ttl,
      pollInterval: input.pollInterval,
      tool: input.tool,
      queue: input.queue,
      principal: input.principal,
      mode: input.mode,
      ...(input.sessionId === undefined ? {} : { sessionId: input.sessionId }),
      ...(input.gatewayId === undefined ? {} : { gatewayId: input.gatewayId }),
      ...(input.progressToken === undefined ? {} : { progressToken: input.progressToken }),
    };
    this.tasks.set(taskId, record);
    if (idem !== undefined) this.idempotency.set(idem, taskId);
    this.log.push(`create ${taskId}`);
    return Promise.resolve({ record, created: true });
  }

  get(taskId: string): Promise<TaskRecord | undefined> {
    return Promise.resolve(this.tasks.get(taskId));
  }

  /** Plays Redis still away when the next transition is written. */
  failNextTransition = false;

  transition(
    taskId: string,
    to: TaskStatus,
    fields: Partial<TaskRecord> = {},
    options: { dropIdempotency?: boolean } = {},
  ): Promise<TransitionOutcome> {
    if (this.failNextTransition) {
      this.failNextTransition = false;
      return Promise.reject(new Error('Too many Cluster redirections. Last error: Error: Connection is closed.'));
    }
    const record = this.tasks.get(taskId);
    if (!record) return Promise.resolve({ ok: false, status: undefined });
    if (!canTransition(record.status, to)) return Promise.resolve({ ok: false, status: record.status });
    this.tasks.set(taskId, { ...record, ...fields, status: to });
    if (options.dropIdempotency) {
      for (const [key, id] of this.idempotency) if (id === taskId) this.idempotency.delete(key);
    }
    this.log.push(`transition ${taskId} ${to}`);
    return Promise.resolve({ ok: true, status: to });
  }

  /** The deadline each stored answer carried, by `<taskId> <n>`. */
  readonly answerDeadlines = new Map<string, number>();

  answerInput(taskId: string, n: number | string, _answer: unknown, deadlineAt: number): Promise<AnswerOutcome> {
    const record = this.tasks.get(taskId);
    if (record?.status !== 'input_required') return Promise.resolve({ ok: false, status: record?.status });
    this.answerDeadlines.set(`${taskId} ${String(n)}`, deadlineAt);
    this.tasks.set(taskId, { ...record, status: 'working', pendingInputs: [] });
    return Promise.resolve({ ok: true, queue: record.queue, resumed: true });
  }

  list(principal: string): Promise<TaskPage> {
    return Promise.resolve({ tasks: [...this.tasks.values()].filter((t) => t.principal === principal) });
  }
}

/** Records what reached the queue; `failNextEnqueue` plays Redis going away. */
class FakeDispatcher {
  readonly jobs: JobData[] = [];
  readonly cancels: Array<{ taskId: string; reason: CancelReason }> = [];
  failNextEnqueue = false;

  constructor(private readonly store: FakeStore) {}

  enqueue(_tool: CatalogTool, data: JobData): Promise<void> {
    if (this.failNextEnqueue) {
      this.failNextEnqueue = false;
      return Promise.reject(new Error('ECONNREFUSED 127.0.0.1:6379'));
    }
    this.jobs.push(data);
    return Promise.resolve();
  }

  /** Adds the job unless one with its id was added (BullMQ's job id is the task id). */
  ensureEnqueued(tool: CatalogTool, data: JobData): Promise<boolean> {
    if (this.jobs.some((job) => job.taskId === data.taskId)) return Promise.resolve(false);
    return this.enqueue(tool, data).then(() => true);
  }

  cancel(taskId: string, _queue: string, reason: CancelReason): Promise<void> {
    // What the worker would see when told: the status already stored.
    this.store.log.push(`tell worker ${taskId} (${this.store.tasks.get(taskId)?.status})`);
    this.cancels.push({ taskId, reason });
    return Promise.resolve();
  }

  promote(): Promise<void> {
    return Promise.resolve();
  }
}

class FakeRouter {
  readonly routes = new Set<string>();

  register(route: { record: TaskRecord }): void {
    this.routes.add(route.record.taskId);
  }

  retire(taskId: string): void {
    this.routes.delete(taskId);
  }

  /** Tasks that ended here a moment ago, as their terminal events told them (the router's memory, §6.7). */
  readonly ended = new Map<string, TaskRecord>();

  recentlyEnded(taskId: string): TaskRecord | undefined {
    return this.ended.get(taskId);
  }

  forget(taskId: string): void {
    this.ended.delete(taskId);
  }

  /** A poll's wait for a young task (§28.1): what it is told, and what happens while it waits. */
  readonly settles: Array<{ taskId: string; visible: (record: TaskRecord) => boolean }> = [];
  whileSettling: (taskId: string) => void = () => undefined;

  settle(taskId: string, visible: (record: TaskRecord) => boolean): Promise<void> {
    this.settles.push({ taskId, visible });
    this.whileSettling(taskId);
    return Promise.resolve();
  }

  /** Where an awaited ack is logged, beside the store's writes. */
  ackLog: string[] | undefined;

  expectAck(taskId: string): { wait(): Promise<boolean>; cancel(): void } {
    return {
      wait: () => {
        this.ackLog?.push(`ack awaited ${taskId}`);
        return Promise.resolve(true);
      },
      cancel: () => undefined,
    };
  }
}

const TOOL: CatalogTool = {
  paused: false,
  name: 'build_report',
  description: 'Builds a report.',
  inputSchema: { type: 'object' },
  taskSupport: 'optional',
  timeoutMs: 5 * 60_000,
  queue: 'default-abc',
};

const CONFIG = {
  gatewayId: 'g1',
  defaultTtlMs: 60_000,
  maxTtlMs: 120_000,
  pollIntervalMs: 1_000,
  maxToolTimeoutMs: 60_000,
  queueTimeoutMs: 30_000,
  checkAnswer,
};

let store: FakeStore;
let dispatcher: FakeDispatcher;
let router: FakeRouter;
let service: TaskService;
let metrics: GatewayMetrics;
/** What the fake catalog's `find` answers. */
let catalogTool: CatalogTool;

beforeEach(() => {
  store = new FakeStore();
  dispatcher = new FakeDispatcher(store);
  router = new FakeRouter();
  catalogTool = TOOL;
  metrics = new GatewayMetrics();
  const catalog = {
    unservedReason: () => Promise.resolve(undefined),
    orphanedReason: () => Promise.resolve(undefined),
    find: () => Promise.resolve(catalogTool),
  };
  // The fakes implement only what TaskService calls; the casts say so once, here.
  service = new TaskService(
    // One fake plays both aggregates TaskService uses: task records and runs.
    { records: store, runs: store } as unknown as TaskStore,
    catalog as unknown as ToolCatalog,
    dispatcher as unknown as JobDispatcher,
    router as unknown as TaskRouter,
    metrics,
    createLogger('test', { level: 'silent' }),
    CONFIG,
  );
});

function input(overrides: Partial<StartTaskInput> = {}): StartTaskInput {
  return {
    tool: TOOL,
    args: { report: 'q3', items: 3 },
    mode: 'task',
    principal: 'alice',
    sessionId: 's1',
    progressToken: undefined,
    requestedTtlMs: undefined,
    ...overrides,
  };
}

describe('TaskService.start', () => {
  it('stores the task for its principal, then queues one job carrying the arguments and the bounded timeout', async () => {
    const record = await service.start(input({ requestedTtlMs: 10 * 60_000 }));
    expect(record).toMatchObject({ status: 'working', principal: 'alice', mode: 'task', ttl: CONFIG.maxTtlMs });
    expect(store.tasks.get(record.taskId)?.status).toBe('working');
    expect(dispatcher.jobs).toEqual([
      expect.objectContaining({
        taskId: record.taskId,
        tool: 'build_report',
        arguments: { report: 'q3', items: 3 },
        // The tool asks for 5 min; the gateway allows at most 1 min.
        timeoutMs: CONFIG.maxToolTimeoutMs,
        principal: 'alice',
      }),
    ]);
    expect(router.routes.has(record.taskId)).toBe(true);
  });

  it('returns the first task for a reused idempotency key and queues no second job', async () => {
    const first = await service.start(input({ idempotencyKey: 'order-42' }));
    const again = await service.start(input({ idempotencyKey: 'order-42', sessionId: 'another-session' }));
    expect(again.taskId).toBe(first.taskId);
    expect(dispatcher.jobs).toHaveLength(1);
    const bob = await service.start(input({ idempotencyKey: 'order-42', principal: 'bob' }));
    expect(bob.taskId).not.toBe(first.taskId);
  });

  it('fails the task and frees its idempotency key when the job cannot be queued, and says so to the caller', async () => {
    dispatcher.failNextEnqueue = true;
    await expect(service.start(input({ idempotencyKey: 'k' }))).rejects.toThrow(/ECONNREFUSED/);
    const [stored] = [...store.tasks.values()];
    expect(stored).toMatchObject({ status: 'failed', error: { code: 'JOB_LOST' } });
    expect(router.routes.size).toBe(0);
    // A retry with the same key gets a fresh task that does run.
    const retry = await service.start(input({ idempotencyKey: 'k' }));
    expect(retry.taskId).not.toBe(stored?.taskId);
    expect(dispatcher.jobs.map((j) => j.taskId)).toEqual([retry.taskId]);
  });
});

describe('TaskService.start through a failover (PROTOCOL.md §10.10)', () => {
  it('adds the job of a keyed task whose first call could not, when the key is replayed, and only once', async () => {
    // The job could not be added, nor the task failed: Redis (a cluster's slot) was away for both.
    dispatcher.failNextEnqueue = true;
    store.failNextTransition = true;
    await expect(service.start(input({ idempotencyKey: 'k' }))).rejects.toThrow(/ECONNREFUSED/);
    const [stored] = [...store.tasks.values()];
    expect(stored?.status).toBe('working');
    expect(dispatcher.jobs).toEqual([]);
    // The client retries with its key once the store answers: the same task, and now its job.
    const retry = await service.start(input({ idempotencyKey: 'k' }));
    expect(retry.taskId).toBe(stored?.taskId);
    expect(dispatcher.jobs.map((j) => j.taskId)).toEqual([stored?.taskId]);
    await service.start(input({ idempotencyKey: 'k' }));
    expect(dispatcher.jobs).toHaveLength(1);
  });

  it('adds nothing for the replay of a task that started or ended', async () => {
    const first = await service.start(input({ idempotencyKey: 'k2' }));
    dispatcher.jobs.length = 0;
    store.tasks.set(first.taskId, { ...(store.tasks.get(first.taskId) as TaskRecord), attempt: 1 });
    await service.start(input({ idempotencyKey: 'k2' }));
    expect(dispatcher.jobs).toEqual([]);
  });
});

describe('TaskService.get and list', () => {
  it('answers "not found" for another principal’s task and for a plain call’s task, as for an unknown id', async () => {
    const task = await service.start(input());
    const call = await service.start(input({ mode: 'call' }));
    await expect(service.get(task.taskId, 'alice')).resolves.toMatchObject({ taskId: task.taskId });
    for (const [id, principal] of [
      [task.taskId, 'bob'],
      [call.taskId, 'alice'],
      ['no-such-task', 'alice'],
    ] as const) {
      await expect(service.get(id, principal)).rejects.toMatchObject({ code: 'TASK_NOT_FOUND' });
    }
  });

  it('answers a task that ended here a moment ago from its terminal event, with no read, for its principal only (§6.7)', async () => {
    const task = await service.start(input());
    const call = await service.start(input({ mode: 'call' }));
    for (const t of [task, call]) router.ended.set(t.taskId, { ...t, status: 'completed', lastUpdatedAt: 'later' });
    let reads = 0;
    const get = store.get.bind(store);
    store.get = (taskId: string) => {
      reads++;
      return get(taskId);
    };
    await expect(service.get(task.taskId, 'alice')).resolves.toMatchObject({
      status: 'completed',
      lastUpdatedAt: 'later',
    });
    expect(reads).toBe(0);
    // Not another principal's, not a plain call's: a copy that does not show it as the caller's task is read again,
    // and the read refuses it as before.
    await expect(service.get(task.taskId, 'bob')).rejects.toMatchObject({ code: 'TASK_NOT_FOUND' });
    await expect(service.get(call.taskId, 'alice')).rejects.toMatchObject({ code: 'TASK_NOT_FOUND' });
    expect(reads).toBe(2);
    reads = 0;
    // A call that became a task (§17.4) after its route was made: the copy still says call, so the store answers.
    const became = await service.start(input({ mode: 'call' }));
    store.tasks.set(became.taskId, { ...(store.tasks.get(became.taskId) as TaskRecord), mode: 'task' });
    router.ended.set(became.taskId, { ...became, status: 'completed' });
    await expect(service.get(became.taskId, 'alice')).resolves.toMatchObject({ taskId: became.taskId, mode: 'task' });
    expect(reads).toBe(1);
    reads = 0;
    // A replay links the original (§30.3): the copy held here is dropped, and the next tasks/get reads the link.
    await service.start(input({ replay: { of: task.taskId } }));
    expect(router.ended.has(task.taskId)).toBe(false);
    await service.get(task.taskId, 'alice');
    expect(reads).toBe(1);
  });

  it('polls (tasks/get) after a young task had its moment to end, and answers what it ended as, unread (§28.1)', async () => {
    const task = await service.start(input());
    let reads = 0;
    const get = store.get.bind(store);
    store.get = (taskId: string) => {
      reads++;
      return get(taskId);
    };
    router.whileSettling = (taskId) => router.ended.set(taskId, { ...task, status: 'completed' });
    await expect(service.poll(task.taskId, 'alice')).resolves.toMatchObject({ status: 'completed' });
    expect(reads).toBe(0);
    // The wait is only for the caller's own task: the predicate it gets refuses anyone else's.
    const { visible } = router.settles[0]!;
    expect(visible(task)).toBe(true);
    expect(visible({ ...task, principal: 'bob' })).toBe(false);
    expect(visible({ ...task, mode: 'call' })).toBe(false);
  });

  it('lists the principal’s tasks without its plain calls', async () => {
    const task = await service.start(input());
    await service.start(input({ mode: 'call' }));
    await service.start(input({ principal: 'bob' }));
    const page = await service.list('alice', undefined);
    expect(page.tasks.map((t) => t.taskId)).toEqual([task.taskId]);
  });
});

describe('TaskService.cancel', () => {
  it('stores cancelled before the worker is told, and answers with the cancelled task', async () => {
    const { taskId } = await service.start(input());
    const cancelled = await service.cancel(taskId, 'alice');
    expect(cancelled).toMatchObject({ taskId, status: 'cancelled', cancelReason: 'CLIENT_CANCELLED' });
    expect(store.log.slice(-2)).toEqual([`transition ${taskId} cancelled`, `tell worker ${taskId} (cancelled)`]);
    expect(dispatcher.cancels).toEqual([{ taskId, reason: 'CLIENT_CANCELLED' }]);
    expect(router.routes.has(taskId)).toBe(false);
  });

  it('tells the worker before it waits for another owner’s ack, so a waiting job is not taken meanwhile (§7.3)', async () => {
    const { taskId } = await service.start(input({ progressToken: 'p1' }));
    const stored = store.tasks.get(taskId);
    if (stored) stored.gatewayId = 'g2';
    router.ackLog = store.log;
    await service.cancel(taskId, 'alice');
    expect(store.log.slice(-3)).toEqual([
      `transition ${taskId} cancelled`,
      `tell worker ${taskId} (cancelled)`,
      `ack awaited ${taskId}`,
    ]);
  });

  it('refuses a terminal task, naming its status, and tells no worker', async () => {
    const { taskId } = await service.start(input());
    await store.transition(taskId, 'completed');
    await expect(service.cancel(taskId, 'alice')).rejects.toMatchObject({
      code: 'TASK_TERMINAL',
      message: 'Cannot cancel task in terminal status: completed',
    });
    expect(dispatcher.cancels).toEqual([]);
    expect(store.tasks.get(taskId)?.status).toBe('completed');
  });

  it('refuses another principal’s task as not found, and leaves it running', async () => {
    const { taskId } = await service.start(input());
    await expect(service.cancel(taskId, 'bob')).rejects.toMatchObject({ code: 'TASK_NOT_FOUND' });
    expect(store.tasks.get(taskId)?.status).toBe('working');
    expect(dispatcher.cancels).toEqual([]);
  });
});

describe('the run deadline', () => {
  const ELICIT = {
    method: 'elicitation/create' as const,
    params: { message: 'Go on?', requestedSchema: { type: 'object', properties: {} } },
  };

  it('is the same on both answer routes: the queue wait plus the tool’s own bound (not the gateway maximum)', async () => {
    // A tool bounded below the gateway's maximum: a resumed task gets its wait plus that bound, whichever route answers.
    catalogTool = { ...TOOL, timeoutMs: 20_000 };
    const suspended = async (): Promise<TaskRecord> => {
      const record = await service.start(input({ tool: catalogTool }));
      const waiting: TaskRecord = {
        ...record,
        status: 'input_required',
        inputRequests: { '1': ELICIT },
        pendingInputs: ['1'],
      };
      store.tasks.set(record.taskId, waiting);
      return waiting;
    };
    const viaResponse = await suspended();
    const before = Date.now();
    expect(await service.answerInput(viaResponse, '1', { action: 'accept', content: {} })).toBe('stored');
    const viaUpdate = await suspended();
    expect(await service.answer(viaUpdate.taskId, 'alice', { '1': { action: 'accept', content: {} } })).toEqual(['1']);
    const after = Date.now();
    for (const taskId of [viaResponse.taskId, viaUpdate.taskId]) {
      const deadline = store.answerDeadlines.get(`${taskId} 1`) ?? 0;
      expect(deadline).toBeGreaterThanOrEqual(before + CONFIG.queueTimeoutMs + 20_000);
      expect(deadline).toBeLessThanOrEqual(after + CONFIG.queueTimeoutMs + 20_000);
    }
    expect(runDeadlineAt(catalogTool, CONFIG, 1_000)).toBe(1_000 + CONFIG.queueTimeoutMs + 20_000);
    expect(runDeadlineAt(TOOL, CONFIG, 1_000)).toBe(1_000 + CONFIG.queueTimeoutMs + CONFIG.maxToolTimeoutMs);
  });
});

describe('TaskService.rejectTask (arguments refused before anything runs)', () => {
  it('stores the task failed and counts it created and finished, once each', async () => {
    const record = await service.rejectTask(input(), 'Invalid arguments for tool build_report: items: is required');
    expect(record.status).toBe('failed');
    const created = (await metrics.tasksCreated.get()).values;
    const finished = (await metrics.tasksFinished.get()).values;
    expect(created).toEqual([expect.objectContaining({ value: 1, labels: { tool: 'build_report', mode: 'task' } })]);
    expect(finished).toEqual([
      expect.objectContaining({ value: 1, labels: { tool: 'build_report', status: 'failed' } }),
    ]);
    expect(router.routes.has(record.taskId)).toBe(false);
  });
});

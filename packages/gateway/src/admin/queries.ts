/**
 * Read-only views of the fleet for operators: queues and their depth, live workers with their tools and heartbeats,
 * live tasks, one task's detail and timeline. Used by `/metrics` (at scrape time) and the `/admin` pages; none of it
 * is on a request's hot path. Every read is bounded. Task records are read through the task store (`TaskStore`),
 * never from their hashes here.
 */
import { Queue, type Job } from 'bullmq';
import {
  isShardCode,
  pipelineByShard,
  BatchStore,
  type RedisClient,
  WorkerCatalogSchema,
  parseMessage,
  readToolControls,
  catalogQueueName,
  toolQueue,
  type InputRequest,
  type Keys,
  type TaskStore,
  type TaskRecord,
  type WorkerCatalog,
} from '@taskrelay/shared';
import { rememberedPools, withWaitingReason, type ToolCatalog } from '../tasks/catalog.js';

/** BullMQ job states counted per queue. */
export const QUEUE_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed'] as const;
export type QueueState = (typeof QUEUE_STATES)[number];
/** The states of a job still to run or running: a queue holding one is shown, live worker or not. */
const UNFINISHED_STATES = QUEUE_STATES.filter((state) => state !== 'failed');

/** One tool queue as the operator pages and `/metrics` show it. */
export interface QueueView {
  queue: string;
  counts: Record<QueueState, number>;
  /** Live workers consuming it: 0 for a queue whose last worker left with jobs still in it. */
  workers: number;
}

/** Live tasks read at most per call: the live set can be large, a page must not be. */
export const MAX_LIVE_TASKS = 1_000;

export interface WorkerView extends WorkerCatalog {
  /** When the worker's heartbeat lapses (ms since epoch); past it the worker is no longer listed. */
  expiresAt: number;
}

/**
 * A pool (PROTOCOL.md §3.2, §24) as the operator pages show it: its name is its `TASKRELAY_QUEUE` and a digest of its
 * tools at their versions, so the tools and versions are shown beside it.
 */
export interface PoolView {
  pool: string;
  queueName: string;
  tools: Array<{ name: string; version?: string }>;
  /** Live workers of the pool: 0 for a pool remembered after its last worker left. */
  workers: number;
  /** The newest heartbeat of any of its workers (ms since epoch). */
  lastSeenAt: number;
}

export interface TimelineEntry {
  at: string;
  event: string;
  detail?: string;
}

export interface TaskDetail {
  task: TaskRecord;
  /** What the task asked and waits to be answered (`pendingQuestions`), while it is `input_required`. */
  questions: string[];
  /**
   * What BullMQ still knows of the task's job. `attempt` of `attempts` counts the job's tries as the tool's retries do
   * (a failed run that is retried is the next attempt); `attemptsMade` is BullMQ's count of tries ended. Neither counts
   * runs: the task's `attempt` field does (a resume, a back-off, a hand-back or a batch parent's next window is a new
   * run, not a new attempt).
   */
  job?: {
    state: string;
    attempt: number;
    attempts: number;
    attemptsMade: number;
    failedReason?: string;
    workerName?: string;
  };
  /** Its children's counts, when the task is a batch parent (PROTOCOL.md §26.9). */
  batch?: BatchView;
  timeline: TimelineEntry[];
}

/** A batch's children as the dashboard shows them (PROTOCOL.md §26.9). */
/** One tool as the operator pages show it (PROTOCOL.md §3.3): its queues, their controls and their depth. */
export interface ToolView {
  name: string;
  queues: string[];
  /** Every queue of the tool paused. */
  paused: boolean;
  concurrency?: number;
  rateLimit?: { max: number; perMs: number };
  /** Runs active now, over its queues. */
  active: number;
  /** Jobs queued (waiting or prioritized, a pause holds them there), over its queues. */
  waiting: number;
  /** A live worker serves it (else it is listed from a retained pool, §24). */
  live: boolean;
}

export interface BatchView {
  taskId: string;
  childTool: string;
  total: number;
  queued: number;
  running: number;
  done: number;
  failed: number;
}

export class AdminQueries {
  private readonly queues = new Map<string, Queue>();

  /**
   * @param connection a connection BullMQ may use (the gateway's queue connection); the caller closes it.
   * @param catalog why an unstarted task waits, as `tasks/get` says it (`withWaitingReason`, PROTOCOL.md §3.2).
   */
  constructor(
    private readonly redis: RedisClient,
    private readonly connection: RedisClient,
    private readonly keys: Keys,
    private readonly store: Pick<TaskStore, 'records' | 'placement' | 'runner'>,
    private readonly catalog: Pick<ToolCatalog, 'unservedReason' | 'orphanedReason'>,
  ) {}

  /** Live workers, newest heartbeat first. */
  async workers(now = Date.now()): Promise<WorkerView[]> {
    const rows = await this.redis.zrangebyscore(this.keys.workers, now, '+inf', 'WITHSCORES');
    const ids: string[] = [];
    const expiry = new Map<string, number>();
    for (let i = 0; i + 1 < rows.length; i += 2) {
      ids.push(rows[i]!);
      expiry.set(rows[i]!, Number(rows[i + 1]));
    }
    if (ids.length === 0) return [];
    const raws = await this.redis.mget(ids.map((id) => this.keys.workerCatalog(id)));
    return raws
      .map((raw) => (raw ? parseMessage(WorkerCatalogSchema, raw) : undefined))
      .filter((c) => c !== undefined)
      .map((c) => ({ ...c, expiresAt: expiry.get(c.workerId) ?? 0 }))
      .sort((a, b) => b.heartbeatAt - a.heartbeatAt);
  }

  /** Every pool with a live worker or remembered (§24, until retired or past the catalog retention), by name. */
  async pools(): Promise<PoolView[]> {
    const [workers, remembered] = await Promise.all([this.workers(), rememberedPools(this.redis, this.keys)]);
    const views = new Map<string, PoolView>();
    const served = (tools: WorkerCatalog['tools']) =>
      tools.map(({ name, version }) => (version === undefined ? { name } : { name, version }));
    for (const worker of workers) {
      const view = views.get(worker.queue);
      if (view) {
        view.workers += 1;
        view.lastSeenAt = Math.max(view.lastSeenAt, worker.heartbeatAt);
      } else {
        const queueName = catalogQueueName(worker);
        const tools = served(worker.tools);
        views.set(worker.queue, { pool: worker.queue, queueName, tools, workers: 1, lastSeenAt: worker.heartbeatAt });
      }
    }
    for (const pool of remembered) {
      if (views.has(pool.pool)) continue;
      const { queueName, lastSeenAt } = pool;
      views.set(pool.pool, { pool: pool.pool, queueName, tools: served(pool.tools), workers: 0, lastSeenAt });
    }
    return [...views.values()].sort((a, b) => a.pool.localeCompare(b.pool));
  }

  /** The names of the queues `queueDepths` shows. */
  async queueNames(): Promise<string[]> {
    return (await this.queueDepths()).map((view) => view.queue);
  }

  /**
   * Every tool live workers serve, and every tool of a retained pool (§24), with its queues' controls and depth
   * (PROTOCOL.md §3.3), by name.
   */
  async tools(): Promise<ToolView[]> {
    const byName = new Map<
      string,
      { queues: Set<string>; live: boolean; descriptor?: WorkerCatalog['tools'][number] }
    >();
    const add = (name: string, queue: string, live: boolean, descriptor?: WorkerCatalog['tools'][number]) => {
      const entry = byName.get(name) ?? { queues: new Set<string>(), live: false };
      entry.queues.add(queue);
      entry.live ||= live;
      entry.descriptor ??= descriptor;
      byName.set(name, entry);
    };
    for (const worker of await this.workers()) {
      for (const tool of worker.tools) add(tool.name, toolQueue(catalogQueueName(worker), tool.name), true, tool);
    }
    for (const pool of await rememberedPools(this.redis, this.keys)) {
      for (const tool of pool.tools) add(tool.name, toolQueue(pool.queueName, tool.name), false, tool);
    }
    const names = [...byName.keys()].sort();
    const queues = names.flatMap((name) => [...(byName.get(name)?.queues ?? [])]);
    const [controls, counts] = await Promise.all([
      readToolControls(this.redis, this.keys, queues, await this.store.placement?.placedMany(queues)),
      Promise.all(
        queues.map(async (q) => {
          // Every shard's of the queue in the sharded layout (PROTOCOL.md §1.1), summed: the tool's depth.
          const shards = await Promise.all(
            (await this.shown(q)).map((s) => this.queue(s).getJobCounts('waiting', 'prioritized')),
          );
          const sum: Record<string, number> = {};
          for (const counts of shards)
            for (const [state, n] of Object.entries(counts)) sum[state] = (sum[state] ?? 0) + n;
          return sum;
        }),
      ),
    ]);
    const at = new Map(queues.map((q, i) => [q, { controls: controls[i], counts: counts[i] }]));
    return names.map((name) => {
      const entry = byName.get(name)!;
      const mine = [...entry.queues].map((q) => at.get(q));
      const view: ToolView = {
        name,
        queues: [...entry.queues],
        paused: mine.length > 0 && mine.every((m) => m?.controls?.paused === true),
        active: mine.reduce((n, m) => n + (m?.controls?.active ?? 0), 0),
        waiting: mine.reduce(
          (n, m) => n + Object.values(m?.counts ?? {}).reduce((a: number, b: number) => a + b, 0),
          0,
        ),
        live: entry.live,
      };
      const limits = mine.find((m) => m?.controls)?.controls;
      const concurrency = limits?.concurrency ?? entry.descriptor?.concurrency;
      const rateLimit = limits?.rateLimit ?? entry.descriptor?.rateLimit;
      if (concurrency !== undefined) view.concurrency = concurrency;
      if (rateLimit !== undefined) view.rateLimit = rateLimit;
      return view;
    });
  }

  /**
   * Pauses or resumes every queue of a tool with BullMQ's own `pause`/`resume` (PROTOCOL.md §3.3): kept in Redis, so
   * it survives restarts. Calls are still accepted and queued; runs already started go on. Undefined for a tool no
   * live worker serves and no retained pool lists.
   */
  async setPaused(name: string, paused: boolean): Promise<ToolView | undefined> {
    const tool = (await this.tools()).find((t) => t.name === name);
    if (!tool) return undefined;
    const shown = (await Promise.all(tool.queues.map((q) => this.shown(q)))).flat();
    await Promise.all(shown.map((q) => (paused ? this.queue(q).pause() : this.queue(q).resume())));
    return (await this.tools()).find((t) => t.name === name);
  }

  /**
   * BullMQ's `Queue` for a pool, made once (bull-board shows these); `<queue>@<code>` names one shard of it in the
   * sharded layout (PROTOCOL.md §1.1), under that shard's BullMQ prefix.
   */
  queue(name: string): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      const at = name.lastIndexOf('@');
      const code = at > 0 ? name.slice(at + 1) : '';
      const keys = isShardCode(code) ? this.keys.forShard(code) : this.keys;
      const bullName = isShardCode(code) ? name.slice(0, at) : name;
      queue = new Queue(keys.queueName(bullName), { connection: this.connection, prefix: keys.bullPrefix });
      this.queues.set(name, queue);
    }
    return queue;
  }

  /** The names `queue` takes for a tool queue: itself, or in the sharded layout one `<queue>@<code>` per shard. */
  private async shown(queue: string): Promise<string[]> {
    const placement = this.store.placement;
    if (placement === undefined) return [queue];
    const codes = await placement.placed(queue);
    return codes.length > 0 ? codes.map((code) => `${queue}@${code}`) : [queue];
  }

  /**
   * The tool queues to show (PROTOCOL.md §3.2), by name, with their job counts and live workers: every queue a live
   * worker consumes, and every queue of a remembered pool (§24) while a job is in it unfinished. So a queue whose last
   * worker left with work in it is still shown, with 0 workers, until it is empty or its pool is forgotten (retired,
   * or past the catalog retention).
   */
  async queueDepths(): Promise<QueueView[]> {
    const [workers, pools] = await Promise.all([this.workers(), rememberedPools(this.redis, this.keys)]);
    const consumers = new Map<string, number>();
    for (const worker of workers) {
      for (const tool of worker.tools) {
        const queue = toolQueue(catalogQueueName(worker), tool.name);
        consumers.set(queue, (consumers.get(queue) ?? 0) + 1);
      }
    }
    const remembered = pools.flatMap((pool) => pool.tools.map((tool) => toolQueue(pool.queueName, tool.name)));
    const names = [...new Set([...consumers.keys(), ...remembered])].sort();
    // One row per shard in the sharded layout, `<queue>@<code>`, each consumed by every worker of the tool.
    const rows = (
      await Promise.all(names.map(async (queue) => (await this.shown(queue)).map((s) => [queue, s])))
    ).flat();
    const views = await Promise.all(
      rows.map(async ([queue = '', shown = '']) => ({
        queue: shown,
        counts: (await this.queue(shown).getJobCounts(...QUEUE_STATES)) as Record<QueueState, number>,
        workers: consumers.get(queue) ?? 0,
      })),
    );
    return views.filter((view) => view.workers > 0 || UNFINISHED_STATES.some((state) => view.counts[state] > 0));
  }

  /** Non-terminal tasks (the live set), oldest first, at most `limit`. */
  async liveTasks(limit = MAX_LIVE_TASKS): Promise<TaskRecord[]> {
    return this.records(await this.store.records.liveIds(Math.min(limit, MAX_LIVE_TASKS)));
  }

  /** Task records by id without their results, skipping expired ones, oldest first, each as `tasks/get` shows it. */
  async records(ids: readonly string[]): Promise<TaskRecord[]> {
    const records = await this.store.records.summaries(ids);
    const shown = await Promise.all(records.map((record) => withWaitingReason(record, this.catalog)));
    return shown.sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  /** Live task counts by tool and status, for `/metrics` (two fields per task, not the whole hash). */
  liveCounts(): Promise<Array<{ tool: string; status: string; count: number }>> {
    return this.store.records.liveCounts(MAX_LIVE_TASKS);
  }

  /** One task, whole, with what BullMQ still knows of its job, and a timeline put together from both. */
  async task(taskId: string): Promise<TaskDetail | undefined> {
    const stored = await this.store.records.get(taskId);
    if (!stored) return undefined;
    const task = await withWaitingReason(stored, this.catalog);
    const code = this.keys.shardOf(taskId);
    const job: Job | undefined = await this.queue(code === undefined ? task.queue : `${task.queue}@${code}`)
      .getJob(taskId)
      .catch(() => undefined);
    const timeline: TimelineEntry[] = [
      { at: task.createdAt, event: 'created', detail: `${task.mode} by ${task.principal}` },
    ];
    const detail: TaskDetail = { task, questions: pendingQuestions(task), timeline };
    const [batch] = await this.batches([taskId]);
    if (batch) detail.batch = batch;
    if (job) {
      const state = await job.getState().catch(() => 'unknown');
      // BullMQ counts a try when it ends (completed, failed, or failed and retried), not when it starts.
      const ended = state === 'completed' || state === 'failed';
      detail.job = {
        state,
        attempt: Math.max(1, ended ? job.attemptsMade : job.attemptsMade + 1),
        attempts: job.opts.attempts ?? 1,
        attemptsMade: job.attemptsMade,
      };
      if (job.failedReason) detail.job.failedReason = job.failedReason;
      if (job.processedBy) detail.job.workerName = job.processedBy;
      // The job is added in the task's own create script, its timestamp taken a moment before the task's: never
      // shown ahead of the creation it belongs to.
      const queuedAt = iso(job.timestamp);
      timeline.push({
        at: queuedAt < task.createdAt ? task.createdAt : queuedAt,
        event: 'queued',
        detail: `queue ${task.queue}`,
      });
      if (job.processedOn) {
        timeline.push({
          at: iso(job.processedOn),
          event: 'started',
          detail: `run ${task.attempt ?? 1}${job.processedBy ? ` on ${job.processedBy}` : ''}`,
        });
      }
      if (job.finishedOn) timeline.push({ at: iso(job.finishedOn), event: `job ${state}` });
    } else if (task.attempt !== undefined) {
      timeline.push({ at: task.createdAt, event: 'started', detail: `${task.attempt} run(s)` });
    }
    if (task.progress !== undefined) {
      const of = task.total === undefined ? '' : `/${task.total}`;
      timeline.push({
        at: task.lastUpdatedAt,
        event: 'progress',
        detail: `${task.progress}${of}${task.progressMessage ? ` ${task.progressMessage}` : ''}`,
      });
    }
    if (['completed', 'failed', 'cancelled'].includes(task.status)) {
      const why = task.error?.message ?? task.cancelReason ?? task.statusMessage;
      timeline.push({ at: task.lastUpdatedAt, event: task.status, ...(why ? { detail: why } : {}) });
    }
    timeline.sort((a, b) => a.at.localeCompare(b.at));
    return detail;
  }

  /** The batches among these tasks, with their children's counts (queued = open − running). */
  async batches(taskIds: readonly string[]): Promise<BatchView[]> {
    if (taskIds.length === 0) return [];
    const exists = await pipelineByShard(this.redis, this.keys, taskIds, (pipeline, id) =>
      pipeline.exists(this.keys.forTask(id).batch(id).hash),
    );
    const ids = taskIds.filter((_id, i) => exists[i]?.[1] === 1);
    const store = new BatchStore(this.store.runner);
    const views = await Promise.all(
      ids.map(async (taskId): Promise<BatchView | undefined> => {
        const [counts, shape, running] = await Promise.all([
          store.peek(taskId),
          store.shape(taskId),
          store.runningCount(taskId),
        ]);
        if (!counts || !shape) return undefined;
        return {
          taskId,
          childTool: shape.childTool,
          total: counts.size,
          queued: Math.max(0, counts.open - running),
          running: Math.min(running, counts.open),
          done: counts.completed,
          failed: counts.failed,
        };
      }),
    );
    return views.filter((view): view is BatchView => view !== undefined);
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.queues.values()].map((q) => q.close()));
  }
}

/**
 * The questions a task waits to be answered (PROTOCOL.md §12.2), one line each, as an operator reads them: an
 * elicitation's message, a sampling request's last message, a request for the client's roots.
 */
export function pendingQuestions(task: Pick<TaskRecord, 'pendingInputs' | 'inputRequests'>): string[] {
  return (task.pendingInputs ?? []).flatMap((n) => {
    const request = task.inputRequests?.[n];
    return request ? [questionOf(request)] : [];
  });
}

function questionOf(request: InputRequest): string {
  switch (request.method) {
    case 'elicitation/create': {
      const message = request.params['message'];
      return typeof message === 'string' ? message : 'a form to fill (elicitation/create)';
    }
    case 'sampling/createMessage': {
      const messages = request.params['messages'];
      const last: unknown = Array.isArray(messages) ? messages.at(-1) : undefined;
      const content = (last as { content?: unknown } | undefined)?.content;
      const text = [content]
        .flat()
        .map((part) => (part as { text?: unknown } | undefined)?.text)
        .find((t) => typeof t === 'string');
      return `the client's model: ${text ?? '(no text)'}`;
    }
    case 'roots/list':
      return "the client's roots (roots/list)";
  }
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

/**
 * Read-only views of the fleet for operators: queues and their depth, live workers with their tools and heartbeats,
 * live tasks, one task's detail and timeline. Used by `/metrics` (at scrape time) and the `/admin` pages; none of it
 * is on a request's hot path. Every read is bounded.
 */
import { Queue, type Job } from 'bullmq';
import {
  BatchStore,
  type RedisClient,
  WorkerCatalogSchema,
  parseMessage,
  catalogQueueName,
  toolQueue,
  parseRecord,
  type Keys,
  type TaskRecord,
  type WorkerCatalog,
} from '@taskrelay/shared';

/** BullMQ job states counted per queue. */
export const QUEUE_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed'] as const;
export type QueueState = (typeof QUEUE_STATES)[number];

/** Live tasks read at most per call: the live set can be large, a page must not be. */
export const MAX_LIVE_TASKS = 1_000;

export interface WorkerView extends WorkerCatalog {
  /** When the worker's heartbeat lapses (ms since epoch); past it the worker is no longer listed. */
  expiresAt: number;
}

export interface TimelineEntry {
  at: string;
  event: string;
  detail?: string;
}

export interface TaskDetail {
  task: TaskRecord;
  job?: { state: string; attemptsMade: number; failedReason?: string; workerName?: string };
  timeline: TimelineEntry[];
}

/** A batch's children as the dashboard shows them (PROTOCOL.md §26.9). */
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

  /** @param connection a connection BullMQ may use (the gateway's queue connection); the caller closes it. */
  constructor(
    private readonly redis: RedisClient,
    private readonly connection: RedisClient,
    private readonly keys: Keys,
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

  /** The queues to show: the tool queues live workers consume (one per tool and TASKRELAY_QUEUE, PROTOCOL.md §3.2). */
  async queueNames(): Promise<string[]> {
    const names = new Set<string>();
    for (const worker of await this.workers()) {
      for (const tool of worker.tools) names.add(toolQueue(catalogQueueName(worker), tool.name));
    }
    return [...names].sort();
  }

  /** BullMQ's `Queue` for a pool, made once (bull-board shows these). */
  queue(name: string): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(this.keys.queueName(name), { connection: this.connection, prefix: this.keys.bullPrefix });
      this.queues.set(name, queue);
    }
    return queue;
  }

  async queueDepths(): Promise<Array<{ queue: string; counts: Record<QueueState, number> }>> {
    const names = await this.queueNames();
    return Promise.all(
      names.map(async (name) => ({
        queue: name,
        counts: (await this.queue(name).getJobCounts(...QUEUE_STATES)) as Record<QueueState, number>,
      })),
    );
  }

  /** Non-terminal tasks (the live set), oldest first, at most `limit`. */
  async liveTasks(limit = MAX_LIVE_TASKS): Promise<TaskRecord[]> {
    const ids = await this.redis.zrange(this.keys.live, 0, Math.min(limit, MAX_LIVE_TASKS) - 1);
    return this.records(ids);
  }

  /** Task records by id, skipping expired ones, in the order given. */
  async records(ids: readonly string[]): Promise<TaskRecord[]> {
    if (ids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hgetall(this.keys.task(id));
    const replies = (await pipeline.exec()) ?? [];
    return replies
      .map(([, value]) => parseRecord(value as Record<string, string>))
      .filter((r) => r !== undefined)
      .sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  /** Live task counts by tool and status, for `/metrics` (two fields per task, not the whole hash). */
  async liveCounts(): Promise<Map<string, { tool: string; status: string; count: number }>> {
    const ids = await this.redis.zrange(this.keys.live, 0, MAX_LIVE_TASKS - 1);
    const counts = new Map<string, { tool: string; status: string; count: number }>();
    if (ids.length === 0) return counts;
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hmget(this.keys.task(id), 'tool', 'status');
    for (const [, value] of (await pipeline.exec()) ?? []) {
      const [tool, status] = (value ?? []) as Array<string | null>;
      if (!tool || !status) continue;
      const key = `${tool}\u0000${status}`;
      const entry = counts.get(key) ?? { tool, status, count: 0 };
      entry.count++;
      counts.set(key, entry);
    }
    return counts;
  }

  /** One task with what BullMQ still knows of its job, and a timeline put together from both. */
  async task(taskId: string): Promise<TaskDetail | undefined> {
    const [task] = await this.records([taskId]);
    if (!task) return undefined;
    const job: Job | undefined = await this.queue(task.queue)
      .getJob(taskId)
      .catch(() => undefined);
    const timeline: TimelineEntry[] = [
      { at: task.createdAt, event: 'created', detail: `${task.mode} by ${task.principal}` },
    ];
    const detail: TaskDetail = { task, timeline };
    if (job) {
      const state = await job.getState().catch(() => 'unknown');
      detail.job = { state, attemptsMade: job.attemptsMade };
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
          detail: `attempt ${task.attempt ?? job.attemptsMade + 1}${job.processedBy ? ` on ${job.processedBy}` : ''}`,
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
    const pipeline = this.redis.pipeline();
    for (const id of taskIds) pipeline.exists(this.keys.batch(id).hash);
    const exists = (await pipeline.exec()) ?? [];
    const ids = taskIds.filter((_id, i) => exists[i]?.[1] === 1);
    const store = new BatchStore(this.redis, this.keys);
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

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

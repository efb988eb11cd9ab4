/**
 * The parent's side of a batch (PROTOCOL.md §26): `ctx.fanOut` stores the batch once, releases children a window at a
 * time as BullMQ jobs in the child tool's pool (with the parent's principal's fair-share priority, §25), and answers
 * `wait` (the run suspends) until every child is recorded or fail-fast trips. Every run of the parent is a replay: it
 * reads the batch from Redis and goes on from there, on whichever worker it runs.
 */
import {
  type BatchStore,
  MAX_FAIR_PRIORITY,
  TaskrelayError,
  WorkerCatalogSchema,
  batchChildId,
  parseMessage,
  type BatchCounts,
  type BatchOutcome,
  type CancelRequest,
  type Keys,
  type RedisClient,
  type ToolDescriptor,
} from '@taskrelay/shared';
import type { ChildOutcome, FanOutHost, FanOutOptions, FanOutResult } from '../context.js';
import type { ToolDefinition } from '../define-tool.js';
import { CancelledError } from '../errors.js';
import type { WorkerMetrics } from '../metrics.js';
import type { BatchQueues } from './batch-queues.js';

/** Outcomes listed inline in `FanOutResult.outcomes`; the rest are read with `ctx.batchOutcomes`. */
export const MAX_FANOUT_OUTCOMES = 1_000;
/** The safety net of a waiting parent: it runs again after this even if no child promotes it (§26.4). */
export const BATCH_POLL_MS = 30_000;
/** How long a batch's keys live before its parent ends (renewed to the parent's ttl when it does). */
const BATCH_TTL_MS = 7 * 86_400_000;
/** A fair-share entry of a child outlives its possible wait by this much (as the gateway's, §25). */
const FAIR_SHARE_TTL_MS = 3_600_000 + 60_000;

/** The descriptor fields a child job takes from its tool. */
type ChildToolInfo = Pick<ToolDescriptor, 'name' | 'timeoutMs' | 'attempts' | 'backoff'>;

export interface BatchParentOptions {
  redis: RedisClient;
  keys: Keys;
  store: BatchStore;
  queues: BatchQueues;
  /** This worker's pool and tools: a child tool served here runs in this pool. */
  ownPool: string;
  tools: ReadonlyMap<string, ToolDefinition>;
  metrics: WorkerMetrics;
}

/**
 * How many children may be in flight for this release (§26.6): the tool's concurrency, less what the principal's
 * open-work cap leaves once its other unfinished work is counted, but never below 1 (the batch always moves on).
 */
export function releaseWindow(concurrency: number, maxOpen: number | undefined, otherOpenWork: number): number {
  if (maxOpen === undefined) return concurrency;
  return Math.max(1, Math.min(concurrency, maxOpen - otherOpenWork));
}

/**
 * The fair-share priorities of `count` jobs entering a principal's share together (§25's rule, applied to each in
 * turn): one more than the jobs waiting before it, never below the newest waiting job's priority.
 */
export function childPriorities(waiting: number, newest: number | undefined, count: number): number[] {
  return Array.from({ length: count }, (_v, i) =>
    Math.min(MAX_FAIR_PRIORITY, Math.max(waiting + 1 + i, waiting + i === 0 ? 1 : (newest ?? 1))),
  );
}

/** The result a finished (or fail-fast stopped) batch gives its parent. */
export function fanOutResult(counts: BatchCounts, listed: ReadonlyArray<BatchOutcome | undefined>): FanOutResult {
  const outcomes = listed.map((outcome, index) => childOutcome(index, outcome));
  return {
    total: counts.size,
    completed: counts.completed,
    failed: counts.failed,
    cancelled: Math.max(0, counts.size - counts.completed - counts.failed),
    outcomes,
    truncated: counts.size > outcomes.length,
    outcomesOmitted: Math.max(0, counts.size - outcomes.length),
  };
}

function childOutcome(index: number, outcome: BatchOutcome | undefined): ChildOutcome {
  if (!outcome) return { index, status: 'cancelled' };
  const entry: ChildOutcome = { index, status: outcome.status };
  if (outcome.result !== undefined) entry.result = outcome.result;
  if (outcome.error !== undefined) entry.error = { code: outcome.error.code, message: outcome.error.message };
  if (outcome.resultOmitted) entry.resultOmitted = true;
  return entry;
}

export class BatchParent {
  constructor(private readonly o: BatchParentOptions) {}

  /** The host of one parent run: `maxOpen` is its principal's open-work cap, from its job (§26.6). */
  forRun(maxOpen: number | undefined): FanOutHost {
    return {
      fanOut: (run, items, options) => this.fanOut(run, items, options, maxOpen),
      outcomes: async (taskId, from, count) => {
        const listed = await this.o.store.outcomes(taskId, from, count);
        return listed.map((outcome, i) => childOutcome(from + i, outcome));
      },
    };
  }

  private async fanOut(
    run: Parameters<FanOutHost['fanOut']>[0],
    items: ReadonlyArray<Record<string, unknown>>,
    options: Required<FanOutOptions>,
    maxOpen: number | undefined,
  ): ReturnType<FanOutHost['fanOut']> {
    const { store } = this.o;
    const { taskId, lock, record, log } = run;
    let shape = await store.shape(taskId);
    if (!shape) {
      const child = await this.childTool(options.tool);
      const created = await store.create(
        taskId,
        lock,
        {
          childTool: options.tool,
          childPool: child.pool,
          parentPool: lock.queue,
          concurrency: options.concurrency,
          failFast: options.failFast,
          owner: record?.principal ?? '',
        },
        items.map((item) => JSON.stringify(item)),
        BATCH_TTL_MS,
      );
      if (created === 'lock_lost') throw new CancelledError('LOCK_LOST');
      if (created === 'gone') throw new CancelledError('CLIENT_CANCELLED');
      if (created === 'created') log.info({ children: items.length, childTool: options.tool }, 'batch created');
      shape = await store.shape(taskId);
      if (!shape) throw new CancelledError('CLIENT_CANCELLED');
    }
    if (shape.childTool !== options.tool || (await store.peek(taskId))?.size !== items.length) {
      throw new TaskrelayError(
        'INTERNAL',
        `ctx.fanOut: this task's batch has other children (${shape.childTool}); call fanOut once per task, with the same items on every run`,
      );
    }
    const counts = await store.peek(taskId);
    if (!counts) throw new CancelledError('CLIENT_CANCELLED');
    const done = counts.completed + counts.failed;
    const ttlMs = (record?.ttl ?? 3_600_000) + 60_000;

    if (done >= counts.size || (shape.failFast && counts.failed > 0)) {
      if (done < counts.size) {
        log.info({ failed: counts.failed, done, size: counts.size }, 'batch failed fast; stopping the rest');
        await this.stopChildren(taskId);
      }
      const final = (await store.peek(taskId)) ?? counts;
      const listed = await store.outcomes(taskId, 0, Math.min(final.size, MAX_FANOUT_OUTCOMES));
      await store.expire(taskId, ttlMs);
      log.info({ completed: final.completed, failed: final.failed, size: final.size }, 'batch done');
      return { kind: 'done', result: fanOutResult(final, listed) };
    }

    // A run that sees no child finished since the last one re-adds the open children's jobs: an add of a job that
    // exists is a no-op, and one that vanished (evicted, say) comes back (its start check refuses it if recorded).
    if (done === shape.seenDone && counts.open > 0) {
      const indices = await store.openIndices(taskId);
      log.info({ open: indices.length }, 'batch made no progress since the last run; re-adding open children');
      await this.addChildren(taskId, shape, indices, maxOpen);
    }

    const openWorkKey = maxOpen === undefined ? undefined : this.o.keys.principalOpenTasks(shape.owner);
    let window = options.concurrency;
    if (openWorkKey !== undefined) {
      window = releaseWindow(options.concurrency, maxOpen, await this.otherOpenWork(openWorkKey, counts.open, maxOpen));
    }
    const count = Math.max(0, Math.min(window - counts.open, counts.size - counts.released));
    if (count > 0) {
      await store.open(taskId, counts.released, count, window, openWorkKey);
      const indices = Array.from({ length: count }, (_v, i) => counts.released + i);
      await this.addChildren(taskId, shape, indices, maxOpen);
      this.o.metrics.batchChildrenReleased.inc({ tool: shape.childTool }, count);
      log.debug({ from: counts.released, count, window }, 'batch children released');
    }
    await store.released(taskId, counts.released + count, done);
    return { kind: 'wait', pollMs: BATCH_POLL_MS };
  }

  /**
   * The principal's unfinished work other than this batch's open children (§26.6). Counted exactly (ended ids pruned,
   * as the gateway's cap does) only when the raw count says the cap might bind.
   */
  private async otherOpenWork(key: string, ownOpen: number, maxOpen: number | undefined): Promise<number> {
    const { redis, store } = this.o;
    const raw = (await redis.zcard(key)) - ownOpen;
    if (maxOpen === undefined || raw < maxOpen) return raw;
    const ids = await redis.zrange(key, 0, -1);
    const ended = await store.endedWork(ids);
    const gone = ids.filter((_id, i) => ended[i] === true);
    if (gone.length > 0) await redis.zrem(key, ...gone);
    return ids.length - gone.length - ownOpen;
  }

  /** Adds the children's jobs, in their principal's fair share of the child pool (§25). */
  private async addChildren(
    taskId: string,
    shape: { childTool: string; childPool: string; owner: string },
    indices: readonly number[],
    maxOpen: number | undefined,
  ): Promise<void> {
    if (indices.length === 0) return;
    const { redis, keys, store, queues } = this.o;
    const first = indices[0] ?? 0;
    const last = indices[indices.length - 1] ?? first;
    const texts = await store.items(taskId, first, last + 1);
    const tool = await this.childToolInPool(shape.childTool, shape.childPool);
    const shareKey = keys.fairShare(shape.childPool, shape.owner);
    const [[, waiting], [, newest]] = (await redis
      .pipeline()
      .zcard(shareKey)
      .zrange(shareKey, -1, -1, 'WITHSCORES')
      .exec()) as [[unknown, number], [unknown, string[]]];
    const priorities = childPriorities(
      waiting,
      newest[1] === undefined ? undefined : Number(newest[1]),
      indices.length,
    );
    const ids = indices.map((index) => batchChildId(taskId, index));
    const share = redis.multi();
    ids.forEach((id, i) => share.zadd(shareKey, priorities[i] ?? 1, id));
    // The entry exists before any worker can take the job, as the gateway's (Redis runs one connection's commands in
    // order, and the Queue shares this connection).
    const entered = share.pexpire(shareKey, FAIR_SHARE_TTL_MS).exec();
    const jobs = indices.map((index, i) => ({
      name: shape.childTool,
      data: {
        taskId,
        child: index,
        tool: shape.childTool,
        arguments: JSON.parse(texts[index - first] ?? '{}') as Record<string, unknown>,
        principal: shape.owner,
        ...(tool.timeoutMs === undefined ? {} : { timeoutMs: tool.timeoutMs }),
        ...(maxOpen === undefined ? {} : { maxOpen }),
      },
      opts: {
        jobId: ids[i] as string,
        priority: priorities[i] ?? 1,
        attempts: tool.attempts ?? 1,
        ...(tool.backoff === undefined
          ? {}
          : { backoff: { type: tool.backoff.type, delay: tool.backoff.delayMs, jitter: tool.backoff.jitter ?? 0 } }),
        removeOnComplete: true,
        removeOnFail: { age: 3600, count: 1_000 },
      },
    }));
    await Promise.all([entered, queues.get(shape.childPool).addBulk(jobs)]);
  }

  /**
   * Stops a batch (fail-fast, or its parent cancelled, §26.5, §26.7): no child starts any more, queued children are
   * removed, running ones are aborted through the cancel channel (each child's job id, as any job's cancel).
   */
  async stopChildren(taskId: string): Promise<void> {
    const { store, queues, redis, keys } = this.o;
    const shape = await store.shape(taskId);
    if (!shape) return;
    await store.stop(taskId);
    const indices = await store.openIndices(taskId);
    const queue = queues.get(shape.childPool);
    const pipeline = redis.pipeline();
    for (const index of indices) {
      const id = batchChildId(taskId, index);
      await queue.remove(id).catch(() => 0);
      pipeline.zrem(keys.fairShare(shape.childPool, shape.owner), id);
      pipeline.zrem(keys.principalOpenTasks(shape.owner), id);
      const cancel: CancelRequest = { taskId: id, reason: 'CLIENT_CANCELLED' };
      pipeline.publish(keys.cancelChannel, JSON.stringify(cancel));
    }
    await pipeline.exec();
  }

  /** After the parent's job is delayed: are the children done already (§26.4)? Then it must promote itself. */
  async shouldWake(taskId: string): Promise<boolean> {
    return (await this.o.store.peek(taskId))?.wake === true;
  }

  /** The pool a new batch's children go to: this worker's when it serves the tool, else a live worker's that does. */
  private async childTool(name: string): Promise<{ pool: string; tool: ChildToolInfo }> {
    const local = this.o.tools.get(name);
    if (local) return { pool: this.o.ownPool, tool: local.descriptor };
    const serving = (await this.catalogs()).filter((c) => c.tools.some((t) => t.name === name));
    const pick = serving[Math.floor(Math.random() * serving.length)];
    const tool = pick?.tools.find((t) => t.name === name);
    if (!pick || !tool) {
      throw new TaskrelayError('TOOL_NOT_FOUND', `ctx.fanOut: no live worker serves tool ${name}`);
    }
    return { pool: pick.queue, tool };
  }

  /** The child tool's attempts, backoff and timeout as its pool serves it (the parent may run elsewhere now). */
  private async childToolInPool(name: string, pool: string): Promise<ChildToolInfo> {
    const local = this.o.tools.get(name);
    if (local && pool === this.o.ownPool) return local.descriptor;
    const catalog = (await this.catalogs()).find((c) => c.queue === pool);
    return catalog?.tools.find((t) => t.name === name) ?? { name };
  }

  private async catalogs() {
    const { redis, keys } = this.o;
    const ids = await redis.zrangebyscore(keys.workers, Date.now(), '+inf');
    if (ids.length === 0) return [];
    const raw = await redis.mget(...ids.map((id) => keys.workerCatalog(id)));
    return raw.flatMap((text) => {
      const catalog = text === null ? undefined : parseMessage(WorkerCatalogSchema, text);
      return catalog ? [catalog] : [];
    });
  }
}

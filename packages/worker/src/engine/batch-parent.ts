/**
 * The parent's side of a batch (PROTOCOL.md §26): `ctx.fanOut` stores the batch once, releases children a window at a
 * time as BullMQ jobs in the child tool's pool (with the parent's principal's fair-share priority, §25), and answers
 * `wait` (the run suspends) until every child is recorded or fail-fast trips. Every run of the parent is a replay: it
 * reads the batch from Redis and goes on from there, on whichever worker it runs.
 */
import {
  type BatchStore,
  TaskrelayError,
  WorkerCatalogSchema,
  DEFAULT_PRIORITY,
  priorityBase,
  catalogQueueName,
  toolQueue,
  batchChildId,
  childShard,
  jobOptions,
  parseMessage,
  TASK_FIELDS,
  isTerminal,
  type BatchCounts,
  type BatchOutcome,
  type BatchShape,
  type Logger,
  type TaskStatus,
  type CancelRequest,
  type Keys,
  shardedPubSub,
  type RedisClient,
  type ShardPlacement,
  type ToolDescriptor,
} from '@taskrelay/shared';
import type { ChildOutcome, FanOutHost, FanOutOptions, FanOutResult } from '../context-types.js';
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
type ChildToolInfo = Pick<ToolDescriptor, 'name' | 'timeoutMs' | 'attempts' | 'backoff' | 'shards'>;

export interface BatchParentOptions {
  redis: RedisClient;
  keys: Keys;
  store: BatchStore;
  queues: BatchQueues;
  /** This worker's `TASKRELAY_QUEUE`: a child tool served here queues in `toolQueue(ownQueueName, tool)`. */
  ownQueueName: string;
  tools: ReadonlyMap<string, ToolDefinition>;
  metrics: WorkerMetrics;
  /** The placement registry in the sharded layout (PROTOCOL.md §1.1): where the child tool's shards are (§26.10). */
  placement?: ShardPlacement;
}

/**
 * The open-work cap of a batch whose job carries none (authentication off, where the gateway counts no one's tasks,
 * or `TASKRELAY_MAX_OPEN_TASKS=0`): a principal's batches together keep at most this many children open across the
 * fleet (each batch at least one), counted in the same open-work set (§26.6). The gateway's default cap.
 */
export const DEFAULT_BATCH_OPEN_CAP = 1_000;

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

  /**
   * The host of one parent run: `maxOpen` is its principal's open-work cap, from its job (§26.6), or
   * `DEFAULT_BATCH_OPEN_CAP` for its children when the job carries none.
   */
  forRun(maxOpen: number | undefined, priority = DEFAULT_PRIORITY): FanOutHost {
    return {
      fanOut: (run, items, options) => this.fanOut(run, items, options, maxOpen, priorityBase(priority)),
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
    base: number,
  ): ReturnType<FanOutHost['fanOut']> {
    const { store } = this.o;
    const { taskId, lock, record, log } = run;
    let shape = await store.shape(taskId);
    if (!shape) {
      const child = await this.childTool(options.tool);
      // The sharded layout (§26.10): the child tool's placed shards, kept in the batch so every releaser and stopper
      // puts child i on the same one.
      const childCodes = await this.childCodes(child.pool, child.tool.shards);
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
          ...(childCodes === undefined ? {} : { childCodes }),
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

    await this.releaseNext(taskId, shape, counts.open, maxOpen, base, log);
    return { kind: 'wait', pollMs: BATCH_POLL_MS };
  }

  /**
   * Releases the batch's next window (§26.3 step 2), for its parent's run or for a child whose record should have
   * woken a parent that is not waiting (§26.3 step 4): every release is one script that moves `released`, so two
   * releasers never open an index twice, and together they keep at most a window open. Resolves with how many
   * children it released.
   */
  private async releaseNext(
    taskId: string,
    shape: BatchShape,
    open: number,
    maxOpen: number | undefined,
    base: number,
    log: Logger,
  ): Promise<number> {
    const { store } = this.o;
    // Every release first re-adds the open children that have no job: a run that died between its release and its
    // add (their indices are released and open, their jobs never made), or a job that vanished (evicted, say). One
    // whose job is in the pool is left alone (its start check refuses it if recorded). At most a window of EXISTS.
    if (open > 0) {
      const indices = await store.openIndices(taskId);
      const priorities = await store.reenter(taskId, indices, this.placement(shape, base));
      const added = await this.addChildren(taskId, shape, indices, priorities, maxOpen);
      if (added > 0) log.info({ open: indices.length, added }, 'batch re-added open children that had no job');
    }
    // The window is the concurrency less what the open-work cap leaves beside the principal's other open work, at
    // least 1 (the batch always moves on), sized by the release script itself (§26.6).
    const cap = maxOpen ?? DEFAULT_BATCH_OPEN_CAP;
    // The children's open-work entries are on the parent's shard in either layout (§26.10), where this script counts.
    await this.pruneOpenWork(this.o.keys.forTask(taskId).principalOpenTasks(shape.owner), open, cap);
    const { window, from, priorities } = await store.release(taskId, {
      ...this.placement(shape, base),
      concurrency: shape.concurrency,
      cap,
      openWorkTtlMs: BATCH_TTL_MS,
    });
    const count = priorities.length;
    if (count > 0) {
      const indices = Array.from({ length: count }, (_v, i) => from + i);
      await this.addChildren(taskId, shape, indices, priorities, maxOpen);
      this.o.metrics.batchChildrenReleased.inc({ tool: shape.childTool }, count);
      log.debug({ from, count, window }, 'batch children released');
    }
    return count;
  }

  /**
   * A child was recorded while its parent should run (§26.4's condition) and the child did not promote it: the
   * parent is queued (promoted, waiting for a slot), its run is live, or its run is lost with its worker until
   * BullMQ's stall check takes it over (up to the lock duration). The child releases the next window itself, so the
   * batch keeps moving whatever the parent's run does (§26.3 step 4); a parent still delayed (a lost promotion) is
   * promoted as well. Nothing for a batch that is stopped, done, failed fast or whose parent ended. `level`: the
   * parent's priority level, which its children carry.
   */
  async releaseFromChild(taskId: string, maxOpen: number | undefined, level: number, log: Logger): Promise<number> {
    const { store, redis, keys, queues } = this.o;
    const [shape, counts, status] = await Promise.all([
      store.shape(taskId),
      store.peek(taskId),
      redis.hget(keys.forTask(taskId).task(taskId), TASK_FIELDS.status),
    ]);
    if (!shape || !counts || counts.stopped || status === null || isTerminal(status as TaskStatus)) return 0;
    if (counts.released >= counts.size || (shape.failFast && counts.failed > 0)) return 0;
    const state = await queues.get(shape.parentPool, keys.forTask(taskId)).getJobState(taskId);
    if (state === 'completed' || state === 'failed' || state === 'unknown') return 0;
    if (state === 'delayed') await queues.promote(shape.parentPool, taskId);
    const released = await this.releaseNext(taskId, shape, counts.open, maxOpen, priorityBase(level), log);
    if (released > 0) log.info({ released, parent: state }, 'this child released the batch’s next window');
    return released;
  }

  /**
   * Prunes the principal's open work of ended ids (as the gateway's cap does) when its raw count says the cap might
   * bind, so the release script's count of it is exact where it matters (§26.6).
   */
  private async pruneOpenWork(key: string, ownOpen: number, cap: number): Promise<void> {
    const { redis, store } = this.o;
    if ((await redis.zcard(key)) - ownOpen < cap) return;
    const ids = await redis.zrange(key, 0, -1);
    const ended = await store.endedWork(ids);
    const gone = ids.filter((_id, i) => ended[i] === true);
    if (gone.length > 0) await redis.zrem(key, ...gone);
  }

  /** Where children go: the child tool's queue, their principal's share there, at their parent's level (§25.1). */
  private placement(shape: BatchShape, base: number) {
    return {
      childPool: shape.childPool,
      owner: shape.owner,
      shareTtlMs: FAIR_SHARE_TTL_MS,
      priorityBase: base,
      ...(shape.childCodes === undefined ? {} : { childCodes: shape.childCodes }),
    };
  }

  /** The child tool's placed shard codes in the sharded layout (placing them if no worker did yet), else undefined. */
  private async childCodes(pool: string, shards: number | undefined): Promise<string[] | undefined> {
    if (this.o.keys.layout !== 'sharded') return undefined;
    const { placement } = this.o;
    if (placement === undefined) throw new TaskrelayError('INTERNAL', 'ctx.fanOut: no shard placement here');
    return placement.codes(pool, shards ?? 1);
  }

  /**
   * Adds the jobs of the children whose priority (from the release script: the pool's one fair-share rule, §25, its
   * entry written before the job exists) is above 0; 0 is a child whose job is in the pool already. Resolves with
   * how many it added.
   */
  private async addChildren(
    taskId: string,
    shape: BatchShape,
    indices: readonly number[],
    priorities: readonly number[],
    maxOpen: number | undefined,
  ): Promise<number> {
    const { store, queues } = this.o;
    const adding = indices.flatMap((index, i) => {
      const priority = priorities[i] ?? 0;
      return priority > 0 ? [{ index, priority }] : [];
    });
    if (adding.length === 0) return 0;
    const first = adding[0]?.index ?? 0;
    const last = adding[adding.length - 1]?.index ?? first;
    const texts = await store.items(taskId, first, last + 1);
    const tool = await this.childToolInPool(shape.childTool, shape.childPool);
    const jobs = adding.map(({ index, priority }) => ({
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
      opts: jobOptions(batchChildId(taskId, index), priority, tool),
    }));
    // Single layout: on the one prefix. Sharded: child i on its shard `C(i)` (§26.10), one addBulk per shard.
    const byShard = new Map<string | undefined, typeof jobs>();
    adding.forEach(({ index }, i) => {
      const code = childShard(shape.childCodes, index);
      const job = jobs[i];
      if (job) byShard.set(code, [...(byShard.get(code) ?? []), job]);
    });
    await Promise.all(
      [...byShard].map(([code, some]) => queues.get(shape.childPool, this.childKeys(taskId, code)).addBulk(some)),
    );
    return jobs.length;
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
    // Each child's job, share entry and cancel channel are on its own shard `C(i)` in the sharded layout (§26.10),
    // named from its index, never from its id (which names the parent's shard); its open-work entry is the parent's.
    // One pipeline per shard: a pipeline on a cluster stays on one node.
    const pipelines = new Map<string, ReturnType<RedisClient['pipeline']>>();
    const on = (code: string) => {
      let pipeline = pipelines.get(code);
      if (!pipeline) pipelines.set(code, (pipeline = redis.pipeline()));
      return pipeline;
    };
    const parentShard = keys.shardOf(taskId) ?? '';
    for (const index of indices) {
      const id = batchChildId(taskId, index);
      const code = childShard(shape.childCodes, index);
      const child = this.childKeys(taskId, code);
      await queues
        .get(shape.childPool, child)
        .remove(id)
        .catch(() => 0);
      on(code ?? parentShard).zrem(child.fairShare(shape.childPool, shape.owner), id);
      on(parentShard).zrem(keys.forTask(taskId).principalOpenTasks(shape.owner), id);
      const cancel: CancelRequest = { taskId: id, reason: 'CLIENT_CANCELLED' };
      // The child's own shard's channel in the sharded layout (PROTOCOL.md §1.2), where its tool's workers listen.
      if (shardedPubSub(keys)) on(code ?? parentShard).spublish(child.cancelChannel, JSON.stringify(cancel));
      else on(parentShard).publish(keys.cancelChannel, JSON.stringify(cancel));
    }
    await Promise.all([...pipelines.values()].map((pipeline) => pipeline.exec()));
  }

  /** The keys of child shard `code` (the sharded layout, §26.10), or the parent's (`code` undefined: single layout). */
  private childKeys(taskId: string, code: string | undefined): Keys {
    return code === undefined ? this.o.keys.forTask(taskId) : this.o.keys.forShard(code);
  }

  /** After the parent's job is delayed: are the children done already (§26.4)? Then it must promote itself. */
  async shouldWake(taskId: string): Promise<boolean> {
    return (await this.o.store.peek(taskId))?.wake === true;
  }

  /**
   * The queue a new batch's children go to (§3.2): the child tool's queue, which every worker of the tool consumes;
   * under this worker's `TASKRELAY_QUEUE` when it serves the tool, else under a live worker's that does.
   */
  private async childTool(name: string): Promise<{ pool: string; tool: ChildToolInfo }> {
    const local = this.o.tools.get(name);
    if (local) return { pool: toolQueue(this.o.ownQueueName, name), tool: local.descriptor };
    const serving = (await this.catalogs()).filter((c) => c.tools.some((t) => t.name === name));
    const pick = serving[Math.floor(Math.random() * serving.length)];
    const tool = pick?.tools.find((t) => t.name === name);
    if (!pick || !tool) {
      throw new TaskrelayError('TOOL_NOT_FOUND', `ctx.fanOut: no live worker serves tool ${name}`);
    }
    return { pool: toolQueue(catalogQueueName(pick), name), tool };
  }

  /** The child tool's attempts, backoff and timeout as its pool serves it (the parent may run elsewhere now). */
  private async childToolInPool(name: string, pool: string): Promise<ChildToolInfo> {
    const local = this.o.tools.get(name);
    if (local && pool === toolQueue(this.o.ownQueueName, name)) return local.descriptor;
    const catalog = (await this.catalogs()).find((c) => toolQueue(catalogQueueName(c), name) === pool);
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

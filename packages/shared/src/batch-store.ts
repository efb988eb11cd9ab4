/**
 * A batch: a parent task's fan-out to child jobs (PROTOCOL.md §26). The batch's record is in Redis (its hash, item
 * list, outcome hash, open and running sets); this store is the one reader and writer of it, for the worker (the
 * parent's `ctx.fanOut`, each child's start and record) and for the gateway (dashboard counts, the open-work cap).
 */
import { BATCH_FIELDS as B } from './protocol/batch-fields.js';
import { MAX_FAIR_PRIORITY } from './fair-share.js';
import { parseBatchChildId, type Keys } from './protocol/keys.js';
import { pipelineByShard } from './placement.js';
import type { RedisClient } from './redis.js';
import { ResultCode } from './protocol/script-results.js';
import { SCRIPTS, type ScriptRunner } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';
import { TASK_FIELDS as F } from './protocol/task-fields.js';
import { isTerminal, type TaskStatus, type ToolResult } from './protocol/task-model.js';
import type { SerializedError } from './protocol/errors.js';
import type { JobLock } from './store/runs.js';

/** How one child ended, as recorded (once) in the outcome hash. */
export interface BatchOutcome {
  status: 'completed' | 'failed' | 'cancelled';
  /** The child's tool result; left out when it is over `MAX_STORED_CHILD_RESULT_CHARS` (then `resultOmitted`). */
  result?: ToolResult;
  error?: SerializedError;
  resultOmitted?: true;
}

/** How long a child's claimed outcome lives on its shard at most (§26.10): the batch's keys' ttl. */
const BATCH_CLAIM_TTL_MS = 7 * 86_400_000;

/** A child's stored result is at most this much JSON; a bigger one is recorded without it (`resultOmitted`). */
export const MAX_STORED_CHILD_RESULT_CHARS = 16_384;

/** What a batch hash says, with the size of its open set. */
export interface BatchCounts {
  size: number;
  completed: number;
  failed: number;
  released: number;
  /** Released and not recorded: queued or running. */
  open: number;
  window: number;
  stopped: boolean;
  /** The parent should run now (§26.4). */
  wake: boolean;
}

/** The shape a parent writes once, at its first `fanOut`. */
export interface BatchShape {
  childTool: string;
  childPool: string;
  parentPool: string;
  concurrency: number;
  failFast: boolean;
  owner: string;
  /**
   * The sharded layout (PROTOCOL.md §26.10): the child tool's placed shard codes; child `i` queues on
   * `childCodes[i mod N]` (`childShard`). Absent in the single layout.
   */
  childCodes?: readonly string[];
}

/** The shard child `index` of a batch queues on in the sharded layout (§26.10): a function of its index alone. */
export function childShard(codes: readonly string[] | undefined, index: number): string | undefined {
  if (codes === undefined || codes.length === 0) return undefined;
  return codes[index % codes.length];
}

/** Where a batch's children go: their pool, and their principal's fair share of it. */
export interface ChildPlacement {
  childPool: string;
  owner: string;
  /** How long the principal's fair share of the pool outlives its newest entry. */
  shareTtlMs: number;
  /** The parent's priority level's base (§25.1): children take their parent's level. 0 (level 1) when absent. */
  priorityBase?: number;
  /** The sharded layout: the child tool's shard codes (`BatchShape.childCodes`), where the children's shares are. */
  childCodes?: readonly string[];
}

/** A release of a batch's next children, for `BatchStore.release`. */
export interface ChildRelease extends ChildPlacement {
  concurrency: number;
  /** The principal's open-work cap (§26.6). */
  cap: number;
  /** The principal's open work lives at least this long after a release (a cap nobody else counts still expires). */
  openWorkTtlMs: number;
}

export type StartChildOutcome =
  | {
      outcome: 'run';
      owner: string;
      parentPool: string;
      /**
       * The sharded layout (§26.10): an outcome a run of this child claimed on its shard before its worker died, not
       * counted yet. The tool is not run again: the record counts this outcome.
       */
      claimed?: BatchOutcome;
    }
  | { outcome: 'parent_ended' | 'recorded' | 'missing' | 'lock_lost' };

export type RecordChildOutcome =
  | {
      outcome: 'recorded';
      done: number;
      size: number;
      failed: number;
      /** This record should promote the parent (the crossing of §26.4: once per window). */
      wake: boolean;
      /** The parent should run now (§26.4's condition), whether this record crossed it or an earlier one did. */
      below: boolean;
    }
  | { outcome: 'duplicate' | 'missing' | 'lock_lost' };

export class BatchStore {
  private readonly redis: RedisClient;
  private readonly keys: Keys;
  private readonly scripts: ScriptRunner;

  /** Over the runner of the connection it writes on (store/store-runner.ts): one script runner per connection. */
  constructor(runner: StoreRunner) {
    this.redis = runner.redis;
    this.keys = runner.keys;
    this.scripts = runner.scripts;
  }

  /** Stores the batch once; a replay of the parent (`exists`) writes nothing. */
  async create(
    parentId: string,
    lock: JobLock,
    shape: BatchShape,
    items: readonly string[],
    ttlMs: number,
  ): Promise<'created' | 'exists' | 'gone' | 'lock_lost'> {
    const k = this.keys.forTask(parentId).batch(parentId);
    const fields: Record<string, string> = {
      [B.childTool]: shape.childTool,
      [B.childPool]: shape.childPool,
      [B.parentPool]: shape.parentPool,
      [B.size]: String(items.length),
      [B.released]: '0',
      [B.completed]: '0',
      [B.failed]: '0',
      [B.failFast]: shape.failFast ? '1' : '0',
      [B.concurrency]: String(shape.concurrency),
      [B.window]: String(shape.concurrency),
      [B.owner]: shape.owner,
      [B.createdAtMs]: String(Date.now()),
      ...(shape.childCodes === undefined ? {} : { [B.childCodes]: shape.childCodes.join(',') }),
    };
    const reply = await this.scripts.call(SCRIPTS.batchCreate, {
      keys: {
        batch: k.hash,
        items: k.items,
        lock: this.keys.forTask(parentId).bullJobLock(lock.queue, parentId),
        task: this.keys.forTask(parentId).task(parentId),
      },
      args: { lockToken: lock.token, fields: JSON.stringify(fields), items: items.join('\n'), ttlMs },
    });
    switch (reply.code) {
      case ResultCode.OK:
        return 'created';
      case ResultCode.BATCH_EXISTS:
        return 'exists';
      case ResultCode.LOCK_LOST:
        return 'lock_lost';
      default:
        return 'gone';
    }
  }

  /** The batch's counters and wake condition, or undefined when there is no batch. */
  async peek(parentId: string): Promise<BatchCounts | undefined> {
    const k = this.keys.forTask(parentId).batch(parentId);
    const reply = await this.scripts.call(SCRIPTS.batchPeek, { keys: { batch: k.hash, open: k.open }, args: {} });
    if (reply.code !== ResultCode.OK) return undefined;
    const [size, completed, failed, released, open, window, stopped, wake] = reply.values.map(Number);
    return {
      size: size ?? 0,
      completed: completed ?? 0,
      failed: failed ?? 0,
      released: released ?? 0,
      open: open ?? 0,
      window: window ?? 1,
      stopped: stopped === 1,
      wake: wake === 1,
    };
  }

  /** The batch's shape fields (pools, tool, owner), as the parent and the dashboard need them. */
  async shape(parentId: string): Promise<BatchShape | undefined> {
    const [childTool, childPool, parentPool, concurrency, failFast, owner, childCodes] = await this.redis.hmget(
      this.keys.forTask(parentId).batch(parentId).hash,
      B.childTool,
      B.childPool,
      B.parentPool,
      B.concurrency,
      B.failFast,
      B.owner,
      B.childCodes,
    );
    if (!childTool || !childPool || !parentPool) return undefined;
    return {
      childTool,
      childPool,
      parentPool,
      concurrency: Number(concurrency ?? 1),
      failFast: failFast === '1',
      owner: owner ?? '',
      ...(childCodes ? { childCodes: childCodes.split(',') } : {}),
    };
  }

  /** Items `from .. to − 1` (JSON texts). */
  async items(parentId: string, from: number, to: number): Promise<string[]> {
    if (to <= from) return [];
    return this.redis.lrange(this.keys.forTask(parentId).batch(parentId).items, from, to - 1);
  }

  /**
   * Releases the batch's next children (PROTOCOL.md §26.3 step 2, §26.6): sizes the window against the principal's
   * open-work cap, opens the children and counts them in its open work before their jobs exist, and answers each
   * one's BullMQ priority from the pool's one fair-share rule (§25), 0 for a child whose job is in the pool already
   * (do not add it). One script, so two batches of a principal released at once both see the other's children.
   */
  async release(parentId: string, r: ChildRelease): Promise<{ window: number; from: number; priorities: number[] }> {
    const values = await this.releaseScript(parentId, r, '1', [], r.concurrency, r.cap);
    const [window, from, ...placeholders] = values;
    // The sharded layout (§26.10): the script on the parent's shard opened the children; each target shard enters
    // its children in the fair share there, as a re-add does.
    const priorities =
      r.childCodes === undefined
        ? placeholders
        : await this.reenter(
            parentId,
            placeholders.map((_p, i) => (from ?? 0) + i),
            r,
          );
    return { window: window ?? 1, from: from ?? 0, priorities };
  }

  /** Re-adds open children (§26.3 step 2): each one's priority as `release` answers it, 0 when its job exists. */
  async reenter(parentId: string, indices: readonly number[], r: ChildPlacement): Promise<number[]> {
    if (indices.length === 0) return [];
    const codes = r.childCodes;
    if (codes === undefined) {
      return (await this.releaseScript(parentId, { ...r, openWorkTtlMs: 0 }, '0', indices, 0, 0)).slice(2);
    }
    // One re-add per target shard, on that shard (its share, its jobs); the script's batch keys are not touched by a
    // re-add, so they are named on that shard only to keep the call in one slot.
    const byShard = new Map<string, number[]>();
    indices.forEach((index, i) => {
      const code = childShard(codes, index) ?? '';
      byShard.set(code, [...(byShard.get(code) ?? []), i]);
    });
    const priorities = indices.map(() => 0);
    await Promise.all(
      [...byShard].map(async ([code, at]) => {
        const mine = at.map((i) => indices[i] ?? 0);
        const values = await this.releaseScript(parentId, { ...r, openWorkTtlMs: 0 }, '0', mine, 0, 0, code);
        at.forEach((i, n) => (priorities[i] = values[n + 2] ?? 0));
      }),
    );
    return priorities;
  }

  /**
   * `shard`: a re-add on one target shard of the sharded layout (§26.10); without it the script runs on the parent's
   * shard, where in the sharded layout (`childCodes`) it only opens the children and enters none.
   */
  private async releaseScript(
    parentId: string,
    r: ChildPlacement & { openWorkTtlMs: number },
    release: '0' | '1',
    indices: readonly number[],
    concurrency: number,
    cap: number,
    shard?: string,
  ): Promise<number[]> {
    const on = shard === undefined ? this.keys.forTask(parentId) : this.keys.forShard(shard);
    const k = on.batch(parentId);
    const reply = await this.scripts.call(SCRIPTS.batchRelease, {
      keys: {
        batch: k.hash,
        open: k.open,
        share: on.fairShare(r.childPool, r.owner),
        principalOpen: on.principalOpenTasks(r.owner),
      },
      args: {
        parentId,
        indices: indices.join(','),
        release,
        concurrency,
        cap,
        nowMs: Date.now(),
        openWorkTtlMs: r.openWorkTtlMs,
        shareTtlMs: r.shareTtlMs,
        maxPriority: MAX_FAIR_PRIORITY,
        queueKey: `${on.bullQueueKeyPrefix}${r.childPool}`,
        priorityBase: r.priorityBase ?? 0,
        enter: shard === undefined && r.childCodes !== undefined ? '0' : '1',
      },
    });
    return reply.values.map(Number);
  }

  /** The indices released and not recorded yet (at most a window of them). */
  async openIndices(parentId: string): Promise<number[]> {
    return (await this.redis.smembers(this.keys.forTask(parentId).batch(parentId).open))
      .map(Number)
      .sort((a, b) => a - b);
  }

  /** How many children run on some worker now. */
  async runningCount(parentId: string): Promise<number> {
    return this.redis.scard(this.keys.forTask(parentId).batch(parentId).running);
  }

  /** Fail-fast tripped: no child starts any more (§26.5). */
  async stop(parentId: string): Promise<void> {
    await this.redis.hset(this.keys.forTask(parentId).batch(parentId).hash, B.stopped, '1');
  }

  /** The batch ended with its parent: its keys live `ttlMs` more (the parent's ttl); the items are no longer needed. */
  async expire(parentId: string, ttlMs: number): Promise<void> {
    const k = this.keys.forTask(parentId).batch(parentId);
    await this.redis
      .multi()
      .del(k.items)
      .pexpire(k.hash, ttlMs)
      .pexpire(k.outcomes, ttlMs)
      .del(k.open)
      .del(k.running)
      .exec();
  }

  /** A child run starts (§26.3): run it, or not (parent ended, batch stopped, outcome recorded, lock lost). */
  async startChild(parentId: string, index: number, lock: JobLock): Promise<StartChildOutcome> {
    const k = this.keys.forTask(parentId).batch(parentId);
    const childId = `${parentId}.${index}`;
    // The sharded layout (§26.10): the child's job and lock are on its own shard, the batch on its parent's. The lock
    // and a claim left by a run that died between its two record steps are read there first; the script on the
    // parent's shard then runs with no lock token (the lock was checked here, a moment ago).
    let claimed: BatchOutcome | undefined;
    if (lock.shard !== undefined) {
      const on = this.keys.forShard(lock.shard);
      const [held, claim] = await this.redis.mget(on.bullJobLock(lock.queue, childId), on.batchClaim(childId));
      if (held !== lock.token) return { outcome: 'lock_lost' };
      if (claim) claimed = JSON.parse(claim) as BatchOutcome;
    }
    const reply = await this.scripts.call(SCRIPTS.batchStart, {
      keys: {
        task: this.keys.forTask(parentId).task(parentId),
        batch: k.hash,
        outcomes: k.outcomes,
        running: k.running,
        lock: this.keys.forTask(parentId).bullJobLock(lock.queue, childId),
      },
      args: { lockToken: lock.shard === undefined ? lock.token : '', index },
    });
    switch (reply.code) {
      case ResultCode.OK: {
        const [owner, parentPool] = reply.values as Array<string | undefined>;
        return { outcome: 'run', owner: owner ?? '', parentPool: parentPool ?? '', ...(claimed ? { claimed } : {}) };
      }
      case ResultCode.TASK_TERMINAL:
        return { outcome: 'parent_ended' };
      case ResultCode.OUTCOME_RECORDED:
        return { outcome: 'recorded' };
      case ResultCode.LOCK_LOST:
        return { outcome: 'lock_lost' };
      default:
        return { outcome: 'missing' };
    }
  }

  /** Records a child's outcome exactly once, while its run holds the job lock (§26.3). */
  async recordChild(
    parentId: string,
    index: number,
    owner: string,
    lock: JobLock,
    outcome: BatchOutcome,
  ): Promise<RecordChildOutcome> {
    const k = this.keys.forTask(parentId).batch(parentId);
    const childId = `${parentId}.${index}`;
    let json = JSON.stringify(outcome);
    if (json.length > MAX_STORED_CHILD_RESULT_CHARS && outcome.result !== undefined) {
      const { result: _dropped, ...rest } = outcome;
      json = JSON.stringify({ ...rest, resultOmitted: true });
    }
    let failed = outcome.status === 'completed' ? '0' : '1';
    // The sharded layout (§26.10), in two steps: (1) on the child's shard, under its lock, its one outcome is claimed
    // (a run that lost the lock claims nothing); (2) on the parent's shard the claimed outcome is counted with no lock
    // token, idempotently (the first HSETNX counts): a worker killed between the steps loses nothing, the next run
    // of the job finds the claim at its start and counts it without running the tool.
    const on = lock.shard === undefined ? undefined : this.keys.forShard(lock.shard);
    if (on !== undefined) {
      const claim = await this.scripts.call(SCRIPTS.batchClaim, {
        keys: { lock: on.bullJobLock(lock.queue, childId), claim: on.batchClaim(childId) },
        args: { lockToken: lock.token, outcome: json, ttlMs: BATCH_CLAIM_TTL_MS },
      });
      if (claim.code === ResultCode.LOCK_LOST) return { outcome: 'lock_lost' };
      const claimed = claim.values[0];
      if (typeof claimed === 'string') json = claimed;
      failed = (JSON.parse(json) as BatchOutcome).status === 'completed' ? '0' : '1';
    }
    const reply = await this.scripts.call(SCRIPTS.batchRecord, {
      keys: {
        batch: k.hash,
        outcomes: k.outcomes,
        open: k.open,
        running: k.running,
        lock: this.keys.forTask(parentId).bullJobLock(lock.queue, childId),
        principalOpen: this.keys.forTask(parentId).principalOpenTasks(owner),
      },
      args: { lockToken: on === undefined ? lock.token : '', index, childId, failed, outcome: json },
    });
    // Counted (now or before): the claim has done its work.
    if (on !== undefined && reply.code !== ResultCode.LOCK_LOST) await this.redis.del(on.batchClaim(childId));
    switch (reply.code) {
      case ResultCode.OK: {
        const [done, size, failed, wake, below] = reply.values;
        return {
          outcome: 'recorded',
          done: Number(done),
          size: Number(size),
          failed: Number(failed),
          wake: wake === '1',
          below: below === '1',
        };
      }
      case ResultCode.OUTCOME_RECORDED:
        return { outcome: 'duplicate' };
      case ResultCode.LOCK_LOST:
        return { outcome: 'lock_lost' };
      default:
        return { outcome: 'missing' };
    }
  }

  /** Outcomes of children `from .. from + count − 1` (undefined for a child not recorded). */
  async outcomes(parentId: string, from: number, count: number): Promise<Array<BatchOutcome | undefined>> {
    if (count <= 0) return [];
    const fields = Array.from({ length: count }, (_v, i) => String(from + i));
    const values = await this.redis.hmget(this.keys.forTask(parentId).batch(parentId).outcomes, ...fields);
    return values.map((value) => (value === null ? undefined : (JSON.parse(value) as BatchOutcome)));
  }

  /**
   * Which of a principal's open-work ids have ended (PROTOCOL.md §25, §26.6), in one round trip: a task whose hash is
   * gone or terminal, and a batch child whose outcome is recorded or whose parent ended. The open-task cap prunes them.
   */
  async endedWork(ids: readonly string[]): Promise<boolean[]> {
    if (ids.length === 0) return [];
    const replies = await pipelineByShard(this.redis, this.keys, ids, (pipeline, id) => {
      const child = parseBatchChildId(id);
      if (child) {
        pipeline.hget(this.keys.forTask(id).task(child.parentId), F.status);
        pipeline.hexists(this.keys.forTask(id).batch(child.parentId).outcomes, String(child.index));
      } else {
        pipeline.hget(this.keys.forTask(id).task(id), F.status);
      }
    });
    const ended: boolean[] = [];
    let r = 0;
    for (const id of ids) {
      const status = replies[r++]?.[1];
      const gone = typeof status !== 'string' || isTerminal(status as TaskStatus);
      if (parseBatchChildId(id)) ended.push(gone || replies[r++]?.[1] === 1);
      else ended.push(gone);
    }
    return ended;
  }
}

/**
 * Fair share of a pool across principals (PROTOCOL.md §25), on BullMQ's own priorities: a job's priority is one more
 * than the number of its principal's jobs still waiting in the pool, so a principal with nothing queued goes ahead of
 * a backlog, and principals with backlogs take turns. The entry is one Lua script (`fairEnter`): one round trip, and
 * no ioredis pipeline, whose construction on a connection that carries BullMQ's fifty-odd commands cost 6% of the
 * gateway's CPU per plain call (`pnpm bench:profile --kind plain`).
 */
import type { RedisClient } from './redis.js';
import type { Keys } from './protocol/keys.js';
import { SCRIPTS } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';

/**
 * Priority levels above fair share (PROTOCOL.md §25.1): 1 runs first, 5 last, 3 by default. Each level is a band of
 * BullMQ priorities `PRIORITY_BAND` wide; within it a job's place is its fair-share rank, so fair share holds within a
 * level and every job of a level goes before every job of the next. Five bands fit BullMQ's `2 ** 21`.
 */
export const PRIORITY_LEVELS = 5;
export const DEFAULT_PRIORITY = 3;
export const PRIORITY_BAND = 262_144;
/** The highest fair-share rank in a level; a deeper backlog shares it and runs first in, first out. */
export const MAX_FAIR_PRIORITY = PRIORITY_BAND - 1;

/** What a priority level adds to a fair-share rank to give the BullMQ priority: 0 for level 1. */
export function priorityBase(level: number): number {
  const clamped = Math.min(PRIORITY_LEVELS, Math.max(1, Math.trunc(level) || DEFAULT_PRIORITY));
  return (clamped - 1) * PRIORITY_BAND;
}

/** The priority level of a BullMQ priority (0, BullMQ's "none", counts as the default level). */
export function priorityLevelOf(bullPriority: number): number {
  return bullPriority > 0 ? Math.floor((bullPriority - 1) / PRIORITY_BAND) + 1 : DEFAULT_PRIORITY;
}

/** A principal's fair share of a queue (PROTOCOL.md §25), over the one `StoreRunner` of its connection. */
export class FairShare {
  private readonly redis: RedisClient;
  private readonly keys: Keys;

  constructor(private readonly runner: StoreRunner) {
    this.redis = runner.redis;
    this.keys = runner.keys;
  }

  /**
   * Enters a job in its principal's share of `queue` and returns the BullMQ priority to add it with, once the entry
   * is written (so it exists before any worker can take the job and `leave` it). `ttlMs` bounds how long the share's
   * key outlives its newest job (so an entry whose job vanished without starting, such as one whose gateway died
   * between this and the add, is forgotten with it).
   */
  async enter(queue: string, principal: string, jobId: string, ttlMs: number, base = 0): Promise<number> {
    const reply = await this.runner.call(SCRIPTS.fairEnter, {
      keys: { share: this.keys.forTask(jobId).fairShare(queue, principal) },
      args: { jobId, ttlMs, maxPriority: MAX_FAIR_PRIORITY, priorityBase: base },
    });
    return Number(reply.values[0]);
  }

  /** The job left the waiting part of the share: started by a worker, removed by a cancel, or never added. */
  async leave(queue: string, principal: string, jobId: string, shard?: string): Promise<void> {
    // `shard`: a job whose id names another shard than its queue's (a batch child's, PROTOCOL.md §26.10).
    const keys = shard === undefined ? this.keys.forTask(jobId) : this.keys.forShard(shard);
    await this.redis.zrem(keys.fairShare(queue, principal), jobId);
  }
}

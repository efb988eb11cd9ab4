/**
 * Fair share of a pool across principals (PROTOCOL.md §25), on BullMQ's own priorities: a job's priority is one more
 * than the number of its principal's jobs still waiting in the pool, so a principal with nothing queued goes ahead of
 * a backlog, and principals with backlogs take turns. Kept in TypeScript (two round trips at enqueue, one command at
 * start) rather than a Lua script: every step is a single Redis command and a race between two enqueues of one
 * principal only gives two jobs the same priority, which BullMQ then runs in order.
 */
import type { RedisClient } from './redis.js';
import type { Keys } from './keys.js';

/** BullMQ's highest priority value (`2 ** 21`); a deeper backlog shares it and runs first in, first out. */
export const MAX_FAIR_PRIORITY = 2_097_152;

export class FairShare {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
  ) {}

  /**
   * Enters a job in its principal's share of `queue` and returns the BullMQ priority to add it with. `ttlMs` bounds
   * how long the share's key outlives its newest job (so an entry whose job vanished without starting, such as one
   * whose gateway died between this and the add, is forgotten with it).
   *
   * Resolves once the priority is known; `entered` settles when the entry is written. Send the job's add on the same
   * connection before awaiting it: Redis runs one connection's commands in order, so the entry exists before any
   * worker can take the job (and `leave` it), at the cost of one round trip, not two.
   */
  async enter(
    queue: string,
    principal: string,
    jobId: string,
    ttlMs: number,
  ): Promise<{ priority: number; entered: Promise<unknown> }> {
    const key = this.keys.fairShare(queue, principal);
    const [[, waiting], [, last]] = (await this.redis
      .pipeline()
      .zcard(key)
      .zrange(key, -1, -1, 'WITHSCORES')
      .exec()) as [[unknown, number], [unknown, string[]]];
    // Never below the newest waiting job's priority: a principal's own jobs keep their order while it has a backlog.
    const priority = waiting === 0 ? 1 : Math.min(MAX_FAIR_PRIORITY, Math.max(waiting + 1, Number(last[1] ?? 1)));
    const entered = this.redis.multi().zadd(key, priority, jobId).pexpire(key, ttlMs).exec();
    // Awaited by the caller; a rejection before then must not surface as unhandled.
    entered.catch(() => undefined);
    return { priority, entered };
  }

  /** The job left the waiting part of the share: started by a worker, removed by a cancel, or never added. */
  async leave(queue: string, principal: string, jobId: string): Promise<void> {
    await this.redis.zrem(this.keys.fairShare(queue, principal), jobId);
  }
}

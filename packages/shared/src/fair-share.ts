/**
 * Fair share of a pool across principals (PROTOCOL.md §25), on BullMQ's own priorities: a job's priority is one more
 * than the number of its principal's jobs still waiting in the pool, so a principal with nothing queued goes ahead of
 * a backlog, and principals with backlogs take turns. The entry is one Lua script (`fairEnter`): one round trip, and
 * no ioredis pipeline, whose construction on a connection that carries BullMQ's fifty-odd commands cost 6% of the
 * gateway's CPU per plain call (`pnpm bench:profile --kind plain`).
 */
import type { RedisClient } from './redis.js';
import type { Keys } from './keys.js';
import { SCRIPTS, ScriptRunner } from './scripts.js';

/** BullMQ's highest priority value (`2 ** 21`); a deeper backlog shares it and runs first in, first out. */
export const MAX_FAIR_PRIORITY = 2_097_152;

export class FairShare {
  private readonly scripts: ScriptRunner;

  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
  ) {
    this.scripts = new ScriptRunner(redis);
  }

  /**
   * Enters a job in its principal's share of `queue` and returns the BullMQ priority to add it with, once the entry
   * is written (so it exists before any worker can take the job and `leave` it). `ttlMs` bounds how long the share's
   * key outlives its newest job (so an entry whose job vanished without starting, such as one whose gateway died
   * between this and the add, is forgotten with it).
   */
  async enter(queue: string, principal: string, jobId: string, ttlMs: number): Promise<number> {
    const reply = await this.scripts.call(SCRIPTS.fairEnter, {
      keys: { share: this.keys.fairShare(queue, principal) },
      args: { jobId, ttlMs, maxPriority: MAX_FAIR_PRIORITY },
    });
    return Number(reply.values[0]);
  }

  /** The job left the waiting part of the share: started by a worker, removed by a cancel, or never added. */
  async leave(queue: string, principal: string, jobId: string): Promise<void> {
    await this.redis.zrem(this.keys.fairShare(queue, principal), jobId);
  }
}

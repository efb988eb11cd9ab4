/**
 * A run's terminal write through a Redis outage (PROTOCOL.md §10.10): a write that fails because Redis is unreachable
 * (a cluster's failover, say) is tried again with backoff while the job's lock may still be this run's, instead of
 * being dropped and the tool run again once the lock expires. Every try names the lock, so a late one is refused
 * rather than overwriting another run's outcome.
 *
 * Hand-written: the retry is bounded by the lock's lifetime and logs each step with the run's logger, which a generic
 * retry library (p-retry and the like) would only wrap, not save.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { isRedisUnavailableError, type Logger } from '@taskrelay/shared';

/** The first pause after a failed try; each next one doubles, up to `MAX_DELAY_MS`. */
const FIRST_DELAY_MS = 100;
const MAX_DELAY_MS = 1_000;

/** BullMQ's lock for a worker lock duration `L` (PROTOCOL.md §10.5): `2L/3`, as the task worker sets it. */
export function bullLockMs(lockDurationMs: number): number {
  return Math.max(100, Math.round((lockDurationMs * 2) / 3));
}

export interface EndWriteOptions {
  /** How long after the first failure the lock may still be this run's: BullMQ's lock (`bullLockMs`). */
  windowMs: number;
  log: Logger;
  /** What is written, for the log lines: `result`, `failure`, `cancel`… */
  what: string;
}

/**
 * Runs `write`, and again after a Redis-unavailable failure until it answers or `windowMs` since the first failure has
 * passed; then the last error is thrown (the envelope hands the job back, or the lock's expiry returns it).
 */
export async function writeThroughOutage<T>(write: () => Promise<T>, o: EndWriteOptions): Promise<T> {
  if (o.windowMs <= 0) return write();
  let failedAt: number | undefined;
  let retries = 0;
  let delay = FIRST_DELAY_MS;
  for (;;) {
    try {
      const value = await write();
      if (failedAt !== undefined) {
        o.log.info({ retries, pausedMs: Date.now() - failedAt }, `${o.what} written after Redis answered again`);
      }
      return value;
    } catch (error) {
      if (!isRedisUnavailableError(error)) throw error;
      const now = Date.now();
      failedAt ??= now;
      if (now - failedAt + delay > o.windowMs) {
        o.log.error(
          { err: error, retries, pausedMs: now - failedAt, windowMs: o.windowMs, reason: 'REDIS_UNAVAILABLE' },
          `${o.what} lost: Redis unreachable for as long as this run could hold the job lock; ` +
            'the job returns to the queue and runs again',
        );
        throw error;
      }
      if (retries === 0) {
        o.log.warn(
          { err: error, windowMs: o.windowMs },
          `${o.what} write failed: Redis unreachable; retrying while this run may still hold the job lock`,
        );
      }
      retries += 1;
      await sleep(delay);
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    }
  }
}

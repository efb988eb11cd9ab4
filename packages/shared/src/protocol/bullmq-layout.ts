/**
 * BullMQ's own key layout (6.x), in the one place taskrelay relies on it: the reaper reads a job's hash and the failed
 * set, and lock-checked writes compare a job's lock. BullMQ keeps these internal; `test/bullmq-layout.integration.test.ts` builds
 * them here and finds them in the keys a real BullMQ queue creates, so an upgrade that moves them fails that test.
 * The Lua scripts get the same layout as functions of a generated include (scripts.ts).
 */
import type { Backoff } from './messages.js';

/** What separates the parts of a BullMQ key: `<prefix>:<queue>:<jobId>`. */
export const BULLMQ_SEPARATOR = ':';
/** Suffix of a job's lock key (`<job key>:lock`), whose value is the token of the worker holding the job. */
export const BULLMQ_LOCK_SUFFIX = ':lock';
/** Name of a queue's sorted set of failed job ids (`<queue key>:failed`). */
export const BULLMQ_FAILED_SET = 'failed';

/** The field of a failed job's hash that holds why it failed. */
export const BULLMQ_FAILED_REASON_FIELD = 'failedReason';

/** BullMQ's key of a queue: what its other keys start with. */
export function bullQueueKey(bullPrefix: string, queueName: string): string {
  return `${bullPrefix}${BULLMQ_SEPARATOR}${queueName}`;
}

/** BullMQ's hash of one job. */
export function bullJobKey(queueKey: string, jobId: string): string {
  return `${queueKey}${BULLMQ_SEPARATOR}${jobId}`;
}

/** BullMQ's lock key of one job. */
export function bullJobLockKey(queueKey: string, jobId: string): string {
  return `${bullJobKey(queueKey, jobId)}${BULLMQ_LOCK_SUFFIX}`;
}

/** BullMQ's sorted set of a queue's failed jobs. */
export function bullFailedKey(queueKey: string): string {
  return `${queueKey}${BULLMQ_SEPARATOR}${BULLMQ_FAILED_SET}`;
}

/** The same layout as Lua functions, for the scripts that find a job from its queue key (the reaper). */
export function bullmqLayoutLua(): string {
  const q = (s: string) => JSON.stringify(s);
  return [
    `local function bull_job_key(queueKey, jobId) return queueKey .. ${q(BULLMQ_SEPARATOR)} .. jobId end`,
    `local function bull_failed_key(queueKey) return queueKey .. ${q(BULLMQ_SEPARATOR + BULLMQ_FAILED_SET)} end`,
    `local BULL_FAILED_REASON = ${q(BULLMQ_FAILED_REASON_FIELD)}`,
    '',
  ].join('\n');
}

/**
 * BullMQ's options for the job of a task or of a batch child, the same for both (PROTOCOL.md §25): its id, its
 * fair-share priority, the tool's attempts and backoff. The task hash (or the batch's outcome) holds the result; the
 * job is only the work item, so completed jobs go at once, and failed ones (cancels included) stay a little while for
 * inspection, bounded per queue (bounded Redis). Structural, so that shared need not depend on bullmq.
 */
export function jobOptions(
  jobId: string,
  priority: number,
  tool: { attempts?: number | undefined; backoff?: Backoff | undefined },
) {
  return {
    jobId,
    priority,
    attempts: tool.attempts ?? 1,
    ...(tool.backoff === undefined
      ? {}
      : { backoff: { type: tool.backoff.type, delay: tool.backoff.delayMs, jitter: tool.backoff.jitter ?? 0 } }),
    removeOnComplete: true,
    removeOnFail: { age: 3600, count: 1_000 },
  };
}

/**
 * A queue's meta hash (`<queue key>:meta`) and the fields of it taskrelay reads (PROTOCOL.md §3.3): `paused` exists
 * while the queue is paused (`Queue.pause()`), `concurrency` is its global concurrency (`setGlobalConcurrency`), `max`
 * and `duration` its global rate limit (`setGlobalRateLimit`). Written only through BullMQ's own `Queue` methods.
 */
export const BULLMQ_META_SUFFIX = ':meta';
export const BULLMQ_META_FIELDS = ['paused', 'concurrency', 'max', 'duration'] as const;
/** A queue's list of active job ids (`<queue key>:active`). */
export const BULLMQ_ACTIVE_SUFFIX = ':active';

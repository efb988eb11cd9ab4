/**
 * BullMQ's own key layout (6.x), in the one place taskrelay relies on it: the reaper reads a job's hash and the failed
 * set, and lock-checked writes compare a job's lock. BullMQ keeps these internal; `test/bullmq-layout.integration.test.ts` builds
 * them here and finds them in the keys a real BullMQ queue creates, so an upgrade that moves them fails that test.
 * The Lua scripts get the same layout as functions of a generated include (scripts.ts).
 */

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

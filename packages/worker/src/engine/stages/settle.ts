/**
 * How a run ends (PROTOCOL.md §21.3): a pure decision from what the tool did, why its signal aborted (if it did) and
 * whether it suspended, to what the worker does with the task and the job. No I/O here; `JobRun` carries it out.
 */
import { UnrecoverableError } from 'bullmq';
import { NonRetryableError, type CancelReason } from '@taskrelay/shared';
import { SuspendedError, retryAfterOf } from '../../errors.js';

/** What the tool's handler did: returned a value or threw. */
export type RunOutcome = { ok: true; value: unknown } | { ok: false; error: unknown };

export interface SettleInput {
  outcome: RunOutcome;
  /** Why the run's signal aborted; undefined when it did not. */
  reason: CancelReason | undefined;
  /** The run suspended (`ctx.elicit`, `ctx.sample`, `ctx.suspend`): whatever the handler did after it is discarded. */
  suspended: boolean;
  /** Runs of this job that failed before this one (BullMQ's `attemptsMade`). */
  attemptsMade: number;
  /** Runs the job may use (BullMQ's `opts.attempts`; 1 when unset). */
  attempts: number;
}

/** What the worker does once the handler is done. */
export type SettleAction =
  /** Hand the job back without using an attempt; the task stays as it is (§5 on WORKER_SHUTDOWN, §10.4). */
  | { kind: 'hand_back'; reason: 'LOCK_LOST' | 'WORKER_SHUTDOWN' }
  /** The timeout already failed the task when it fired; end the job unrecoverably. */
  | { kind: 'timed_out'; discarded: boolean }
  /** Make sure the task is cancelled and end the job done (a cancel is no failure and never retries). */
  | { kind: 'cancelled'; discarded: boolean }
  /** The gateway holding the plain call ended it (and cancelled its task): end the job, write nothing. */
  | { kind: 'ended_by_gateway' }
  /** Move the job to the delayed set until its answer or its time (§12); `wentOn` when the handler ignored it. */
  | { kind: 'suspend'; wentOn: boolean }
  /** Record the returned value as the task's result. */
  | { kind: 'complete'; value: unknown }
  /** The upstream said to come back later (`RetryAfterError`): delay the job `ms`, using no attempt (§3.4). */
  | { kind: 'back_off'; ms: number; message: string }
  /** Fail the task and end the job unrecoverably. */
  | { kind: 'fail'; error: unknown }
  /** Leave the task `working` and let BullMQ retry the job. */
  | { kind: 'retry'; error: unknown };

/** The action for a run's end. Order matters: an abort reason wins over a suspension, which wins over the outcome. */
export function settle(input: SettleInput): SettleAction {
  const { outcome, reason } = input;
  // Another run may own the task now: nothing more is written.
  if (reason === 'LOCK_LOST') return { kind: 'hand_back', reason };
  if (reason === 'TIMEOUT') return { kind: 'timed_out', discarded: outcome.ok };
  if (reason === 'CLIENT_CANCELLED') return { kind: 'cancelled', discarded: outcome.ok };
  if (reason === 'GATEWAY_SHUTDOWN') return { kind: 'ended_by_gateway' };
  if (input.suspended) return { kind: 'suspend', wentOn: outcome.ok || !isSuspendedError(outcome.error) };
  // A draining worker keeps a finished result; anything else goes back for another worker.
  if (reason === 'WORKER_SHUTDOWN' && !outcome.ok) return { kind: 'hand_back', reason };
  if (outcome.ok) return { kind: 'complete', value: outcome.value };
  const backOffMs = retryAfterOf(outcome.error);
  if (backOffMs !== undefined) {
    return { kind: 'back_off', ms: backOffMs, message: (outcome.error as Error).message };
  }
  return failOrRetry(outcome.error, input);
}

/** A failed run: fail the task when the error cannot be mended or this was the last attempt, retry otherwise. */
export function failOrRetry(
  error: unknown,
  input: Pick<SettleInput, 'attemptsMade' | 'attempts'>,
): Extract<SettleAction, { kind: 'fail' | 'retry' }> {
  if (isNonRetryable(error) || input.attemptsMade + 1 >= input.attempts) return { kind: 'fail', error };
  return { kind: 'retry', error };
}

/** A `SuspendedError` from any copy of this package. */
export function isSuspendedError(error: unknown): boolean {
  return error instanceof SuspendedError || (error as { name?: unknown } | undefined)?.name === 'SuspendedError';
}

/**
 * True for an error no retry can mend (`NonRetryableError`, `ProtocolError`, BullMQ's `UnrecoverableError`, an isolated
 * run killed for its memory, PROTOCOL.md §31.3). A tools module may carry its own copy of shared or bullmq: the code
 * and the name count too.
 */
export function isNonRetryable(error: unknown): boolean {
  if (error instanceof NonRetryableError || error instanceof UnrecoverableError) return true;
  const { code, name } = (error ?? {}) as { code?: unknown; name?: unknown };
  return (
    code === 'NON_RETRYABLE' || code === 'PROTOCOL_ERROR' || code === 'MEMORY_LIMIT' || name === 'UnrecoverableError'
  );
}

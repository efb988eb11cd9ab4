/**
 * Worker error types. `NonRetryableError` lives in shared (the gateway reads its code back); `CancelledError` is what
 * a tool sees when its signal aborts.
 */
import { CANCEL_REASONS, TaskrelayError, type CancelReason } from '@taskrelay/shared';

export { NonRetryableError, ProtocolError } from '@taskrelay/shared';

/**
 * Rejects `ctx.sleep` and is thrown by `ctx.throwIfCancelled` once the task's signal has aborted. `reason` says why:
 * the client cancelled, the tool ran past its `timeoutMs`, or this worker is shutting down.
 */
export class CancelledError extends TaskrelayError {
  readonly reason: CancelReason;

  constructor(reason: CancelReason, message = `Task cancelled (${reason})`) {
    super('CANCELLED', message, { data: { reason } });
    this.name = 'CancelledError';
    this.reason = reason;
  }
}

export function isCancelReason(value: unknown): value is CancelReason {
  return typeof value === 'string' && (CANCEL_REASONS as readonly string[]).includes(value);
}

/**
 * The closed reason behind an aborted signal. Our controllers always abort with a `CancelReason`; anything else
 * (BullMQ's own `cancelJob`, say) counts as a client cancel, the only reason that never re-runs the tool.
 */
export function cancelReasonOf(signal: AbortSignal): CancelReason {
  const reason: unknown = signal.reason;
  if (isCancelReason(reason)) return reason;
  if (reason instanceof CancelledError) return reason.reason;
  return 'CLIENT_CANCELLED';
}

/**
 * Throw from a tool when the upstream says to come back later (HTTP 429/503 with `Retry-After`, a quota): the run ends
 * without using an attempt or holding a worker slot, the task stays `working` with a `statusMessage` saying why and
 * until when, and a new run starts after `ms` (PROTOCOL.md §3.4). `ctx.attempt` counts that run as any other.
 */
export class RetryAfterError extends TaskrelayError {
  /** How long to wait before the next run, in ms (at least 1, at most 24 h). */
  readonly retryAfterMs: number;

  constructor(ms: number, message = 'the upstream asked to retry later') {
    super('RETRY_AFTER', message);
    this.name = 'RetryAfterError';
    this.retryAfterMs = Math.min(86_400_000, Math.max(1, Math.round(Number.isFinite(ms) ? ms : 1)));
  }
}

/** A `RetryAfterError` from any copy of this package: its wait, else undefined. */
export function retryAfterOf(error: unknown): number | undefined {
  if (error instanceof RetryAfterError) return error.retryAfterMs;
  const { name, retryAfterMs } = (error ?? {}) as { name?: unknown; retryAfterMs?: unknown };
  return name === 'RetryAfterError' && typeof retryAfterMs === 'number' && retryAfterMs > 0 ? retryAfterMs : undefined;
}

/**
 * What `ctx.elicit`, `ctx.sample` and `ctx.suspend` reject with when the run suspends (PROTOCOL.md §12.7): the job
 * waits without a worker and a later run replays the handler. Let it propagate; whatever the handler returns or
 * throws after it is discarded.
 */
export class SuspendedError extends TaskrelayError {
  constructor(message = 'Run suspended: the task resumes in a later run') {
    super('SUSPENDED', message);
    this.name = 'SuspendedError';
  }
}

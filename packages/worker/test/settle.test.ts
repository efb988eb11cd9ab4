import { describe, expect, it } from 'vitest';
import { NonRetryableError } from '@taskrelay/shared';
import { failOrRetry, settle, type SettleInput } from '../src/engine/stages/settle.js';
import { RetryAfterError, SuspendedError } from '../src/errors.js';

const base: SettleInput = {
  outcome: { ok: true, value: 'done' },
  reason: undefined,
  suspended: false,
  attemptsMade: 0,
  attempts: 1,
};
const failed = (error: unknown): SettleInput['outcome'] => ({ ok: false, error });

describe('settle: how a run ends', () => {
  it('backs off on RetryAfterError (§3.4) whatever the attempts left, unless the run was aborted', () => {
    const error = new RetryAfterError(1500, 'quota');
    expect(settle({ ...base, outcome: failed(error), attemptsMade: 0, attempts: 1 })).toEqual({
      kind: 'back_off',
      ms: 1500,
      message: 'quota',
    });
    // Another copy of the package: the name and the wait count.
    const copy = Object.assign(new Error('copy'), { name: 'RetryAfterError', retryAfterMs: 20 });
    expect(settle({ ...base, outcome: failed(copy) })).toMatchObject({ kind: 'back_off', ms: 20 });
    expect(settle({ ...base, outcome: failed(error), reason: 'CLIENT_CANCELLED' })).toMatchObject({
      kind: 'cancelled',
    });
    expect(settle({ ...base, outcome: failed(error), reason: 'TIMEOUT' })).toMatchObject({ kind: 'timed_out' });
  });

  it('completes a run that returned without an abort', () => {
    expect(settle(base)).toEqual({ kind: 'complete', value: 'done' });
  });

  it('hands a run back without writing once its lock is lost, even when the tool returned', () => {
    expect(settle({ ...base, reason: 'LOCK_LOST' })).toEqual({ kind: 'hand_back', reason: 'LOCK_LOST' });
    expect(settle({ ...base, reason: 'LOCK_LOST', suspended: true })).toEqual({
      kind: 'hand_back',
      reason: 'LOCK_LOST',
    });
  });

  it('discards a result that came after the timeout or the cancel', () => {
    expect(settle({ ...base, reason: 'TIMEOUT' })).toEqual({ kind: 'timed_out', discarded: true });
    expect(settle({ ...base, reason: 'TIMEOUT', outcome: failed(new Error('x')) })).toEqual({
      kind: 'timed_out',
      discarded: false,
    });
    expect(settle({ ...base, reason: 'CLIENT_CANCELLED' })).toEqual({ kind: 'cancelled', discarded: true });
    expect(settle({ ...base, reason: 'CLIENT_CANCELLED', suspended: true })).toEqual({
      kind: 'cancelled',
      discarded: true,
    });
  });

  it('writes nothing for a call its gateway ended', () => {
    expect(settle({ ...base, reason: 'GATEWAY_SHUTDOWN', outcome: failed(new Error('x')) })).toEqual({
      kind: 'ended_by_gateway',
    });
  });

  it('suspends a run that suspended, and tells when the handler went on after it', () => {
    expect(settle({ ...base, suspended: true, outcome: failed(new SuspendedError()) })).toEqual({
      kind: 'suspend',
      wentOn: false,
    });
    // A SuspendedError of another copy of the package counts by its name.
    const foreign = Object.assign(new Error('x'), { name: 'SuspendedError' });
    expect(settle({ ...base, suspended: true, outcome: failed(foreign) })).toEqual({ kind: 'suspend', wentOn: false });
    expect(settle({ ...base, suspended: true })).toEqual({ kind: 'suspend', wentOn: true });
    expect(settle({ ...base, suspended: true, outcome: failed(new Error('swallowed')) })).toEqual({
      kind: 'suspend',
      wentOn: true,
    });
    // A suspension wins over a drain: the job waits in the delayed set, not for another worker.
    expect(
      settle({ ...base, suspended: true, reason: 'WORKER_SHUTDOWN', outcome: failed(new SuspendedError()) }),
    ).toEqual({ kind: 'suspend', wentOn: false });
  });

  it('keeps a result finished during a drain and hands back a run the drain stopped', () => {
    expect(settle({ ...base, reason: 'WORKER_SHUTDOWN' })).toEqual({ kind: 'complete', value: 'done' });
    expect(settle({ ...base, reason: 'WORKER_SHUTDOWN', outcome: failed(new Error('aborted')) })).toEqual({
      kind: 'hand_back',
      reason: 'WORKER_SHUTDOWN',
    });
  });

  it('retries a failure while attempts are left, and fails it on the last or when nothing can mend it', () => {
    const error = new Error('flaky');
    expect(settle({ ...base, outcome: failed(error), attempts: 3, attemptsMade: 1 })).toEqual({ kind: 'retry', error });
    expect(settle({ ...base, outcome: failed(error), attempts: 3, attemptsMade: 2 })).toEqual({ kind: 'fail', error });
    expect(settle({ ...base, outcome: failed(error) })).toEqual({ kind: 'fail', error });
    const fatal = new NonRetryableError('no');
    expect(settle({ ...base, outcome: failed(fatal), attempts: 3 })).toEqual({ kind: 'fail', error: fatal });
    const foreign = { code: 'NON_RETRYABLE', message: 'no' };
    expect(failOrRetry(foreign, { attempts: 5, attemptsMade: 0 })).toEqual({
      kind: 'fail',
      error: foreign,
    });
    expect(failOrRetry(error, { attempts: 5, attemptsMade: 0 })).toEqual({ kind: 'retry', error });
  });
});

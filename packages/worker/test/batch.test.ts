/** PROTOCOL.md §26: the pure parts of a batch — window, priorities, the result's shape — without Redis. */
import { describe, expect, it } from 'vitest';
import { MAX_FAIR_PRIORITY, parseBatchChildId, batchChildId } from '@taskrelay/shared';
import { childPriorities, fanOutResult, releaseWindow } from '../src/engine/batch-parent.js';
import { batchMessage } from '../src/context.js';

describe('26. release window', () => {
  it('is the concurrency without an open-work cap', () => {
    expect(releaseWindow(64, undefined, 5_000)).toBe(64);
  });
  it('shrinks to what the cap leaves beside the principal’s other work, never below one', () => {
    expect(releaseWindow(64, 1_000, 1)).toBe(64);
    expect(releaseWindow(64, 50, 10)).toBe(40);
    expect(releaseWindow(64, 50, 50)).toBe(1);
    expect(releaseWindow(64, 50, 80)).toBe(1);
  });
});

describe('26. children’s fair-share priorities', () => {
  it('start at 1 for a principal with nothing waiting and rise by one per child', () => {
    expect(childPriorities(0, undefined, 4)).toEqual([1, 2, 3, 4]);
  });
  it('queue behind the principal’s own waiting jobs, never before its newest', () => {
    expect(childPriorities(3, 4, 3)).toEqual([4, 5, 6]);
    expect(childPriorities(2, 40, 2)).toEqual([40, 40]);
  });
  it('stay within BullMQ’s priority range', () => {
    expect(childPriorities(MAX_FAIR_PRIORITY, MAX_FAIR_PRIORITY, 2)).toEqual([MAX_FAIR_PRIORITY, MAX_FAIR_PRIORITY]);
  });
});

describe('26. fan-out result', () => {
  const counts = { size: 5, completed: 2, failed: 1, released: 5, open: 0, window: 4, stopped: true, wake: false };
  it('lists each listed child by index, an unrecorded one as cancelled', () => {
    const result = fanOutResult(counts, [
      { status: 'completed', result: { content: [] } },
      { status: 'failed', error: { code: 'NON_RETRYABLE', message: 'no' } },
      undefined,
    ]);
    expect(result).toEqual({
      total: 5,
      completed: 2,
      failed: 1,
      cancelled: 2,
      outcomes: [
        { index: 0, status: 'completed', result: { content: [] } },
        { index: 1, status: 'failed', error: { code: 'NON_RETRYABLE', message: 'no' } },
        { index: 2, status: 'cancelled' },
      ],
      truncated: true,
      outcomesOmitted: 2,
    });
  });
  it('says how many children are done in its status message', () => {
    expect(batchMessage({ completed: 7, failed: 2, total: 10 })).toBe('9 of 10 children done (2 failed)');
  });
});

describe('26. child job ids', () => {
  it('name the parent and the index, and no task id reads as one', () => {
    const id = batchChildId('0123abcd', 42);
    expect(parseBatchChildId(id)).toEqual({ parentId: '0123abcd', index: 42 });
    expect(parseBatchChildId('0123abcd')).toBeUndefined();
    expect(parseBatchChildId('reserved:1-2')).toBeUndefined();
    expect(parseBatchChildId('a.01')).toBeUndefined();
  });
});

/**
 * PROTOCOL.md §26: the pure parts of a batch — the result's shape — without Redis. The window and the children's
 * priorities are the release script's (packages/shared/test/batch-store.integration.test.ts).
 */
import { describe, expect, it } from 'vitest';
import { parseBatchChildId, batchChildId } from '@taskrelay/shared';
import { fanOutResult } from '../src/engine/batch-parent.js';
import { batchMessage } from '../src/context-checks.js';

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

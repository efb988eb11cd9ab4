import { describe, expect, it } from 'vitest';
import { newTaskId } from '../src/store/task-codec.js';

describe('task ids', () => {
  it('are 128 random bits in hex, distinct across refills of their pool', () => {
    const ids = Array.from({ length: 1_000 }, () => newTaskId());
    for (const id of ids) expect(id).toMatch(/^[0-9a-f]{32}$/);
    expect(new Set(ids).size).toBe(ids.length);
  });
});

/**
 * PROTOCOL.md §22.2, issue 48 F3: the heap's garbage is bounded by the budget's reserve. Past the heap at start plus
 * three quarters of the budget, the guard runs a full collection (at most one per gap); within it, none. RSS itself is
 * measured by bench/memory.ts.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { startHeapGuard } from '../src/app/heap-guard.js';

let stop: (() => void) | undefined;
afterEach(() => stop?.());

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('heap guard (§22.2, F3)', () => {
  it('collects once the heap in use passes its size at start plus 3/4 of the budget', async () => {
    const collections: Array<[number, number]> = [];
    stop = startHeapGuard({
      budgetBytes: 8 * 1024 * 1024,
      intervalMs: 20,
      minGapMs: 0,
      onCollect: (before, after) => collections.push([before, after]),
    });
    // 32 MiB held past the 8 MiB the budget allows the heap to grow.
    const held: string[] = [];
    for (let i = 0; i < 64; i++) held.push(Buffer.alloc(512 * 1024, i).toString('latin1'));
    for (let i = 0; i < 100 && collections.length === 0; i++) await sleep(20);
    expect(held).toHaveLength(64);
    expect(collections.length).toBeGreaterThan(0);
    expect(collections[0]![0]).toBeGreaterThan(0);
  });

  it('leaves the heap alone within the budget', async () => {
    const collections: number[] = [];
    stop = startHeapGuard({ budgetBytes: 1024 * 1024 * 1024, intervalMs: 10, onCollect: (b) => collections.push(b) });
    await sleep(100);
    expect(collections).toEqual([]);
  });
});

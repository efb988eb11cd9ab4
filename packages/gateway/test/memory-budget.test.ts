/**
 * PROTOCOL.md §22.2, issue 48 F3: the budget counts what a held byte costs the process, not its length. 1,000 unread
 * streams against a 512 MiB budget read 537 MB on the budget's gauge while RSS was 0.92-1.19 GB: an event store's
 * JSON and a stream's queued bytes live as V8 strings in an old space that grows to about twice what is live before a
 * full collection. Here at small scale: the bytes a flood makes the gateway hold are charged twice, so the budget
 * gives way (sheds, evicts, refuses) at half the length it used to. RSS itself is measured by bench/memory.ts.
 */
import { describe, expect, it } from 'vitest';
import { HELD_BYTE_COST, MemoryBudget, SESSION_COST_BYTES } from '../src/app/memory-budget.js';

const MIB = 1024 * 1024;

describe('memory budget: held bytes at their cost to the process (§22.2, F3)', () => {
  it('charges event-store and stream-buffer bytes at HELD_BYTE_COST', () => {
    let streamBytes = 0;
    const budget = new MemoryBudget({
      budgetBytes: 8 * MIB,
      sessions: () => 2,
      routes: () => 0,
      streamBytes: () => streamBytes,
    });
    budget.eventsResized(1 * MIB);
    streamBytes = 1 * MIB;
    expect(HELD_BYTE_COST).toBe(2);
    expect(budget.usedBytes).toBe(4 * MIB + 2 * SESSION_COST_BYTES);
    const use = budget.use();
    // The parts are reported as their lengths; the total is what they cost.
    expect(use.eventBytes).toBe(1 * MIB);
    expect(use.streamBytes).toBe(1 * MIB);
    expect(use.usedBytes).toBe(4 * MIB + 2 * SESSION_COST_BYTES);
  });

  it('is past the budget when the held bytes are half of it: the flood of F3 gives way there', () => {
    let streamBytes = 0;
    const budget = new MemoryBudget({
      budgetBytes: 8 * MIB,
      sessions: () => 0,
      routes: () => 0,
      streamBytes: () => streamBytes,
    });
    budget.eventsResized(3 * MIB);
    streamBytes = 1 * MIB - 1;
    expect(budget.fits()).toBe(true);
    streamBytes = 1 * MIB + 1;
    // 4 MiB of strings held make V8's heap about 8 MiB: that is the budget.
    expect(budget.fits()).toBe(false);
    expect(budget.use().pressure).toBe(true);
  });
});

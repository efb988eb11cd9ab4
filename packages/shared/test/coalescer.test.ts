import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Coalescer } from '../src/coalescer.js';

describe('progress coalescer', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('sends the first value at once and the newest of a burst when the interval ends', () => {
    const sent: number[] = [];
    const c = new Coalescer<number>({ minIntervalMs: 50, send: (v) => sent.push(v) });
    for (let i = 1; i <= 1000; i++) c.push(i);
    expect(sent).toEqual([1]);
    vi.advanceTimersByTime(49);
    expect(sent).toEqual([1]);
    vi.advanceTimersByTime(1);
    expect(sent).toEqual([1, 1000]);
  });

  it('never sends more than one value per interval, in order', () => {
    const sent: number[] = [];
    const c = new Coalescer<number>({ minIntervalMs: 50, send: (v) => sent.push(v) });
    for (let i = 1; i <= 1000; i++) {
      c.push(i);
      vi.advanceTimersByTime(1);
    }
    vi.advanceTimersByTime(100);
    expect(sent.length).toBeLessThanOrEqual(21);
    expect(sent.at(-1)).toBe(1000);
    expect([...sent].sort((a, b) => a - b)).toEqual(sent);
  });

  it('drops a pending value on cancel and sends it on flush', () => {
    const sent: number[] = [];
    const c = new Coalescer<number>({ minIntervalMs: 50, send: (v) => sent.push(v) });
    c.push(1);
    c.push(2);
    c.cancel();
    vi.advanceTimersByTime(100);
    expect(sent).toEqual([1]);
    c.push(3);
    c.push(4);
    c.flush();
    expect(sent).toEqual([1, 3, 4]);
  });

  it('passes every value through when the interval is 0', () => {
    const sent: number[] = [];
    const c = new Coalescer<number>({ minIntervalMs: 0, send: (v) => sent.push(v) });
    c.push(1);
    c.push(2);
    expect(sent).toEqual([1, 2]);
  });
});

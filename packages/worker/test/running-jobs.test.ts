/**
 * RunningJobs without Redis: a cancel that arrives before its run registers (PROTOCOL.md §21.2.1), and the count of
 * runs the worker switches its command connection's batching by (§21.2.2).
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '@taskrelay/shared';
import { RunningJobs } from '../src/engine/running-jobs.js';

const quiet = createLogger('worker', { level: 'silent' });

describe('RunningJobs', () => {
  it('a cancel for a task with no run here aborts the run that registers for it next', () => {
    const running = new RunningJobs(quiet);
    running.cancel('t1', 'CLIENT_CANCELLED', 'cancel received');
    const entry = running.add('t1');
    expect(entry.controller.signal.aborted).toBe(true);
    expect(entry.controller.signal.reason).toBe('CLIENT_CANCELLED');
    // Kept once: a later run of the task (there is none for a cancelled task, but a hand-back fetches again) is not.
    running.release('t1', entry);
    expect(running.add('t1').controller.signal.aborted).toBe(false);
  });

  it('a cancel for a registered run aborts it, and leaves nothing behind for other tasks', () => {
    const running = new RunningJobs(quiet);
    const entry = running.add('t2');
    running.cancel('t2', 'GATEWAY_SHUTDOWN', 'cancel received');
    expect(entry.controller.signal.reason).toBe('GATEWAY_SHUTDOWN');
    expect(running.add('t3').controller.signal.aborted).toBe(false);
  });

  it('tells the worker how many runs it holds as each registers and leaves, and not for a stale release', () => {
    const counts: number[] = [];
    const running = new RunningJobs(quiet, (runs) => counts.push(runs));
    const a = running.add('a');
    const b = running.add('b');
    running.release('a', a);
    // A release by a run whose entry was replaced (its job fetched again here) changes nothing.
    running.release('b', { ...b });
    running.release('b', b);
    expect(counts).toEqual([1, 2, 1, 0]);
  });
});

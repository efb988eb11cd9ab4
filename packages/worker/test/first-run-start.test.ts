/**
 * A first run's brief start (PROTOCOL.md §21.2.1 item 2, issue 46), without Redis: the start answers without the
 * task's hash, the record is read once when a member asks for it, and a read Redis did not answer is tried again.
 */
import { describe, expect, it, vi } from 'vitest';
import type { RunStart, StartOutcome, TaskRecord } from '@taskrelay/shared';
import { FirstRunStart } from '../src/engine/first-run-start.js';
import { LogCapture } from './harness.js';

const START: RunStart = { taskId: 't1', lock: { queue: 'default~x', token: 'tok' }, attempt: 1, deadlineAt: 1 };
const RECORD = { taskId: 't1', status: 'working' } as TaskRecord;

function make(read: (taskId: string) => Promise<TaskRecord | undefined>) {
  const startRun = vi.fn((_start: RunStart): Promise<StartOutcome> =>
    Promise.resolve({ lockLost: false, record: undefined, started: true }),
  );
  const running = { abort: vi.fn(), loseLock: vi.fn() };
  const start = new FirstRunStart({ store: { startRun }, read, running, start: START, log: new LogCapture().logger() });
  return { start, startRun, running };
}

describe('§21.2.1 a first run’s brief start', () => {
  it('is sent brief, goes on without reading the record, and reads it once when asked', async () => {
    const read = vi.fn(() => Promise.resolve(RECORD));
    const { start, startRun, running } = make(read);
    expect(startRun).toHaveBeenCalledWith({ ...START, brief: true });
    expect(await start.ensure()).toBe(true);
    expect(read).not.toHaveBeenCalled();
    expect(await Promise.all([start.record(), start.record()])).toEqual([RECORD, RECORD]);
    expect(await start.record()).toBe(RECORD);
    expect(read).toHaveBeenCalledTimes(1);
    expect(running.abort).not.toHaveBeenCalled();
  });

  it('reads again after a read Redis did not answer', async () => {
    const read = vi
      .fn<(taskId: string) => Promise<TaskRecord | undefined>>()
      .mockRejectedValueOnce(new Error('redis down'))
      .mockResolvedValue(RECORD);
    const { start } = make(read);
    await expect(start.record()).rejects.toThrow('redis down');
    expect(await start.record()).toBe(RECORD);
    expect(read).toHaveBeenCalledTimes(2);
  });
});

import { describe, expect, it, vi } from 'vitest';
import type { LogMessage, LogOutcome, ProgressOutcome } from '@taskrelay/shared';
import { TaskContext } from '../src/context.js';
import { LogCapture } from './harness.js';

function makeContext(outcome: LogOutcome = 'published') {
  const sent: LogMessage[] = [];
  const store = {
    recordProgress: vi.fn((): Promise<ProgressOutcome> => Promise.resolve('accepted')),
    recordLog: vi.fn((_taskId: string, message: LogMessage): Promise<LogOutcome> => {
      sent.push(message);
      return Promise.resolve(outcome);
    }),
  };
  const onLockLost = vi.fn();
  const ctx = new TaskContext({
    taskId: 't1',
    tool: 'tool',
    attempt: 1,
    signal: new AbortController().signal,
    store,
    onLockLost,
    progressIntervalMs: 0,
    logger: new LogCapture().logger(),
  });
  return { ctx, sent, onLockLost };
}

describe('ctx.notify (PROTOCOL.md §13)', () => {
  it('sends each message in order with its level, data and logger, and the run end waits for them', async () => {
    const { ctx, sent } = makeContext();
    ctx.notify('info', 'started');
    ctx.notify('error', { code: 7 }, 'db');
    await ctx.flushProgress();
    expect(sent).toEqual([
      { level: 'info', data: 'started' },
      { level: 'error', data: { code: 7 }, logger: 'db' },
    ]);
  });

  it('refuses an unknown level and data too big or not JSON, and drops messages after the run ended', async () => {
    const { ctx, sent } = makeContext();
    expect(() => ctx.notify('verbose' as never, 'x')).toThrow(TypeError);
    expect(() => ctx.notify('info', () => 1)).toThrow(TypeError);
    expect(() => ctx.notify('info', 'x'.repeat(70_000))).toThrow(RangeError);
    ctx.close();
    ctx.notify('info', 'late');
    await ctx.flushProgress();
    expect(sent).toEqual([]);
  });

  it('a refused write (lock lost) aborts the run like a refused progress write', async () => {
    const { ctx, onLockLost } = makeContext('lock_lost');
    ctx.notify('warning', 'x');
    await ctx.flushProgress();
    expect(onLockLost).toHaveBeenCalledOnce();
  });
});

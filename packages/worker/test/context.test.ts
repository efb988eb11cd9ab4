import { afterEach, describe, expect, it, vi } from 'vitest';
import type { ProgressOutcome, ProgressUpdate } from '@taskrelay/shared';
import { TaskContext } from '../src/context.js';
import { CancelledError } from '../src/errors.js';
import { LogCapture } from './harness.js';

function makeContext(options: { progressIntervalMs?: number; fail?: boolean } = {}) {
  const writes: ProgressUpdate[] = [];
  const store = {
    recordProgress: vi.fn((_taskId: string, update: ProgressUpdate): Promise<ProgressOutcome> => {
      if (options.fail) return Promise.reject(new Error('redis down'));
      writes.push(update);
      return Promise.resolve('accepted');
    }),
  };
  const controller = new AbortController();
  const logs = new LogCapture();
  const ctx = new TaskContext({
    taskId: 't1',
    tool: 'tool',
    attempt: 1,
    signal: controller.signal,
    store,
    progressIntervalMs: options.progressIntervalMs ?? 0,
    logger: logs.logger().child({ taskId: 't1', tool: 'tool' }),
  });
  return { ctx, controller, writes, store, logs };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('ctx.progress', () => {
  it('throws RangeError for a non-finite progress or total', () => {
    const { ctx } = makeContext();
    expect(() => ctx.progress(Number.NaN)).toThrow(RangeError);
    expect(() => ctx.progress(Number.POSITIVE_INFINITY)).toThrow(RangeError);
    expect(() => ctx.progress(1, Number.NaN)).toThrow(RangeError);
    expect(() => ctx.progress('1' as unknown as number)).toThrow(RangeError);
  });

  it('drops a value not greater than the last accepted one, with a debug line', async () => {
    const { ctx, writes, logs } = makeContext();
    ctx.progress(1, 10);
    ctx.progress(3, 10, 'three');
    ctx.progress(3, 10);
    ctx.progress(2, 10);
    ctx.progress(4);
    await ctx.flushProgress();
    expect(writes).toEqual([{ progress: 1, total: 10 }, { progress: 3, total: 10, message: 'three' }, { progress: 4 }]);
    expect(logs.lines.filter((l) => l.msg === 'progress not greater than the last value dropped')).toHaveLength(2);
  });

  it('coalesces values within the interval and writes the newest when it ends', async () => {
    vi.useFakeTimers();
    const { ctx, writes } = makeContext({ progressIntervalMs: 50 });
    for (let i = 1; i <= 100; i++) ctx.progress(i, 100);
    await vi.advanceTimersByTimeAsync(0);
    expect(writes.map((w) => w.progress)).toEqual([1]);
    await vi.advanceTimersByTimeAsync(50);
    expect(writes.map((w) => w.progress)).toEqual([1, 100]);
  });

  it('flushProgress writes the pending value before it resolves', async () => {
    vi.useFakeTimers();
    const { ctx, writes } = makeContext({ progressIntervalMs: 10_000 });
    ctx.progress(1, 2);
    ctx.progress(2, 2, 'done');
    await ctx.flushProgress();
    expect(writes).toEqual([
      { progress: 1, total: 2 },
      { progress: 2, total: 2, message: 'done' },
    ]);
  });

  it('a failed write is logged, never thrown into the tool', async () => {
    const { ctx, logs } = makeContext({ fail: true });
    expect(() => ctx.progress(1)).not.toThrow();
    await ctx.flushProgress();
    expect(logs.find('progress write failed')).toMatchObject({ level: 40, taskId: 't1', tool: 'tool' });
  });

  it('is ignored after the run is closed, and a pending value is dropped', async () => {
    vi.useFakeTimers();
    const { ctx, writes } = makeContext({ progressIntervalMs: 50 });
    ctx.progress(1);
    ctx.progress(2);
    ctx.close();
    ctx.progress(3);
    await vi.advanceTimersByTimeAsync(100);
    await ctx.flushProgress();
    expect(writes.map((w) => w.progress)).toEqual([1]);
  });
});

describe('ctx.sleep', () => {
  it('resolves after its delay', async () => {
    vi.useFakeTimers();
    const { ctx } = makeContext();
    let done = false;
    void ctx.sleep(1_000).then(() => (done = true));
    await vi.advanceTimersByTimeAsync(999);
    expect(done).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    expect(done).toBe(true);
  });

  it('rejects at once with a CancelledError carrying the reason when the signal aborts, and clears its timer', async () => {
    vi.useFakeTimers();
    const { ctx, controller } = makeContext();
    const sleeping = ctx.sleep(60_000);
    expect(vi.getTimerCount()).toBe(1);
    controller.abort('TIMEOUT');
    await expect(sleeping).rejects.toSatisfy(
      (error: unknown) => error instanceof CancelledError && error.reason === 'TIMEOUT' && error.code === 'CANCELLED',
    );
    expect(vi.getTimerCount()).toBe(0);
  });

  it('rejects at once when the signal has already aborted', async () => {
    const { ctx, controller } = makeContext();
    controller.abort('CLIENT_CANCELLED');
    await expect(ctx.sleep(0)).rejects.toBeInstanceOf(CancelledError);
  });

  it('rejects a negative or non-finite delay with RangeError', async () => {
    const { ctx } = makeContext();
    await expect(ctx.sleep(-1)).rejects.toBeInstanceOf(RangeError);
    await expect(ctx.sleep(Number.NaN)).rejects.toBeInstanceOf(RangeError);
  });
});

describe('ctx.throwIfCancelled', () => {
  it('throws a CancelledError with the reason only after the signal aborts', () => {
    const { ctx, controller } = makeContext();
    expect(() => ctx.throwIfCancelled()).not.toThrow();
    controller.abort('WORKER_SHUTDOWN');
    expect(() => ctx.throwIfCancelled()).toThrow(CancelledError);
    try {
      ctx.throwIfCancelled();
    } catch (error) {
      expect((error as CancelledError).reason).toBe('WORKER_SHUTDOWN');
    }
  });

  it('is safe to destructure from the context', () => {
    const { ctx } = makeContext();
    const { throwIfCancelled, progress, sleep } = ctx;
    expect(() => throwIfCancelled()).not.toThrow();
    expect(() => progress(1)).not.toThrow();
    expect(typeof sleep).toBe('function');
  });
});

describe('ctx.step with a version (PROTOCOL.md §12.1, §12.11)', () => {
  function withSteps(steps: Record<string, unknown>) {
    const written: Array<Record<string, unknown>> = [];
    const logs = new LogCapture();
    const ctx = new TaskContext({
      taskId: 't1',
      tool: 'tool',
      attempt: 2,
      signal: new AbortController().signal,
      store: { recordProgress: () => Promise.resolve('accepted' as const) },
      lock: { queue: 'q', token: 'tok' },
      progressIntervalMs: 0,
      logger: logs.logger().child({ taskId: 't1' }),
      record: { taskId: 't1', status: 'working', steps } as never,
      durable: {
        addTags: () => Promise.resolve('written' as const),
        setState: (_id: string, _lock: unknown, _field: string, value: unknown) => {
          written.push(value as Record<string, unknown>);
          return Promise.resolve('written' as const);
        },
        suspend: () => Promise.reject(new Error('not here')),
      },
    });
    return { ctx, written, logs };
  }

  it('returns the stored result of the same version, and runs a new version once, saying so', async () => {
    const { ctx, written, logs } = withSteps({ 'charge@1': { by: 1 } });
    expect(await ctx.step('charge', () => ({ by: 'again' }), { version: '1' })).toEqual({ by: 1 });
    const again = withSteps({ 'charge@1': { by: 1 } });
    expect(await again.ctx.step('charge', () => ({ by: 2 }), { version: '2' })).toEqual({ by: 2 });
    expect(again.written.at(-1)).toEqual({ 'charge@1': { by: 1 }, 'charge@2': { by: 2 } });
    expect(
      again.logs.lines.some((l) => String(l.msg).startsWith('ctx.step runs a step earlier runs never stored')),
    ).toBe(true);
    expect(written).toEqual([]);
    expect(logs.lines).toEqual([]);
    await expect(ctx.step('charge', () => 1, { version: 'bad version' })).rejects.toThrow(TypeError);
  });
});

/**
 * A run's terminal write through a failover (PROTOCOL.md §10.10): retried while the lock may still be the run's, then
 * given up with a line naming what was lost; and the cancel sweep never reads a failed read as "task missing".
 */
import { describe, expect, it } from 'vitest';
import { ReplyError } from 'ioredis';
import {
  createLogger,
  type Logger,
  type TaskStore,
  type TaskRecords,
  type Keys,
  type RedisClient,
} from '@taskrelay/shared';
import { writeThroughOutage } from '../src/engine/end-write.js';
import { CancelWatch } from '../src/engine/cancel-watch.js';
import { RunningJobs } from '../src/engine/running-jobs.js';

/** A logger whose lines (level and message) are kept. */
function recordingLogger(): { log: Logger; lines: Array<{ level: string; msg: string }> } {
  const lines: Array<{ level: string; msg: string }> = [];
  const log = createLogger('worker', { level: 'silent' });
  for (const level of ['info', 'warn', 'error'] as const) {
    (log as unknown as Record<string, unknown>)[level] = (fields: unknown, msg?: string) => {
      lines.push({ level, msg: typeof fields === 'string' ? fields : (msg ?? '') });
    };
  }
  return { log, lines };
}

const redirections = () => new Error('Too many Cluster redirections. Last error: Error: Connection is closed.');

describe('writeThroughOutage', () => {
  it('keeps trying a write that fails with a failover error until it goes through, and says so', async () => {
    const { log, lines } = recordingLogger();
    let tries = 0;
    const value = await writeThroughOutage(
      () => {
        tries += 1;
        if (tries <= 3)
          return Promise.reject(tries === 2 ? new ReplyError('CLUSTERDOWN The cluster is down') : redirections());
        return Promise.resolve('written');
      },
      { windowMs: 10_000, log, what: 'result' },
    );
    expect(value).toBe('written');
    expect(tries).toBe(4);
    expect(lines.map((l) => l.level)).toEqual(['warn', 'info']);
    expect(lines[0]?.msg).toMatch(/^result write failed: Redis unreachable; retrying/);
    expect(lines[1]?.msg).toBe('result written after Redis answered again');
  });

  it('gives up once the lock can no longer be the run’s, naming what was lost', async () => {
    const { log, lines } = recordingLogger();
    let tries = 0;
    const started = Date.now();
    await expect(
      writeThroughOutage(
        () => {
          tries += 1;
          return Promise.reject(redirections());
        },
        { windowMs: 400, log, what: 'failure' },
      ),
    ).rejects.toThrow(/Too many Cluster redirections/);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(tries).toBeGreaterThanOrEqual(2);
    expect(lines.at(-1)).toEqual({
      level: 'error',
      msg: 'failure lost: Redis unreachable for as long as this run could hold the job lock; the job returns to the queue and runs again',
    });
  });

  it('does not retry an error Redis answered with', async () => {
    const { log, lines } = recordingLogger();
    let tries = 0;
    await expect(
      writeThroughOutage(
        () => {
          tries += 1;
          return Promise.reject(new ReplyError('ERR wrong number of arguments'));
        },
        { windowMs: 10_000, log, what: 'result' },
      ),
    ).rejects.toThrow(/wrong number/);
    expect(tries).toBe(1);
    expect(lines).toEqual([]);
  });
});

describe('the cancel sweep during a failover', () => {
  function sweepWith(states: Awaited<ReturnType<TaskRecords['endStates']>>) {
    const { log, lines } = recordingLogger();
    const running = new RunningJobs(log);
    const unread = running.add('unread');
    const ended = running.add('ended');
    const store = { records: { endStates: () => Promise.resolve(states) } } as unknown as TaskStore;
    const watch = new CancelWatch({
      subscriber: {} as RedisClient,
      keys: {} as Keys,
      store,
      running,
      log,
      sweepMs: 60_000,
    });
    return { watch, unread, ended, lines };
  }

  it('leaves a run whose task it could not read alone, and aborts the one it read as ended', async () => {
    const { watch, unread, ended, lines } = sweepWith([undefined, { status: undefined }]);
    await watch.sweep();
    expect(unread.controller.signal.aborted).toBe(false);
    expect(ended.controller.signal.reason).toBe('LOCK_LOST');
    expect(lines.some((l) => l.msg === 'cancel sweep could not read some running tasks; left running')).toBe(true);
  });
});

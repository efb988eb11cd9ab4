import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, keyLayoutOf, loadWorkerConfig, workerSettingsShape } from '@taskrelay/shared';
import { defineTool } from '../src/define-tool.js';
import { resolveWorkerOptions, startWorker } from '../src/worker.js';
import { LogCapture } from './harness.js';

const tool = (name: string) => defineTool({ name, description: 'A tool.', inputSchema: z.object({}), run: () => 'ok' });
const logger = new LogCapture().logger();

describe('worker options', () => {
  it('apply the documented defaults', () => {
    const resolved = resolveWorkerOptions({ redisUrl: 'redis://127.0.0.1:6379', tools: [tool('a')], logger });
    expect(resolved).toMatchObject({
      redisUrl: 'redis://127.0.0.1:6379',
      prefix: 'taskrelay',
      queue: 'default',
      concurrency: 8,
      lockDurationMs: 30_000,
      heartbeatMs: 5_000,
      progressIntervalMs: 50,
      abortGraceMs: 5_000,
      cancelSweepMs: 2_000,
    });
    expect(resolved.workerId).toMatch(/^.+-\d+-[0-9a-f]{6}$/);
  });

  it('accept the Redis URL as connection', () => {
    expect(resolveWorkerOptions({ connection: 'redis://h:1', tools: [tool('a')], logger }).redisUrl).toBe(
      'redis://h:1',
    );
  });

  it('accept Cluster and Sentinel targets, and refuse a cluster without a {prefix}', () => {
    const cluster = 'redis+cluster://127.0.0.1:7000,127.0.0.1:7001';
    expect(resolveWorkerOptions({ redisUrl: cluster, prefix: '{tr}', tools: [tool('a')], logger }).redisUrl).toBe(
      cluster,
    );
    expect(() => resolveWorkerOptions({ redisUrl: cluster, keyLayout: 'single', tools: [tool('a')], logger })).toThrow(
      /^Invalid worker options: prefix must be wrapped in \{\} on a Redis Cluster/,
    );
    // An unbraced prefix on a cluster is the sharded layout (PROTOCOL.md §1.1).
    const sharded = resolveWorkerOptions({ redisUrl: cluster, tools: [tool('a')], logger });
    expect(keyLayoutOf(sharded.redisUrl, sharded.prefix, sharded.keyLayout)).toBe('sharded');
    const sentinel = 'redis+sentinel://127.0.0.1:26379/mymaster';
    expect(resolveWorkerOptions({ redisUrl: sentinel, tools: [tool('a')], logger }).redisUrl).toBe(sentinel);
    expect(() => resolveWorkerOptions({ redisUrl: 'http://h:1', tools: [tool('a')], logger })).toThrow(
      /redisUrl must be a redis:\/\/, rediss:\/\/, redis\+cluster:\/\/ or redis\+sentinel:\/\/ target/,
    );
  });

  it('reject two tools with one name', async () => {
    await expect(
      startWorker({ redisUrl: 'redis://127.0.0.1:6379', tools: [tool('a'), tool('a')], logger }),
    ).rejects.toThrow(new ConfigError('Invalid worker options: two tools are named "a"'));
  });

  it('reject a missing Redis URL, an empty tool list, non-tools and unknown options', () => {
    expect(() => resolveWorkerOptions({ tools: [tool('a')], logger })).toThrow(/redisUrl is required/);
    expect(() => resolveWorkerOptions({ redisUrl: 'redis://h:1', tools: [], logger })).toThrow(/at least one tool/);
    expect(() => resolveWorkerOptions({ redisUrl: 'redis://h:1', tools: [{ name: 'x' }] as never, logger })).toThrow(
      /defineTool/,
    );
    expect(() =>
      resolveWorkerOptions({ redisUrl: 'redis://h:1', tools: [tool('a')], logger, concurency: 2 } as never),
    ).toThrow(ConfigError);
  });

  it('have the bounds and defaults of their environment variables: one schema for both', () => {
    const cases: Array<[string, string, number, RegExp]> = [
      ['lockDurationMs', 'WORKER_LOCK_DURATION_MS', 500, /must be at least 1000/],
      ['heartbeatMs', 'WORKER_HEARTBEAT_MS', 50, /must be at least 100/],
      ['cancelSweepMs', 'WORKER_CANCEL_SWEEP_MS', 20, /must be at least 50/],
      ['concurrency', 'WORKER_CONCURRENCY', 20_000, /must be at most 10000/],
      ['progressIntervalMs', 'TASKRELAY_PROGRESS_INTERVAL_MS', 90_000, /must be at most 60000/],
    ];
    for (const [option, variable, value, message] of cases) {
      expect(() =>
        resolveWorkerOptions({ redisUrl: 'redis://h:1', tools: [tool('a')], logger, [option]: value }),
      ).toThrow(new RegExp(`^Invalid worker options: ${option} ${message.source}$`));
      expect(() => loadWorkerConfig({ [variable]: String(value) })).toThrow(
        new RegExp(`^Invalid configuration: ${variable} ${message.source}`),
      );
    }
    // And the same defaults: an empty environment gives what startWorker applies.
    const fromEnv = loadWorkerConfig({});
    const resolved = resolveWorkerOptions({ redisUrl: 'redis://h:1', tools: [tool('a')], logger });
    for (const key of Object.keys(workerSettingsShape) as Array<keyof typeof workerSettingsShape>) {
      expect(resolved[key], key).toBe(fromEnv[key]);
    }
  });
});

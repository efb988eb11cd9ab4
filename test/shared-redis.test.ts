/**
 * One Redis per run (test/helpers/redis-global-setup.ts): every file of a project with the global setup gets the same
 * server from `startRedis()`, which it may not stop, and a file that must own its Redis still gets one of its own.
 */
import { Redis } from 'ioredis';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { startRedis, type TestRedis } from './helpers/redis.js';

const started: TestRedis[] = [];

afterAll(async () => {
  for (const redis of started) await redis.stop();
});

describe('the shared Redis of a run', () => {
  it('is what startRedis() hands out, and stop() leaves it running for the other files', async () => {
    const shared = inject('redisUrl');
    expect(shared).toMatch(/^redis:\/\//);
    const first = await startRedis();
    const second = await startRedis();
    expect(first.url).toBe(shared);
    expect(second.url).toBe(shared);
    expect(first.owned).toBe(false);
    await first.stop();
    const client = new Redis(shared ?? '', { maxRetriesPerRequest: 1 });
    try {
      expect(await client.ping()).toBe('PONG');
    } finally {
      client.disconnect();
    }
  });

  it('is not what a file that must own its Redis gets', async () => {
    const owned = await startRedis({ owned: true });
    started.push(owned);
    expect(owned.owned).toBe(true);
    expect(owned.url).not.toBe(inject('redisUrl'));
  });
});

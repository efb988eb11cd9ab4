/**
 * A tool's controls (PROTOCOL.md §3.3) as BullMQ's own `Queue` methods write them, read back by `readToolControls`:
 * one queue under the home prefix, and in the sharded layout a queue's shards read together.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { createKeys, type Keys } from '../src/protocol/keys.js';
import { readToolControls } from '../src/tool-controls.js';

let server: TestRedis;
let redis: Redis;
const queues: Queue[] = [];

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});
afterAll(async () => {
  await Promise.all(queues.map((q) => q.close()));
  redis?.disconnect();
  await server?.stop();
});

function bull(keys: Keys, queue: string): Queue {
  const q = new Queue(keys.queueName(queue), { connection: redis, prefix: keys.bullPrefix });
  queues.push(q);
  return q;
}

describe('§3.3 a tool queue’s controls', () => {
  it('reads what BullMQ wrote: paused, concurrency, rate limit', async () => {
    const keys = createKeys(uniquePrefix('controls'));
    const q = bull(keys, 'default~t');
    await q.setGlobalConcurrency(3);
    await q.setGlobalRateLimit(5, 1_000);
    await q.pause();
    expect(await readToolControls(redis, keys, ['default~t', 'default~none'])).toEqual([
      { paused: true, concurrency: 3, rateLimit: { max: 5, perMs: 1_000 }, active: 0 },
      { paused: false, active: 0 },
    ]);
  });

  it('sharded: reads every shard of a queue and sums them; paused only when every shard is', async () => {
    const keys = createKeys(uniquePrefix('controls-sharded'), 'sharded');
    const codes = ['a001', 'b002', 'c003'];
    const shards = codes.map((code) => bull(keys.forShard(code), 'default~hot'));
    for (const q of shards) {
      await q.setGlobalConcurrency(2);
      await q.setGlobalRateLimit(1, 1_000);
    }
    await shards[0]!.pause();
    await shards[1]!.pause();
    const placed = new Map([['default~hot', codes]]);
    // The home queue says nothing of them.
    expect(await readToolControls(redis, keys, ['default~hot'])).toEqual([{ paused: false, active: 0 }]);
    expect(await readToolControls(redis, keys, ['default~hot'], placed)).toEqual([
      { paused: false, concurrency: 6, rateLimit: { max: 3, perMs: 1_000 }, active: 0 },
    ]);
    await shards[2]!.pause();
    expect((await readToolControls(redis, keys, ['default~hot'], placed))[0]?.paused).toBe(true);
  });
});

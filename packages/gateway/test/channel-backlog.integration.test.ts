/**
 * PROTOCOL.md §1.2 and §22.4: in the sharded layout the gateway keeps one backlog hash per shard it subscribes to,
 * its budget split over the shards of each master (one server: all of them), and takes what it reads from a shard's
 * channel off that shard's hash only.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { backlogCost, createKeys, createLogger } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { ChannelBacklog } from '../src/tasks/channel-backlog.js';

let server: TestRedis;
let redis: Redis;

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
  await redis.config('SET', 'client-output-buffer-limit', 'pubsub 2mb 512kb 10');
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

describe('§1.2 the backlog budget per shard', () => {
  it('splits the budget over the shards and acks each shard’s reads to its own hash', async () => {
    const keys = createKeys(uniquePrefix('shard-backlog'), 'sharded');
    const channelShard = new Map(
      ['aaaa', 'bbbb', 'cccc'].map((code) => [keys.forShard(code).gatewayChannel('g1'), code]),
    );
    const backlog = new ChannelBacklog(redis, keys, 'g1', createLogger('test', { level: 'silent' }), (channel) =>
      channelShard.get(channel),
    );
    await backlog.start();
    try {
      const hash = (code: string) => keys.forShard(code).gatewayBacklog('g1');
      // No home hash: no script charges one in this layout.
      expect(await redis.exists(keys.gatewayBacklog('g1'))).toBe(0);
      await backlog.addShards(['aaaa', 'bbbb']);
      // Budget: half the 512 KiB soft limit, 256 KiB; two shards on the one server: 128 KiB each.
      for (const code of ['aaaa', 'bbbb'])
        expect(await redis.hmget(hash(code), 'max', 'bytes')).toEqual(['131072', '0']);
      await backlog.addShards(['cccc']);
      for (const code of ['aaaa', 'bbbb', 'cccc']) expect(await redis.hget(hash(code), 'max')).toBe(String(87_381));
      // A message published on aaaa's channel (the script charged it there) and read: taken off aaaa's hash only.
      const channel = keys.forShard('aaaa').gatewayChannel('g1');
      const raw = JSON.stringify({ type: 'progress', taskId: 'aaaa01', progress: 1 });
      await redis.hincrby(hash('aaaa'), 'bytes', backlogCost(channel, raw));
      await redis.hincrby(hash('bbbb'), 'bytes', 500);
      backlog.counted(channel, raw);
      await waitFor(async () => (await redis.hget(hash('aaaa'), 'bytes')) === '0', {
        message: 'the read was not taken off aaaa',
      });
      expect(await redis.hget(hash('bbbb'), 'bytes')).toBe('500');
      // A new subscriber: every shard's count starts again.
      backlog.resubscribed();
      await waitFor(async () => (await redis.hget(hash('bbbb'), 'bytes')) === '0', {
        message: 'bbbb was not reset',
      });
    } finally {
      backlog.close();
    }
  });
});

/**
 * `setAutoPipelining` (redis.ts): the gateway switches ioredis's autopipelining on while several requests are in
 * flight, so the commands of one event-loop turn leave as one write (issue 46). It leans on ioredis reading
 * `options.enableAutoPipelining` at every command: this test fails first if an ioredis upgrade stops doing so, and
 * checks that what goes out pipelined, scripts included, answers as it does alone.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { createRedis, setAutoPipelining, type RedisClient } from '../src/redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';

let server: TestRedis;
let client: RedisClient;

beforeAll(async () => {
  server = await startRedis();
  client = createRedis(server.url);
});

afterAll(async () => {
  client?.disconnect();
  await server?.stop();
});

describe('autopipelining follows the switch', () => {
  it('queues the commands of one turn while on, and sends each at once while off', async () => {
    const key = `${uniquePrefix('pipe')}:n`;
    setAutoPipelining(client, true);
    const on = [client.incr(key), client.incr(key), client.get(key)];
    expect(client.autoPipelineQueueSize).toBe(3);
    expect(await Promise.all(on)).toEqual([1, 2, '2']);

    setAutoPipelining(client, false);
    const off = [client.incr(key), client.get(key)];
    expect(client.autoPipelineQueueSize).toBe(0);
    expect(await Promise.all(off)).toEqual([3, '3']);
  });

  it('answers a pipelined script call as it answers one sent alone, and its refusal too', async () => {
    const keys = createKeys(uniquePrefix('pipe'));
    const store = new TaskStore(client, keys);
    const base = { tool: 'echo', queue: 'echo', principal: 'p', mode: 'task' as const, ttl: 60_000, pollInterval: 1000 };
    setAutoPipelining(client, true);
    try {
      const created = await Promise.all([1, 2, 3].map(() => store.records.create(base)));
      const read = await Promise.all(created.map((r) => store.records.get(r.taskId)));
      expect(read.map((r) => r?.taskId)).toEqual(created.map((r) => r.taskId));
      expect(read.every((r) => r?.status === 'working')).toBe(true);
      // A second create with a taken id is refused inside the script; pipelined, the refusal still reaches its caller.
      await expect(
        Promise.all([store.records.create({ ...base, taskId: created[0]!.taskId }), client.ping()]),
      ).rejects.toThrow();
    } finally {
      setAutoPipelining(client, false);
    }
  });
});

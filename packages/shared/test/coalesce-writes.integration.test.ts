/**
 * `coalesceWrites` (redis.ts): the gateway holds its command connection's writes until the end of the event-loop turn
 * in which a request arrived, so the commands of one turn leave as one write (issue 46). It leans on ioredis writing
 * each command to its public `stream` at once: this test fails first if an ioredis upgrade stops doing so, and checks
 * that what was held, scripts included, answers in order and as it does when sent alone.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { coalesceWrites, createRedis } from '../src/redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';

let server: TestRedis;
let client: Redis;

const endOfTurn = () => new Promise((resolve) => setImmediate(resolve));

beforeAll(async () => {
  server = await startRedis();
  client = createRedis(server.url) as Redis;
  await client.ping();
});

afterAll(async () => {
  client?.disconnect();
  await server?.stop();
});

describe('writes of one turn leave as one', () => {
  it('holds the commands of the turn on the socket, then sends them together, in order', async () => {
    const key = `${uniquePrefix('coalesce')}:n`;
    coalesceWrites(client);
    coalesceWrites(client); // a second request in the same turn: still one hold
    const replies = [client.incr(key), client.incr(key), client.get(key)];
    expect(client.stream.writableCorked).toBe(1);
    expect(client.stream.writableLength).toBeGreaterThan(0);
    await endOfTurn();
    expect(client.stream.writableCorked).toBe(0);
    expect(await Promise.all(replies)).toEqual([1, 2, '2']);
  });

  it('writes at once when nothing asked to hold them', async () => {
    const key = `${uniquePrefix('coalesce')}:n`;
    const reply = client.set(key, 'v');
    expect(client.stream.writableCorked).toBe(0);
    expect(client.stream.writableLength).toBe(0);
    expect(await reply).toBe('OK');
  });

  it('answers held script calls as it answers them alone, and a refusal reaches its caller', async () => {
    const store = new TaskStore(client, createKeys(uniquePrefix('coalesce')));
    const base = {
      tool: 'echo',
      queue: 'echo',
      principal: 'p',
      mode: 'task' as const,
      ttl: 60_000,
      pollInterval: 1000,
    };
    coalesceWrites(client);
    const created = await Promise.all([1, 2, 3].map(() => store.records.create(base)));
    coalesceWrites(client);
    const read = await Promise.all(created.map((r) => store.records.get(r.taskId)));
    expect(read.map((r) => r?.taskId)).toEqual(created.map((r) => r.taskId));
    expect(read.every((r) => r?.status === 'working')).toBe(true);
    coalesceWrites(client);
    await expect(store.records.create({ ...base, taskId: created[0]!.taskId })).rejects.toThrow();
  });
});

/**
 * Write coalescing (`protocol/write-coalescing.ts`, PROTOCOL.md §21.2.2): while a client is marked busy, its script
 * calls of one event-loop turn leave in one socket write, in the order they were made. It leans on ioredis writing
 * each command to its public `stream` at once: this test fails first if an ioredis upgrade stops doing so, and checks
 * that held calls answer as they do alone, a refusal included, and that a client not marked busy writes at once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { createRedis } from '../src/redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { coalesceEveryCommand, setWriteCoalescing } from '../src/protocol/write-coalescing.js';
import { TaskStore } from '../src/store/task-store.js';

let server: TestRedis;
let client: Redis;

const endOfTurn = () => new Promise((resolve) => setImmediate(resolve));
const base = { tool: 'echo', queue: 'echo', principal: 'p', mode: 'task' as const, ttl: 60_000, pollInterval: 1000 };

beforeAll(async () => {
  server = await startRedis();
  client = createRedis(server.url) as Redis;
  await client.ping();
});

afterAll(async () => {
  client?.disconnect();
  await server?.stop();
});

describe('write coalescing', () => {
  it('holds the script calls of a busy client to the end of the turn, then sends them in order', async () => {
    const store = new TaskStore(client, createKeys(uniquePrefix('coalesce')));
    setWriteCoalescing(client, true);
    try {
      const creates = [1, 2, 3].map(() => store.records.create(base));
      // Held: nothing has left the socket yet, in one cork however many calls the turn made.
      expect(client.stream.writableCorked).toBe(1);
      expect(client.stream.writableLength).toBeGreaterThan(0);
      await endOfTurn();
      expect(client.stream.writableCorked).toBe(0);
      const created = await Promise.all(creates);
      const read = await Promise.all(created.map((r) => store.records.get(r.taskId)));
      expect(read.map((r) => r?.taskId)).toEqual(created.map((r) => r.taskId));
      expect(read.every((r) => r?.status === 'working')).toBe(true);
      // A refusal inside a held script reaches its caller.
      await expect(store.records.create({ ...base, taskId: created[0]!.taskId })).rejects.toThrow();
    } finally {
      setWriteCoalescing(client, false);
    }
  });

  it('keeps the order of the calls it holds and of plain commands made after them in the turn', async () => {
    const key = `${uniquePrefix('coalesce')}:order`;
    const store = new TaskStore(client, createKeys(uniquePrefix('coalesce')));
    setWriteCoalescing(client, true);
    try {
      const created = store.records.create(base);
      const pushed = [client.rpush(key, 'a'), client.rpush(key, 'b')];
      expect(client.stream.writableCorked).toBe(1);
      await Promise.all([created, ...pushed]);
      expect(await client.lrange(key, 0, -1)).toEqual(['a', 'b']);
    } finally {
      setWriteCoalescing(client, false);
    }
  });

  it("holds every command of a connection another library drives (a worker's BullMQ connection), while busy", async () => {
    const other = createRedis(server.url) as Redis;
    await other.ping();
    try {
      coalesceEveryCommand(other);
      const key = `${uniquePrefix('coalesce')}:every`;
      // Not busy: written at once.
      const first = other.rpush(key, 'a');
      expect(other.stream.writableCorked).toBe(0);
      await first;
      setWriteCoalescing(other, true);
      // Busy: a plain command, not a script call of ours, holds the socket to the end of the turn.
      const held = [other.rpush(key, 'b'), other.rpush(key, 'c')];
      expect(other.stream.writableCorked).toBe(1);
      expect(other.stream.writableLength).toBeGreaterThan(0);
      await endOfTurn();
      expect(other.stream.writableCorked).toBe(0);
      await Promise.all(held);
      expect(await other.lrange(key, 0, -1)).toEqual(['a', 'b', 'c']);
    } finally {
      other.disconnect();
    }
  });

  it('writes at once for a client not marked busy', async () => {
    const store = new TaskStore(client, createKeys(uniquePrefix('coalesce')));
    const created = store.records.create(base);
    expect(client.stream.writableCorked).toBe(0);
    expect(client.stream.writableLength).toBe(0);
    expect((await created).status).toBe('working');
  });
});

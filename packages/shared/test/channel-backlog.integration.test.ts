/**
 * PROTOCOL.md §22.4: what waits for a gateway on its channel is bounded by its budget. The progress and log scripts
 * publish a tool message only while it fits; a log message that does not is counted and told with the next one.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { ChannelBacklogStore, backlogBudget, backlogCost } from '../src/channel-backlog.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';

let server: TestRedis;
let redis: Redis;
let sub: Redis;

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
  sub = new Redis(server.url);
});

afterAll(async () => {
  redis?.disconnect();
  sub?.disconnect();
  await server?.stop();
});

const base = {
  tool: 't',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
};

describe('§22.4 a gateway channel’s backlog', () => {
  it('budgets half the smaller pubsub limit, within 128 KiB and 4 MiB', () => {
    const defaults = 'normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60';
    expect(backlogBudget(defaults)).toBe(4 * 1024 * 1024);
    expect(backlogBudget('pubsub 1048576 262144 10')).toBe(128 * 1024);
    expect(backlogBudget('pubsub 2000000 0 0')).toBe(1_000_000);
    expect(backlogBudget('pubsub 0 0 0')).toBe(4 * 1024 * 1024);
    expect(backlogBudget(undefined)).toBe(4 * 1024 * 1024);
  });

  it('publishes no tool message past the budget; a dropped log message is told with the next that fits', async () => {
    const keys = createKeys(uniquePrefix('backlog'));
    const store = new TaskStore(redis, keys);
    const backlog = new ChannelBacklogStore(redis, keys);
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    const channel = keys.gatewayChannel('g1');
    const got: string[] = [];
    sub.on('message', (c: string, m: string) => void (c === channel && got.push(m)));
    await sub.subscribe(channel);
    // Room for two 40 KB messages, not a third, nor a 4 KB progress message after them.
    await backlog.ack('g1', 0, { max: 83_000, ttlMs: 60_000, reset: true });
    const data = { filler: 'x'.repeat(40_000) };
    expect(await store.runs.recordLog(taskId, { level: 'info', data })).toBe('published');
    expect(await store.runs.recordLog(taskId, { level: 'info', data })).toBe('published');
    expect(await store.runs.recordLog(taskId, { level: 'info', data })).toBe('dropped');
    expect(await store.runs.recordLog(taskId, { level: 'info', data })).toBe('dropped');
    // Progress past the budget is stored, not published.
    expect(await store.runs.recordProgress(taskId, { progress: 1, message: 'm'.repeat(4_000) })).toBe('accepted');
    expect((await store.records.get(taskId))?.progress).toBe(1);
    await waitFor(() => got.length === 2);
    const bytes = Number(await redis.hget(keys.gatewayBacklog('g1'), 'bytes'));
    expect(bytes).toBe(got.reduce((n, m) => n + backlogCost(channel, m), 0));
    // A heartbeat with nothing read keeps the count and the hash, and takes a changed budget.
    expect(await backlog.ack('g1', 0, { max: 84_000, ttlMs: 60_000 })).toBe(bytes);
    expect(await redis.hget(keys.gatewayBacklog('g1'), 'max')).toBe('84000');
    await backlog.ack('g1', 0, { max: 83_000, ttlMs: 60_000 });
    // The gateway reads them: room again. The next message comes after a warning with the count.
    expect(await backlog.ack('g1', bytes, { max: 83_000, ttlMs: 60_000 })).toBe(0);
    expect(await store.runs.recordLog(taskId, { level: 'info', data: 'after' })).toBe('published');
    await waitFor(() => got.length === 4);
    expect(JSON.parse(got[2]!)).toMatchObject({
      type: 'log',
      taskId,
      level: 'warning',
      logger: 'taskrelay',
      data: { dropped: 2 },
    });
    expect(JSON.parse(got[3]!)).toMatchObject({ type: 'log', level: 'info', data: 'after' });
    // Told once: the count starts again.
    expect(await store.runs.recordLog(taskId, { level: 'info', data: 'again' })).toBe('published');
    await waitFor(() => got.length === 5);
    expect(JSON.parse(got[4]!)).toMatchObject({ data: 'again' });
    // A gateway without the hash (gone) bounds nothing.
    await redis.del(keys.gatewayBacklog('g1'));
    for (let i = 0; i < 5; i++) expect(await store.runs.recordLog(taskId, { level: 'info', data })).toBe('published');
    await sub.unsubscribe(channel);
  });
});

import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { FairShare, MAX_FAIR_PRIORITY } from '../src/fair-share.js';
import { StoreRunner } from '../src/store/store-runner.js';
import { TaskStore } from '../src/store/task-store.js';

const db = useRedis();

function share() {
  const keys = createKeys(uniquePrefix('fair'));
  const fair = new FairShare(new StoreRunner(db.redis, keys));
  const enter = async (principal: string, jobId: string) => {
    return fair.enter('pool', principal, jobId, 60_000);
  };
  return { keys, fair, enter };
}

describe('25. fair share priorities', () => {
  it('gives a principal with nothing waiting priority 1, ahead of another principal’s backlog', async () => {
    const { enter } = share();
    const alice = [];
    for (let i = 0; i < 5; i++) alice.push(await enter('alice', `a${i}`));
    expect(alice).toEqual([1, 2, 3, 4, 5]);
    expect(await enter('bob', 'b0')).toBe(1);
    expect(await enter('bob', 'b1')).toBe(2);
  });

  it('keeps a principal’s own order while its backlog drains: a new job never gets below its newest waiting one', async () => {
    const { enter, fair } = share();
    for (let i = 0; i < 5; i++) await enter('alice', `a${i}`);
    // Workers take the three lowest; two wait, with priorities 4 and 5.
    for (const id of ['a0', 'a1', 'a2']) await fair.leave('pool', 'alice', id);
    expect(await enter('alice', 'a5')).toBe(5);
    // Once nothing of hers waits, she starts again from 1.
    for (const id of ['a3', 'a4', 'a5']) await fair.leave('pool', 'alice', id);
    expect(await enter('alice', 'a6')).toBe(1);
  });

  it('leaving is idempotent, and the share key expires with its newest job', async () => {
    const { enter, fair, keys } = share();
    await enter('alice', 'a0');
    await fair.leave('pool', 'alice', 'a0');
    await fair.leave('pool', 'alice', 'a0');
    expect(await db.redis.zcard(keys.fairShare('pool', 'alice'))).toBe(0);
    await enter('alice', 'a1');
    const ttl = await db.redis.pttl(keys.fairShare('pool', 'alice'));
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });

  it('gives concurrent enters of one principal distinct priorities (one script: no two read the same backlog)', async () => {
    const { enter } = share();
    const priorities = await Promise.all(Array.from({ length: 20 }, (_, i) => enter('alice', `a${i}`)));
    expect([...priorities].sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
  });

  it('enters a task’s job in its share when the task is created with fairShare, in the same step', async () => {
    const { keys, fair } = share();
    const store = new TaskStore(db.redis, keys);
    const base = {
      tool: 't',
      queue: 'pool',
      principal: 'alice',
      mode: 'call' as const,
      ttl: 60_000,
      pollInterval: 1000,
    };
    const first = await store.records.createTask({ ...base, fairShare: { ttlMs: 60_000 } });
    const second = await store.records.createTask({ ...base, fairShare: { ttlMs: 60_000 } });
    expect([first.priority, second.priority]).toEqual([1, 2]);
    const shareKey = keys.fairShare('pool', 'alice');
    expect(await db.redis.zrange(shareKey, 0, -1)).toEqual([first.record.taskId, second.record.taskId]);
    expect(await db.redis.pttl(shareKey)).toBeGreaterThan(50_000);
    // The same share as `enter`: the next job of alice's goes behind both.
    expect(await fair.enter('pool', 'alice', 'a3', 60_000)).toBe(3);
    // Without fairShare, nothing is entered.
    const plain = await store.records.createTask({ ...base, principal: 'bob' });
    expect(plain.priority).toBeUndefined();
    expect(await db.redis.exists(keys.fairShare('pool', 'bob'))).toBe(0);
  });

  it('caps priorities at BullMQ’s highest value', async () => {
    const { enter, keys } = share();
    await db.redis.zadd(keys.fairShare('pool', 'alice'), MAX_FAIR_PRIORITY, 'deep');
    expect(await enter('alice', 'a0')).toBe(MAX_FAIR_PRIORITY);
  });
});

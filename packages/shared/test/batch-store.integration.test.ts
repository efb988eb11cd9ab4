/**
 * PROTOCOL.md §26: the batch scripts against a real Redis. A child's outcome is recorded exactly once, only under its
 * job lock; the parent is woken once per window; a child of an ended parent, a stopped batch or a recorded outcome
 * does not start; ended children leave the principal's open work.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { BatchStore } from '../src/batch-store.js';
import { createKeys } from '../src/keys.js';
import { TASK_FIELDS as F } from '../src/task-fields.js';

let server: TestRedis;
let redis: Redis;

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

const PARENT = 'aaaa';
const SHAPE = { childTool: 'c', childPool: 'cp', parentPool: 'pp', concurrency: 4, failFast: false, owner: 'alice' };

async function batch(size: number, shape = SHAPE) {
  const keys = createKeys(uniquePrefix('batch'));
  const store = new BatchStore(redis, keys);
  await redis.hset(keys.task(PARENT), F.status, 'working');
  await redis.set(keys.bullJobLock('pp', PARENT), 'parent-token');
  const items = Array.from({ length: size }, (_v, i) => JSON.stringify({ i }));
  expect(await store.create(PARENT, { queue: 'pp', token: 'parent-token' }, shape, items, 60_000)).toBe('created');
  /** Gives child `index` a lock held by `token`, as BullMQ does when a worker takes its job. */
  const lockChild = (index: number, token: string) => redis.set(keys.bullJobLock('cp', `${PARENT}.${index}`), token);
  return { keys, store, lockChild, lock: (token: string) => ({ queue: 'cp', token }) };
}

describe('26. batch store', () => {
  it('stores a batch once: a replay of the parent writes nothing, a run without the lock is refused', async () => {
    const { store, keys } = await batch(3);
    expect(await store.create(PARENT, { queue: 'pp', token: 'parent-token' }, SHAPE, ['{}'], 60_000)).toBe('exists');
    expect(await store.create(PARENT, { queue: 'pp', token: 'other' }, SHAPE, ['{}'], 60_000)).toBe('lock_lost');
    expect(await store.items(PARENT, 0, 10)).toEqual(['{"i":0}', '{"i":1}', '{"i":2}']);
    expect(await redis.llen(keys.batch(PARENT).items)).toBe(3);
  });

  it('records a child exactly once, and only under its job lock', async () => {
    const { store, lockChild, lock, keys } = await batch(2);
    await store.open(PARENT, 0, 2, 2);
    await lockChild(0, 't1');
    expect(await store.recordChild(PARENT, 0, 'alice', lock('stale'), { status: 'completed' })).toEqual({
      outcome: 'lock_lost',
    });
    const first = await store.recordChild(PARENT, 0, 'alice', lock('t1'), { status: 'completed' });
    expect(first).toMatchObject({ outcome: 'recorded', done: 1, size: 2, failed: 0 });
    // The same child again (a second run after a stall, holding the lock now): counted once.
    await lockChild(0, 't2');
    expect(await store.recordChild(PARENT, 0, 'alice', lock('t2'), { status: 'failed' })).toEqual({
      outcome: 'duplicate',
    });
    const counts = await store.peek(PARENT);
    expect(counts).toMatchObject({ completed: 1, failed: 0, open: 1 });
    expect(await store.outcomes(PARENT, 0, 2)).toEqual([{ status: 'completed' }, undefined]);
    expect(await redis.scard(keys.batch(PARENT).open)).toBe(1);
  });

  it('wakes the parent once per half window and when the last child is recorded', async () => {
    const { store, lockChild, lock } = await batch(6);
    await store.open(PARENT, 0, 4, 4);
    await store.released(PARENT, 4, 0);
    const wakes: boolean[] = [];
    for (const index of [0, 1, 2, 3]) {
      await lockChild(index, 't');
      const recorded = await store.recordChild(PARENT, index, 'alice', lock('t'), { status: 'completed' });
      wakes.push(recorded.outcome === 'recorded' && recorded.wake);
    }
    // Open 3, 2 (half of 4: wake), 1, 0.
    expect(wakes).toEqual([false, true, false, false]);
    expect((await store.peek(PARENT))?.wake).toBe(true);
    await store.open(PARENT, 4, 2, 4);
    await store.released(PARENT, 6, 4);
    await lockChild(4, 't');
    await lockChild(5, 't');
    expect(await store.recordChild(PARENT, 4, 'alice', lock('t'), { status: 'completed' })).toMatchObject({
      wake: false,
    });
    expect(await store.recordChild(PARENT, 5, 'alice', lock('t'), { status: 'failed' })).toMatchObject({
      done: 6,
      failed: 1,
      wake: true,
    });
  });

  it('wakes a fail-fast parent at the first failure', async () => {
    const { store, lockChild, lock } = await batch(10, { ...SHAPE, failFast: true });
    await store.open(PARENT, 0, 4, 4);
    await store.released(PARENT, 4, 0);
    await lockChild(2, 't');
    expect(await store.recordChild(PARENT, 2, 'alice', lock('t'), { status: 'failed' })).toMatchObject({
      wake: true,
    });
  });

  it('starts a child only while its parent is live, the batch not stopped and its outcome not recorded', async () => {
    const { store, lockChild, lock, keys } = await batch(3);
    await store.open(PARENT, 0, 3, 3);
    await lockChild(0, 't');
    expect(await store.startChild(PARENT, 0, lock('x'))).toEqual({ outcome: 'lock_lost' });
    expect(await store.startChild(PARENT, 0, lock('t'))).toEqual({ outcome: 'run', owner: 'alice', parentPool: 'pp' });
    expect(await store.runningCount(PARENT)).toBe(1);
    await store.recordChild(PARENT, 0, 'alice', lock('t'), { status: 'completed' });
    expect(await store.runningCount(PARENT)).toBe(0);
    expect(await store.startChild(PARENT, 0, lock('t'))).toEqual({ outcome: 'recorded' });
    await lockChild(1, 't');
    await store.stop(PARENT);
    expect(await store.startChild(PARENT, 1, lock('t'))).toEqual({ outcome: 'parent_ended' });
    await redis.hdel(keys.batch(PARENT).hash, 'stopped');
    await redis.hset(keys.task(PARENT), F.status, 'cancelled');
    expect(await store.startChild(PARENT, 1, lock('t'))).toEqual({ outcome: 'parent_ended' });
  });

  it('counts open children in the principal’s open work until they are recorded', async () => {
    const { store, lockChild, lock, keys } = await batch(2);
    const openWork = keys.principalOpenTasks('alice');
    await store.open(PARENT, 0, 2, 2, openWork);
    expect(await redis.zrange(openWork, 0, -1)).toEqual([`${PARENT}.0`, `${PARENT}.1`]);
    expect(await store.endedWork([`${PARENT}.0`, `${PARENT}.1`, 'gone-task'])).toEqual([false, false, true]);
    await lockChild(0, 't');
    await store.recordChild(PARENT, 0, 'alice', lock('t'), { status: 'completed' });
    expect(await redis.zrange(openWork, 0, -1)).toEqual([`${PARENT}.1`]);
    await redis.hset(keys.task(PARENT), F.status, 'cancelled');
    expect(await store.endedWork([`${PARENT}.1`])).toEqual([true]);
  });
});

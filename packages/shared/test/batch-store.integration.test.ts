/**
 * PROTOCOL.md §26: the batch scripts against a real Redis. A child's outcome is recorded exactly once, only under its
 * job lock; the parent is woken once per window; a child of an ended parent, a stopped batch or a recorded outcome
 * does not start; ended children leave the principal's open work.
 */
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { BatchStore } from '../src/batch-store.js';
import { StoreRunner } from '../src/store/store-runner.js';
import { FairShare, MAX_FAIR_PRIORITY } from '../src/fair-share.js';
import { createKeys } from '../src/protocol/keys.js';
import { TASK_FIELDS as F } from '../src/protocol/task-fields.js';

const db = useRedis();

const PARENT = 'aaaa';
const SHAPE = { childTool: 'c', childPool: 'cp', parentPool: 'pp', concurrency: 4, failFast: false, owner: 'alice' };

async function batch(size: number, shape = SHAPE) {
  const keys = createKeys(uniquePrefix('batch'));
  const store = new BatchStore(new StoreRunner(db.redis, keys));
  await db.redis.hset(keys.task(PARENT), F.status, 'working');
  await db.redis.set(keys.bullJobLock('pp', PARENT), 'parent-token');
  const items = Array.from({ length: size }, (_v, i) => JSON.stringify({ i }));
  expect(await store.create(PARENT, { queue: 'pp', token: 'parent-token' }, shape, items, 60_000)).toBe('created');
  /** Gives child `index` a lock held by `token`, as BullMQ does when a worker takes its job. */
  const lockChild = (index: number, token: string) => db.redis.set(keys.bullJobLock('cp', `${PARENT}.${index}`), token);
  /**
   * Releases the batch's next children as a parent does (§26.3 step 2): up to `concurrency` open, within `cap`, and
   * `released` moved past them. Resolves with the released children's priorities.
   */
  const open = async (concurrency: number, cap = 1_000) => {
    const { priorities } = await store.release(PARENT, {
      concurrency,
      cap,
      childPool: shape.childPool,
      owner: shape.owner,
      openWorkTtlMs: 60_000,
      shareTtlMs: 60_000,
    });
    return priorities;
  };
  return { keys, store, lockChild, open, lock: (token: string) => ({ queue: 'cp', token }) };
}

describe('26. batch store', () => {
  it('stores a batch once: a replay of the parent writes nothing, a run without the lock is refused', async () => {
    const { store, keys } = await batch(3);
    expect(await store.create(PARENT, { queue: 'pp', token: 'parent-token' }, SHAPE, ['{}'], 60_000)).toBe('exists');
    expect(await store.create(PARENT, { queue: 'pp', token: 'other' }, SHAPE, ['{}'], 60_000)).toBe('lock_lost');
    expect(await store.items(PARENT, 0, 10)).toEqual(['{"i":0}', '{"i":1}', '{"i":2}']);
    expect(await db.redis.llen(keys.batch(PARENT).items)).toBe(3);
  });

  it('records a child exactly once, and only under its job lock', async () => {
    const { store, lockChild, lock, keys, open } = await batch(2);
    await open(2);
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
    expect(await db.redis.scard(keys.batch(PARENT).open)).toBe(1);
  });

  it('wakes the parent once per half window and when the last child is recorded', async () => {
    const { store, lockChild, lock, open } = await batch(6);
    await open(4);
    const wakes: boolean[] = [];
    for (const index of [0, 1, 2, 3]) {
      await lockChild(index, 't');
      const recorded = await store.recordChild(PARENT, index, 'alice', lock('t'), { status: 'completed' });
      wakes.push(recorded.outcome === 'recorded' && recorded.wake);
    }
    // Open 3, 2 (half of 4: wake), 1, 0.
    expect(wakes).toEqual([false, true, false, false]);
    expect((await store.peek(PARENT))?.wake).toBe(true);
    await open(4);
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

  it('moves `released` in the release itself: no index is released twice, whatever the parent does after', async () => {
    const { store, keys, lockChild, lock, open } = await batch(10);
    // A parent that dies after its release (before or after adding the jobs) leaves 0..3 released.
    expect(await open(4)).toHaveLength(4);
    expect(await db.redis.hget(keys.batch(PARENT).hash, 'released')).toBe('4');
    for (const index of [0, 1, 2, 3]) {
      await lockChild(index, 't');
      await store.recordChild(PARENT, index, 'alice', lock('t'), { status: 'completed' });
    }
    // Its next run releases 4..7: a recorded child is never opened again (it would stay open for good).
    const { from, priorities } = await store.release(PARENT, {
      concurrency: 4,
      cap: 1_000,
      childPool: 'cp',
      owner: 'alice',
      openWorkTtlMs: 60_000,
      shareTtlMs: 60_000,
    });
    expect({ from, count: priorities.length }).toEqual({ from: 4, count: 4 });
    expect(await store.openIndices(PARENT)).toEqual([4, 5, 6, 7]);
  });

  it('wakes a fail-fast parent at the first failure', async () => {
    const { store, lockChild, lock, open } = await batch(10, { ...SHAPE, failFast: true });
    await open(4);
    await lockChild(2, 't');
    expect(await store.recordChild(PARENT, 2, 'alice', lock('t'), { status: 'failed' })).toMatchObject({
      wake: true,
    });
  });

  it('starts a child only while its parent is live, the batch not stopped and its outcome not recorded', async () => {
    const { store, lockChild, lock, keys, open } = await batch(3);
    await open(3);
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
    await db.redis.hdel(keys.batch(PARENT).hash, 'stopped');
    await db.redis.hset(keys.task(PARENT), F.status, 'cancelled');
    expect(await store.startChild(PARENT, 1, lock('t'))).toEqual({ outcome: 'parent_ended' });
  });

  it('counts open children in the principal’s open work until they are recorded', async () => {
    const { store, lockChild, lock, keys, open } = await batch(2);
    const openWork = keys.principalOpenTasks('alice');
    await open(2);
    expect(await db.redis.zrange(openWork, 0, -1)).toEqual([`${PARENT}.0`, `${PARENT}.1`]);
    expect(await store.endedWork([`${PARENT}.0`, `${PARENT}.1`, 'gone-task'])).toEqual([false, false, true]);
    await lockChild(0, 't');
    await store.recordChild(PARENT, 0, 'alice', lock('t'), { status: 'completed' });
    expect(await db.redis.zrange(openWork, 0, -1)).toEqual([`${PARENT}.1`]);
    await db.redis.hset(keys.task(PARENT), F.status, 'cancelled');
    expect(await store.endedWork([`${PARENT}.1`])).toEqual([true]);
  });

  it('gives released children the pool’s fair-share priorities, the same rule as every job (§25, §26.6)', async () => {
    const { store, keys, open } = await batch(12);
    const fair = new FairShare(new StoreRunner(db.redis, keys));
    // Alice has two tasks waiting in the child pool: her children queue behind them, one priority each.
    expect(await fair.enter('cp', 'alice', 't0', 60_000)).toBe(1);
    expect(await fair.enter('cp', 'alice', 't1', 60_000)).toBe(2);
    expect(await open(3)).toEqual([3, 4, 5]);
    // Bob has nothing waiting: his task goes ahead of her whole backlog, children included.
    expect(await fair.enter('cp', 'bob', 'b0', 60_000)).toBe(1);
    // Her next task queues behind her children, which the gateway's rule sees as her backlog.
    expect(await fair.enter('cp', 'alice', 't2', 60_000)).toBe(6);
    // Workers take everything of hers but one child; the next release never goes below her newest waiting job.
    for (const id of ['t0', 't1', 't2', `${PARENT}.0`, `${PARENT}.1`]) await fair.leave('cp', 'alice', id);
    expect(await open(5)).toEqual([5, 5]);
    const share = keys.fairShare('cp', 'alice');
    expect(await db.redis.zrange(share, 0, -1)).toEqual([`${PARENT}.2`, `${PARENT}.3`, `${PARENT}.4`]);
    expect(await db.redis.pttl(share)).toBeGreaterThan(0);
    // A re-add keeps a waiting child's entry, skips a child whose job is in the pool, and enters a vanished one.
    await db.redis.hset(`${keys.bullQueueKeyPrefix}cp:${PARENT}.3`, 'name', 'c');
    await fair.leave('cp', 'alice', `${PARENT}.3`);
    await fair.leave('cp', 'alice', `${PARENT}.4`);
    const placement = { childPool: 'cp', owner: 'alice', shareTtlMs: 60_000 };
    expect(await store.reenter(PARENT, [2, 3, 4], placement)).toEqual([5, 0, 5]);
    // A release whose job exists already (a parent killed after its add) adds nothing for it.
    expect(await store.reenter(PARENT, [3], placement)).toEqual([0]);
    // A deep backlog stays within BullMQ's priority range.
    await db.redis.zadd(share, MAX_FAIR_PRIORITY, 'deep');
    expect(await open(7)).toEqual([MAX_FAIR_PRIORITY, MAX_FAIR_PRIORITY]);
  });

  it('sizes the window against the open-work cap in the release, so batches released together share it', async () => {
    const first = await batch(50);
    const openWork = first.keys.principalOpenTasks('alice');
    await db.redis.zadd(openWork, 1, 'other-task');
    // Concurrency 30 asked for under a cap of 20, beside one other open task: 19.
    expect(await first.open(30, 20)).toHaveLength(19);
    expect(await db.redis.hget(first.keys.batch(PARENT).hash, 'window')).toBe('19');
    expect(await db.redis.zcard(openWork)).toBe(20);
    // A second batch of the same principal finds the cap full: one child.
    await db.redis.hset(first.keys.batch('bbbb').hash, 'size', '50', 'released', '0');
    const { window, priorities } = await first.store.release('bbbb', {
      concurrency: 30,
      cap: 20,
      childPool: 'cp',
      owner: 'alice',
      openWorkTtlMs: 60_000,
      shareTtlMs: 60_000,
    });
    expect({ window, released: priorities.length }).toEqual({ window: 1, released: 1 });
    // Ten of the first batch's children are recorded: its next release leaves room for the other two open.
    for (let index = 0; index < 10; index++) {
      await first.lockChild(index, 't');
      await first.store.recordChild(PARENT, index, 'alice', first.lock('t'), { status: 'completed' });
    }
    expect(await first.open(30, 20)).toHaveLength(9);
    expect(await db.redis.hget(first.keys.batch(PARENT).hash, 'window')).toBe('18');
    expect(await db.redis.zcard(openWork)).toBe(20);
  });

  it('counts released children in their principal’s open work, which expires even when no gateway counts it', async () => {
    const { keys, open } = await batch(4);
    const openWork = keys.principalOpenTasks('alice');
    await open(2);
    expect(await db.redis.zrange(openWork, 0, -1)).toEqual([`${PARENT}.0`, `${PARENT}.1`]);
    const ttl = await db.redis.pttl(openWork);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
    // A gateway's longer ttl is never shortened.
    await db.redis.pexpire(openWork, 600_000);
    await open(3);
    expect(await db.redis.pttl(openWork)).toBeGreaterThan(60_000);
    expect(await db.redis.hget(keys.batch(PARENT).hash, 'window')).toBe('3');
  });
});

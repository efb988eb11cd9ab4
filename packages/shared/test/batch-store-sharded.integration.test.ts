/**
 * PROTOCOL.md §26.10: the batch store in the sharded key layout, on one Redis (the layout's keys, not a cluster; the
 * cluster runs are test/batch-sharded.e2e.test.ts). Child `i` of a batch whose child tool has shards `c[0..2]` is
 * entered in the fair share of `c[i mod 3]`, with its job looked for there; the batch's own keys and the children's
 * open work stay on the parent's shard; a child's record is two steps (a claim under its lock on its shard, then the
 * count on the parent's), so a worker killed between them loses nothing and a second run counts the claim without
 * running the tool.
 */
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { BatchStore, childShard, type BatchOutcome } from '../src/batch-store.js';
import { StoreRunner } from '../src/store/store-runner.js';
import { bullJobKey } from '../src/protocol/bullmq-layout.js';
import { createKeys } from '../src/protocol/keys.js';
import { SCRIPTS } from '../src/protocol/scripts.js';
import { TASK_FIELDS as F } from '../src/protocol/task-fields.js';

const db = useRedis();

/** A parent on shard `aaaa`; its child tool on three other shards. */
const PARENT = 'aaaa0000000000000001';
const CODES = ['b001', 'c002', 'd003'];
const SHAPE = {
  childTool: 'c',
  childPool: 'cp',
  parentPool: 'pp',
  concurrency: 6,
  failFast: false,
  owner: 'alice',
  childCodes: CODES,
};

async function batch(size: number) {
  const keys = createKeys(uniquePrefix('sbatch'), 'sharded');
  const runner = new StoreRunner(db.redis, keys);
  const store = new BatchStore(runner);
  const p = keys.forTask(PARENT);
  await db.redis.hset(p.task(PARENT), F.status, 'working');
  await db.redis.set(p.bullJobLock('pp', PARENT), 'parent-token');
  const items = Array.from({ length: size }, (_v, i) => JSON.stringify({ i }));
  expect(await store.create(PARENT, { queue: 'pp', token: 'parent-token' }, SHAPE, items, 60_000)).toBe('created');
  const shardOf = (index: number) => keys.forShard(childShard(CODES, index) ?? '');
  const childId = (index: number) => `${PARENT}.${index}`;
  /** Gives child `index` a lock held by `token` on its own shard, as BullMQ does when a worker takes its job there. */
  const lockChild = (index: number, token: string) =>
    db.redis.set(shardOf(index).bullJobLock('cp', childId(index)), token);
  const lock = (index: number, token: string) => ({ queue: 'cp', token, shard: childShard(CODES, index) ?? '' });
  const placement = { childPool: 'cp', owner: 'alice', shareTtlMs: 60_000, childCodes: CODES };
  const open = async (concurrency: number) =>
    (await store.release(PARENT, { ...placement, concurrency, cap: 1_000, openWorkTtlMs: 60_000 })).priorities;
  return { keys, runner, store, shardOf, childId, lockChild, lock, placement, open };
}

describe('26.10 batch store, sharded layout', () => {
  it('keeps the child tool’s codes, puts child i in the fair share of code i mod 3, its open work on the parent’s shard', async () => {
    const { keys, store, shardOf, childId, open } = await batch(8);
    expect((await store.shape(PARENT))?.childCodes).toEqual(CODES);
    const priorities = await open(6);
    expect(priorities).toHaveLength(6);
    expect(priorities.every((p) => p > 0)).toBe(true);
    for (let i = 0; i < 6; i++) {
      for (const code of CODES) {
        const score = await db.redis.zscore(keys.forShard(code).fairShare('cp', 'alice'), childId(i));
        if (code === childShard(CODES, i)) expect(score).not.toBeNull();
        else expect(score).toBeNull();
      }
    }
    // Nothing entered on the parent's shard; the batch and the children's open work are there.
    const p = keys.forTask(PARENT);
    expect(await db.redis.zcard(p.fairShare('cp', 'alice'))).toBe(0);
    expect(await store.openIndices(PARENT)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(await db.redis.zcard(p.principalOpenTasks('alice'))).toBe(6);
    expect(await db.redis.zcard(shardOf(0).principalOpenTasks('alice'))).toBe(0);
    // Each shard's share ranks its own children in turn (the pool's one rule, §25).
    const onFirst = await db.redis.zrange(shardOf(0).fairShare('cp', 'alice'), 0, -1);
    expect(onFirst).toEqual([childId(0), childId(3)]);
  });

  it('re-adds on each child’s shard: a child whose job is there gets 0, the others keep their entry', async () => {
    const { store, shardOf, childId, open, placement } = await batch(6);
    const first = await open(6);
    // Child 4's job exists on its shard (c[1]); child 1's only on another shard, which does not count.
    await db.redis.hset(bullJobKey(`${shardOf(4).bullQueueKeyPrefix}cp`, childId(4)), 'name', 'c');
    await db.redis.hset(bullJobKey(`${shardOf(0).bullQueueKeyPrefix}cp`, childId(1)), 'name', 'c');
    const again = await store.reenter(PARENT, [1, 4, 5], placement);
    expect(again).toEqual([first[1], 0, first[5]]);
  });

  it('records a child in two steps: a run killed between them loses nothing, and the next run counts the claim', async () => {
    const { keys, runner, store, shardOf, childId, lockChild, lock, open } = await batch(3);
    await open(3);
    await lockChild(1, 't1');
    expect(await store.startChild(PARENT, 1, lock(1, 'stale'))).toEqual({ outcome: 'lock_lost' });
    expect(await store.startChild(PARENT, 1, lock(1, 't1'))).toMatchObject({ outcome: 'run', owner: 'alice' });
    // Step 1 of run t1 (the claim under its lock on the child's shard), then its worker dies.
    const done: BatchOutcome = { status: 'completed', result: { content: [{ type: 'text', text: 'one' }] } };
    const claim = await runner.scripts.call(SCRIPTS.batchClaim, {
      keys: { lock: shardOf(1).bullJobLock('cp', childId(1)), claim: shardOf(1).batchClaim(childId(1)) },
      args: { lockToken: 't1', outcome: JSON.stringify(done), ttlMs: 60_000 },
    });
    expect(claim.values[0]).toBe(JSON.stringify(done));
    expect((await store.peek(PARENT))?.completed).toBe(0);
    // The stall check gives the job to t2: its start finds the claim, so its tool is not run; its record counts it.
    await lockChild(1, 't2');
    const start = await store.startChild(PARENT, 1, lock(1, 't2'));
    expect(start).toEqual({ outcome: 'run', owner: 'alice', parentPool: 'pp', claimed: done });
    // Even a record of another outcome counts the claimed one.
    const recorded = await store.recordChild(PARENT, 1, 'alice', lock(1, 't2'), { status: 'failed' });
    expect(recorded).toMatchObject({ outcome: 'recorded', done: 1, failed: 0 });
    expect(await store.outcomes(PARENT, 0, 3)).toEqual([undefined, done, undefined]);
    expect(await db.redis.exists(shardOf(1).batchClaim(childId(1)))).toBe(0);
    // t1 comes back (it was only stalled): no lock, nothing written; a later run of the job does not start.
    expect(await store.recordChild(PARENT, 1, 'alice', lock(1, 't1'), { status: 'failed' })).toEqual({
      outcome: 'lock_lost',
    });
    expect(await store.startChild(PARENT, 1, lock(1, 't2'))).toEqual({ outcome: 'recorded' });
    expect(await store.peek(PARENT)).toMatchObject({ completed: 1, failed: 0, open: 2 });
    expect(await db.redis.zscore(keys.forTask(PARENT).principalOpenTasks('alice'), childId(1))).toBeNull();
  });

  it('counts a recorded child once when both steps run twice', async () => {
    const { store, lockChild, lock, open } = await batch(2);
    await open(2);
    await lockChild(0, 't');
    expect(await store.recordChild(PARENT, 0, 'alice', lock(0, 't'), { status: 'failed' })).toMatchObject({
      outcome: 'recorded',
      failed: 1,
    });
    expect(await store.recordChild(PARENT, 0, 'alice', lock(0, 't'), { status: 'completed' })).toEqual({
      outcome: 'duplicate',
    });
    expect(await store.peek(PARENT)).toMatchObject({ completed: 0, failed: 1, open: 1 });
  });
});

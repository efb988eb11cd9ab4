/**
 * PROTOCOL.md §26.3 step 2 against a real Redis: a parent run that dies between its release and the end of its run
 * (before its add, or after it) leaves a batch its next run carries on with. No index is released twice, and every
 * released child gets a job.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { z } from 'zod';
import {
  BatchStore,
  StoreRunner,
  TASK_FIELDS as F,
  batchChildId,
  createKeys,
  createLogger,
  toolQueue,
  type JobLock,
} from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { defineTool } from '../src/define-tool.js';
import { BatchParent } from '../src/engine/batch-parent.js';
import { BatchQueues } from '../src/engine/batch-queues.js';
import { WorkerMetrics } from '../src/metrics.js';

let server: TestRedis;
let redis: Redis;

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url, { maxRetriesPerRequest: null });
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

const PARENT = 'parent-1';
const child = defineTool({
  name: 'child',
  description: 'A batch child.',
  inputSchema: z.object({ i: z.number() }),
  run: ({ i }) => ({ i }),
});
const items = Array.from({ length: 12 }, (_v, i) => ({ i }));
const options = { tool: 'child', concurrency: 4, failFast: false };

async function setUp() {
  const keys = createKeys(uniquePrefix('bp'));
  const log = createLogger('worker', { level: 'silent' });
  const store = new BatchStore(new StoreRunner(redis, keys));
  const queues = new BatchQueues(redis, keys, log);
  const parent = new BatchParent({
    redis,
    keys,
    store,
    queues,
    ownQueueName: 'default',
    tools: new Map([['child', child]]),
    metrics: new WorkerMetrics(),
  });
  const lock: JobLock = { queue: 'pp', token: 'parent-token' };
  await redis.hset(keys.task(PARENT), F.status, 'working');
  await redis.set(keys.bullJobLock('pp', PARENT), lock.token);
  const host = parent.forRun(undefined);
  const run = () => host.fanOut({ taskId: PARENT, lock, record: undefined, log }, items, options);
  const pool = toolQueue('default', 'child');
  const queue = queues.get(pool);
  /** The children whose jobs are in the pool now. */
  const jobs = async () => {
    const found = await Promise.all(items.map((_v, i) => queue.getJob(batchChildId(PARENT, i))));
    return found.flatMap((job, i) => (job ? [i] : []));
  };
  /** Child `index` runs and is recorded, and its job ends (removed, as on completion). */
  const finish = async (index: number) => {
    await redis.set(keys.bullJobLock(pool, batchChildId(PARENT, index)), 't');
    const lockOf = { queue: pool, token: 't' };
    expect(await store.recordChild(PARENT, index, '', lockOf, { status: 'completed' })).toMatchObject({
      outcome: 'recorded',
    });
    await redis.del(keys.bullJobLock(pool, batchChildId(PARENT, index)));
    await queue.remove(batchChildId(PARENT, index));
  };
  return { keys, store, queue, queues, parent, log, run, jobs, finish };
}

describe('§26.3 a parent run that dies part way', () => {
  it('dies after its release and before its add: the next run adds the released children’s jobs', async () => {
    const { store, queue, queues, run, jobs } = await setUp();
    const addBulk = queue.addBulk.bind(queue);
    queue.addBulk = () => Promise.reject(new Error('killed before the add'));
    await expect(run()).rejects.toThrow('killed before the add');
    expect(await store.openIndices(PARENT)).toEqual([0, 1, 2, 3]);
    expect(await jobs()).toEqual([]);
    queue.addBulk = addBulk;
    expect(await run()).toEqual({ kind: 'wait', pollMs: expect.any(Number) as number });
    expect(await jobs()).toEqual([0, 1, 2, 3]);
    expect(await store.openIndices(PARENT)).toEqual([0, 1, 2, 3]);
    await queues.close();
  });

  it('dies after its add: children that finished meanwhile are never released again, the next window is', async () => {
    const { store, queue, queues, run, jobs, finish } = await setUp();
    const addBulk = queue.addBulk.bind(queue);
    queue.addBulk = async (...args) => {
      await addBulk(...args);
      throw new Error('killed after the add');
    };
    await expect(run()).rejects.toThrow('killed after the add');
    queue.addBulk = addBulk;
    expect(await jobs()).toEqual([0, 1, 2, 3]);
    for (const index of [0, 1, 2, 3]) await finish(index);
    // The next run (woken by the children, or its poll) releases 4..7, and nothing it released stays open.
    await run();
    expect(await store.openIndices(PARENT)).toEqual([4, 5, 6, 7]);
    expect(await jobs()).toEqual([4, 5, 6, 7]);
    for (const index of [4, 5, 6, 7]) await finish(index);
    await run();
    expect(await store.openIndices(PARENT)).toEqual([8, 9, 10, 11]);
    for (const index of [8, 9, 10, 11]) await finish(index);
    const last = await run();
    expect(last).toMatchObject({ kind: 'done', result: { total: 12, completed: 12, failed: 0, cancelled: 0 } });
    await queues.close();
  });

  it('a child releases the next window while its parent is queued or running, never for an ended one', async () => {
    const { keys, store, queues, parent, log, run, jobs, finish } = await setUp();
    await run();
    // No parent job at all (ended and removed): nothing.
    for (const index of [0, 1]) await finish(index);
    expect(await parent.releaseFromChild(PARENT, undefined, 3, log)).toBe(0);
    // The parent's job queued (promoted, waiting for a slot): the child releases up to the window.
    await queues.get('pp').add('fan', {}, { jobId: PARENT });
    expect(await parent.releaseFromChild(PARENT, undefined, 3, log)).toBe(2);
    expect(await store.openIndices(PARENT)).toEqual([2, 3, 4, 5]);
    expect(await jobs()).toEqual([2, 3, 4, 5]);
    // A full window: nothing more.
    expect(await parent.releaseFromChild(PARENT, undefined, 3, log)).toBe(0);
    // The parent ended (cancelled): nothing, whatever is open.
    for (const index of [2, 3]) await finish(index);
    await redis.hset(keys.task(PARENT), F.status, 'cancelled');
    expect(await parent.releaseFromChild(PARENT, undefined, 3, log)).toBe(0);
    await queues.close();
  });
});

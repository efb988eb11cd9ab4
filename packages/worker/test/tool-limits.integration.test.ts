/**
 * PROTOCOL.md §3.5 steps 3 and 4 against a real Redis and real BullMQ jobs: who stays in a slot limit's line when a
 * release cannot wake them. A waiter whose refused run has not made its delayed move yet stays in line (its look
 * after the move uses the room, or is woken by the next release); a waiter whose job is gone leaves it, and the next
 * in line is woken in its place. And §3.3: a plain rate limit's starts, counted exactly, hold the queue's takes when
 * the window is full, and a start it refuses waits at the front of its queue.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { DelayedError, Worker, type Job } from 'bullmq';
import { z } from 'zod';
import {
  StoreRunner,
  ToolLimitStore,
  createKeys,
  createLogger,
  limitKeyDigest,
  principalScopedKey,
  toolQueue,
} from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { defineTool } from '../src/define-tool.js';
import { BatchQueues } from '../src/engine/batch-queues.js';
import { bullmqLimiterKey } from '../src/engine/bullmq-adapter.js';
import { ToolLimits } from '../src/engine/tool-limits.js';
import type { RunningJob } from '../src/engine/running-jobs.js';
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

const tool = defineTool({
  name: 'lim',
  description: 'One run at a time per tenant.',
  inputSchema: z.object({ tenant: z.string() }),
  concurrency: { limit: 1, key: ['tenant'] },
  run: () => 'ok',
});
const args = { tenant: 'acme' };

async function setUp() {
  const keys = createKeys(uniquePrefix('tl'));
  const log = createLogger('worker', { level: 'silent' });
  const store = new ToolLimitStore(new StoreRunner(redis, keys));
  const queues = new BatchQueues(redis, keys, log);
  const limits = new ToolLimits({ store, redis, queues, leaseMs: 10_000, metrics: new WorkerMetrics(), log });
  const pool = toolQueue('default', 'lim');
  const queue = queues.get(pool);
  const worker = new Worker(queue.name, null, { connection: redis, prefix: keys.bullPrefix, autorun: false });
  // Per principal (§3.5): these runs name none, so their key is the empty principal's.
  const key = principalScopedKey('', tool.admitted.slot!.keyOf(args));
  const line = () => redis.zrange(keys.toolLimit('slots', 'lim', limitKeyDigest(key)).b, 0, -1);
  const entry = () => ({}) as RunningJob;
  /** A run fetched by this worker: its job is active, under `token`. */
  const fetched = async (id: string, token: string) => {
    await queue.add('lim', { arguments: args }, { jobId: id });
    const job = (await worker.getNextJob(token, { block: false })) as Job<unknown, void> | undefined;
    expect(job?.id).toBe(id);
    return job!;
  };
  const close = async () => {
    await worker.close();
    await queues.close();
  };
  return { limits, queue, worker, pool, line, entry, fetched, log, close };
}

describe('§3.5 who stays in a slot limit’s line', () => {
  it('step 4: a waiter still active at the release stays in line, and its look after the delayed move takes the room', async () => {
    const { limits, queue, pool, line, entry, fetched, log, close } = await setUp();
    try {
      const holder = await fetched('h', 'th');
      const held = entry();
      expect(await limits.admit(tool, args, holder, held)).toBeUndefined();
      const waiter = await fetched('w', 'tw');
      const wait = await limits.admit(tool, args, waiter, entry());
      expect(wait?.limit).toBe('slot');
      expect(await line()).toEqual([`${pool} w`]);
      // The holder releases before the waiter's delayed move: its promotion fails, and the waiter keeps its place.
      await held.release!();
      expect(await line()).toEqual([`${pool} w`]);
      // The waiter's move, then its look: the room is free, so it wakes itself.
      await expect(limits.delay(waiter, 'tw', wait!, log)).rejects.toBeInstanceOf(DelayedError);
      expect(['waiting', 'prioritized']).toContain(await queue.getJobState('w'));
    } finally {
      await close();
    }
  });

  it('step 4: a waiter whose job is gone leaves the line, and the next one is woken in its place', async () => {
    const { limits, queue, pool, line, entry, fetched, log, close } = await setUp();
    try {
      const holder = await fetched('h', 'th');
      const held = entry();
      expect(await limits.admit(tool, args, holder, held)).toBeUndefined();
      for (const id of ['gone', 'next']) {
        const job = await fetched(id, `t-${id}`);
        const wait = await limits.admit(tool, args, job, entry());
        await expect(limits.delay(job, `t-${id}`, wait!, log)).rejects.toBeInstanceOf(DelayedError);
      }
      expect(await queue.getJobState('next')).toBe('delayed');
      await queue.remove('gone');
      await held.release!();
      expect(await line()).toEqual([`${pool} next`]);
      expect(['waiting', 'prioritized']).toContain(await queue.getJobState('next'));
    } finally {
      await close();
    }
  });
});

describe('§3.3 a plain rate limit, counted exactly and paced by BullMQ', () => {
  const paced = defineTool({
    name: 'lim',
    description: 'Two starts in any second.',
    inputSchema: z.object({ tenant: z.string() }),
    rateLimit: { max: 2, perMs: 1_000 },
    run: () => 'ok',
  });

  it('a start that fills the window holds the takes until it has room; one it refuses waits at the front', async () => {
    const { limits, queue, worker, fetched, entry, log, close } = await setUp();
    try {
      expect(paced.rateLimit).toEqual({ max: 2, perMs: 1_000 });
      const limiter = bullmqLimiterKey(queue.qualifiedName);
      expect(await limits.admit(paced, args, await fetched('r1', 't1'), entry())).toBeUndefined();
      expect(await redis.pttl(limiter)).toBeLessThan(0);
      // The second start fills the window: no take until the first leaves it, and a worker blocked on the marker
      // wakes then.
      expect(await limits.admit(paced, args, await fetched('r2', 't2'), entry())).toBeUndefined();
      expect(await redis.pttl(limiter)).toBeGreaterThan(900);
      const due = Number(await redis.zscore(`${queue.qualifiedName}:marker`, '1'));
      expect(due - Date.now()).toBeGreaterThan(800);
      expect(await worker.getNextJob('t0', { block: false })).toBeUndefined();
      // A third, taken anyway (say by a worker whose fixed window had ended), is refused and goes back to the front.
      await redis.del(limiter);
      const third = await fetched('r3', 't3');
      await queue.add('lim', { arguments: args }, { jobId: 'r4' });
      const wait = await limits.admit(paced, args, third, entry());
      expect(wait).toMatchObject({ limit: 'rate', paced: true });
      expect(wait?.message).toBe('Waiting for rate limit lim: at most 2 starts per 1000 ms');
      await expect(limits.delay(third, 't3', wait!, log)).rejects.toBeInstanceOf(DelayedError);
      expect(await queue.getJobState('r3')).not.toBe('delayed');
      expect(await redis.pttl(limiter)).toBeGreaterThan(800);
      await redis.del(limiter);
      expect((await worker.getNextJob('t5', { block: false }))?.id).toBe('r3');
    } finally {
      await close();
    }
  });
});

/**
 * One test per BullMQ behaviour the worker relies on (src/engine/bullmq-adapter.ts), each named for it: a BullMQ
 * upgrade that changes one fails here by name, not somewhere in an end-to-end suite.
 */
import { describe, expect, it } from 'vitest';
import { DelayedError, Queue, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { GatedWorker, bullmqLimiterKey, bullmqMarkerKey, holdTakes, moveToWait } from '../src/engine/bullmq-adapter.js';
import { SlotGate, UNREADABLE_JOB_DATA } from '../src/engine/slot-gate.js';

const db = useRedis();

async function until(check: () => boolean | Promise<boolean>, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A queue and a gated Worker of it under a prefix of their own; `stop` closes both. */
function gated(gate: SlotGate, processor: (job: Job) => Promise<unknown>) {
  const prefix = uniquePrefix('bullmq-adapter');
  const connection = { url: db.server.url, maxRetriesPerRequest: null };
  const queue = new Queue('q', { connection, prefix });
  const worker = new GatedWorker('q', processor, {
    connection,
    prefix,
    gate,
    wakeOthers: () => Promise.resolve(),
    autorun: false,
  });
  return {
    queue,
    worker,
    prefix,
    stop: async () => {
      await worker.close(true);
      await queue.close();
    },
  };
}

describe('bullmq-adapter', () => {
  it('bullmq: moveToActive is where a job is taken, so a process with no free slot takes none', async () => {
    const gate = new SlotGate(1);
    expect(gate.tryAcquire()).toBe(true); // the one slot is busy
    const ran: string[] = [];
    const { queue, worker, stop } = gated(gate, (job) => Promise.resolve(ran.push(job.id!)));
    try {
      void worker.run();
      const job = await queue.add('t', {});
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(await queue.getJobState(job.id!)).toBe('waiting');
      gate.release();
      await until(() => ran.length === 1);
      // processJob gave the slot back once the job was done.
      await until(() => gate.inUse === 0);
    } finally {
      await stop();
    }
  });

  it('bullmq: createJob parses the stored data while taking a job, so unreadable data reaches the processor', async () => {
    const seen: unknown[] = [];
    const { queue, worker, prefix, stop } = gated(new SlotGate(1), (job) => Promise.resolve(seen.push(job.data)));
    try {
      const job = await queue.add('t', { ok: true });
      await db.redis.hset(`${prefix}:q:${job.id!}`, 'data', '{not json');
      void worker.run();
      await until(() => seen.length === 1);
      expect((seen[0] as Record<string, string>)[UNREADABLE_JOB_DATA]).toMatch(/not valid JSON/);
    } finally {
      await stop();
    }
  });

  it('bullmq: a job its processor moves to delayed (DelayedError) ends its run, and gives its slot back', async () => {
    const gate = new SlotGate(1);
    let runs = 0;
    const { queue, worker, stop } = gated(gate, async (job) => {
      runs += 1;
      if (runs === 1) {
        await job.moveToDelayed(Date.now() + 60_000, job.token);
        throw new DelayedError();
      }
    });
    try {
      void worker.run();
      await queue.add('t', {});
      await until(() => runs === 1);
      await until(() => gate.inUse === 0);
      await queue.add('t', {});
      await until(() => runs === 2);
    } finally {
      await stop();
    }
  });

  it('bullmq: a held <qualified name>:limiter stops every take until its TTL ends; moveToWait puts a job back first', async () => {
    // A plain rate limit's refused run (PROTOCOL.md §3.3 step 3): the limiter held, with the marker due at the hold's
    // end, since BullMQ's move back to the front of the job's priority (every taskrelay job has one) sets none.
    const redis = new Redis(db.server.url, { maxRetriesPerRequest: null });
    const starts: Array<{ name: string; at: number }> = [];
    let heldAt = 0;
    const { queue, worker, stop } = gated(new SlotGate(1), async (job) => {
      starts.push({ name: job.name, at: Date.now() });
      if (job.name === 'first' && starts.length === 1) {
        heldAt = Date.now();
        await holdTakes(redis, queue.qualifiedName, 400);
        const due = Number(await redis.zscore(bullmqMarkerKey(queue.qualifiedName), '1'));
        expect(due - heldAt).toBeGreaterThanOrEqual(400);
        expect(due - heldAt).toBeLessThan(1_000);
        await job.moveToWait(job.token);
        throw new DelayedError();
      }
    });
    try {
      await queue.setGlobalRateLimit(100, 1_000);
      await queue.add('first', {}, { priority: 3 });
      await queue.add('second', {}, { priority: 3 });
      void worker.run();
      await until(() => starts.length === 3);
      expect(starts.map((s) => s.name)).toEqual(['first', 'first', 'second']);
      expect(starts[1]!.at - heldAt).toBeGreaterThanOrEqual(350);
      expect(await redis.get(bullmqLimiterKey(queue.qualifiedName))).not.toBe(String(Number.MAX_SAFE_INTEGER));
    } finally {
      await stop();
      redis.disconnect();
    }
  });

  it('bullmq: the lock manager renews every lock it tracks until the processor returns; moveToWait untracks first', async () => {
    // A hand-back (a drain's, a refused start's): BullMQ renews on its own timer from the jobs it tracks, and tracks a
    // job until its processor returns. A renewal after the move found no lock and the Worker said "could not renew
    // lock for job …" of a job back in its queue as meant. Here the renewal comes right after the move, every time.
    const errors: string[] = [];
    let renewedAfterMove = false;
    const { queue, worker, stop } = gated(new SlotGate(1), async (job) => {
      await moveToWait(job, job.token);
      const locks = (worker as unknown as { lockManager: { trackedJobs: Map<string, unknown> } }).lockManager;
      await (locks as unknown as { extendLocks(ids: string[]): Promise<void> }).extendLocks([
        ...locks.trackedJobs.keys(),
      ]);
      renewedAfterMove = true;
      throw new DelayedError();
    });
    worker.on('error', (error) => errors.push(error.message));
    try {
      const job = await queue.add('t', {}, { priority: 3 });
      void worker.run();
      await until(() => renewedAfterMove);
      expect(errors).toEqual([]);
      // Moved as meant: back in its queue, its attempts kept (the worker, still running, may have taken it again).
      expect(['prioritized', 'active']).toContain(await queue.getJobState(job.id!));
      expect((await queue.getJob(job.id!))?.attemptsMade).toBe(0);
    } finally {
      await stop();
    }
  });

  it("bullmq: a queue's marker is the sorted set <qualified name>:marker an idle worker blocks on", async () => {
    const { queue, stop } = gated(new SlotGate(1), () => Promise.resolve());
    try {
      expect(bullmqMarkerKey(queue.qualifiedName)).toBe(queue.keys.marker);
    } finally {
      await stop();
    }
  });
});

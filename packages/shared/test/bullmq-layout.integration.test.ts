/**
 * BullMQ's key layout as taskrelay relies on it (bullmq-layout.ts, PROTOCOL.md §1): built here, then looked for in
 * the keys a real BullMQ queue and worker create. A BullMQ upgrade that moves a job's hash, its lock or the failed
 * set fails this test instead of silently blinding the reaper and the lock-checked writes.
 */
import { describe, expect, it } from 'vitest';
import { Queue, UnrecoverableError, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { BULLMQ_FAILED_REASON_FIELD, bullFailedKey, bullJobKey, bullQueueKey } from '../src/protocol/bullmq-layout.js';
import { createKeys } from '../src/protocol/keys.js';

const db = useRedis();

describe('§1 BullMQ key layout', () => {
  it('finds a running job’s hash and lock, and a failed job in the failed set with its reason, where BullMQ puts them', async () => {
    const keys = createKeys(uniquePrefix('bull-layout'));
    const pool = 'default.0123456789ab';
    const name = keys.queueName(pool);
    const connection = new Redis(db.server.url, { maxRetriesPerRequest: null });
    const queue = new Queue(name, { connection, prefix: keys.bullPrefix });
    const seen: Array<{ jobKey: number; lock: string | null; token: string | undefined }> = [];
    const worker = new Worker(
      name,
      async (job, token) => {
        seen.push({
          jobKey: await db.redis.exists(bullJobKey(bullQueueKey(keys.bullPrefix, name), job.id ?? '')),
          lock: await db.redis.get(keys.bullJobLock(pool, job.id ?? '')),
          token,
        });
        if (job.name === 'fails') throw new UnrecoverableError('on purpose');
      },
      { connection: connection.duplicate(), prefix: keys.bullPrefix },
    );
    try {
      await queue.add('runs', {}, { jobId: 'job-1' });
      await queue.add('fails', {}, { jobId: 'job-2' });
      await waitFor(async () => (await queue.getFailedCount()) === 1 && (await queue.getCompletedCount()) === 1, {
        message: 'the two jobs did not finish',
      });
      expect(seen).toHaveLength(2);
      for (const run of seen) {
        expect(run.jobKey).toBe(1);
        expect(run.lock).toBe(run.token);
        expect(run.token).toBeTruthy();
      }
      const queueKey = `${keys.bullQueueKeyPrefix}${pool}`;
      expect(queueKey).toBe(bullQueueKey(keys.bullPrefix, name));
      // Every key BullMQ made for the queue starts with the queue key the reaper builds.
      const made = await db.redis.keys(`${keys.bullPrefix}:*`);
      expect(made.length).toBeGreaterThan(0);
      for (const key of made) expect(key.startsWith(`${queueKey}:`)).toBe(true);
      expect(await db.redis.zscore(bullFailedKey(queueKey), 'job-2')).not.toBeNull();
      expect(await db.redis.zscore(bullFailedKey(queueKey), 'job-1')).toBeNull();
      expect(await db.redis.hget(bullJobKey(queueKey, 'job-2'), BULLMQ_FAILED_REASON_FIELD)).toBe('on purpose');
    } finally {
      await worker.close();
      await queue.close();
      connection.disconnect();
    }
  });
});

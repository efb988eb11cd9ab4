/**
 * Issue 48 item 7, PROTOCOL.md §26.8: a Redis SIGKILL in the middle of a 10,000-child batch. Redis (AOF, fsync every
 * write) is killed once a good part of the children are recorded and restarted on the same port; the gateway and the
 * workers reconnect by themselves. The batch then ends with every child recorded once: none lost, none counted twice.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { createKeys } from '@taskrelay/shared';
import type { TestRedis } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT, type GatewayProcess } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { startTask, taskResult, watchingClient } from '../helpers/faults.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
const CHILDREN = 10_000;
/** Recorded children when Redis is killed: well under way, far from done. */
const KILL_AT = 2_500;

const stack = useStack({
  name: 'f-batch-redis',
  redis: { owned: true, appendOnly: true },
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500', LOG_LEVEL: 'warn' }],
  workers: [
    // The parent's pool, and two workers of the demo tools running the build_report children.
    { TASKRELAY_TOOLS: BATCH_TOOLS, TASKRELAY_QUEUE: 'batch', WORKER_CONCURRENCY: '2' },
    { WORKER_CONCURRENCY: '32', WORKER_LOCK_DURATION_MS: '3000' },
    { WORKER_CONCURRENCY: '32', WORKER_LOCK_DURATION_MS: '3000' },
  ],
  hookTimeoutMs: 180_000,
});
let redis: TestRedis;
let r: Redis;
let prefix: string;
let gateway: GatewayProcess;

beforeAll(() => {
  ({ redis, r, prefix, gateway } = stack);
});

describe('§26.8 a batch through a Redis SIGKILL', () => {
  it('records every one of 10,000 children once after Redis is killed and restarted mid-batch', async () => {
    const watcher = await watchingClient(gateway.url);
    const taskId = await startTask(
      watcher.client,
      'fan_reports',
      { count: CHILDREN, items: 1, delayMs: 5 },
      { ttl: 600_000, timeoutMs: 60_000 },
    );
    const batch = createKeys(prefix).batch(taskId);
    const done = async () => Number((await r.hget(batch.hash, 'completed')) ?? 0);
    await waitFor(async () => (await done()) >= KILL_AT, { timeoutMs: 240_000, message: `${KILL_AT} children done` });
    const atKill = await done();
    await redis.kill();
    await redis.restart();
    await watcher.close();

    const client = (await watchingClient(gateway.url)).client;
    const result = await taskResult(client, taskId, 400_000);
    expect(result.isError, JSON.stringify(result.content).slice(0, 300)).toBeFalsy();
    // Mid-flight: the kill came with most of the batch still to do.
    expect(atKill).toBeLessThan(CHILDREN / 2);
    expect(result.structuredContent).toMatchObject({ total: CHILDREN, completed: CHILDREN, failed: 0, cancelled: 0 });
    expect(await done()).toBe(CHILDREN);
    expect(await r.hlen(batch.outcomes)).toBe(CHILDREN);
    await client.close();
  }, 600_000);
});

/**
 * Fault suite, PROTOCOL.md §26.8: a batch survives its workers being SIGKILLed mid-run, its gateway being killed and
 * restarted, and a Redis restart (AOF): no child is lost (every one is recorded, the task completes with all of them)
 * and none is counted twice (a child whose worker died after it ran runs again, and its outcome is still recorded and
 * counted once).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { createKeys } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT, startGatewayProcess, stopAll, type GatewayProcess, type ManagedProcess } from '../helpers/processes.js';
import { WorkerPool, startTask, taskResult, testRedis, watchingClient } from '../helpers/faults.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
const SIZE = 150;

let redis: TestRedis;
let r: Redis;
let prefix: string;
let gateway: GatewayProcess;
let workers: WorkerPool;
/** The killed workers: their log lines are read at the end (everything they wrote before the kill). */
const gone: ManagedProcess[] = [];

beforeAll(async () => {
  redis = await startRedis({ appendOnly: true });
  r = testRedis(redis.url);
  prefix = uniquePrefix('f-batch');
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: prefix };
  gateway = await startGatewayProcess({ ...env, TASKRELAY_REAPER_INTERVAL_MS: '500', LOG_LEVEL: 'warn' });
  workers = new WorkerPool({
    ...env,
    TASKRELAY_TOOLS: BATCH_TOOLS,
    TASKRELAY_QUEUE: 'batch',
    WORKER_LOCK_DURATION_MS: '1500',
    WORKER_CONCURRENCY: '4',
    LOG_LEVEL: 'info',
  });
  await workers.start(3);
});

afterAll(async () => {
  r?.disconnect();
  await workers?.stopAll();
  await stopAll();
  await redis?.stop();
});

/** Every 'batch child started' line of every worker, the killed ones included. */
function childStarts(): string[] {
  const lines = [...gone, ...workers.procs.values()].flatMap((w) => w.logs());
  return lines.filter((l) => l['msg'] === 'batch child started').map((l) => String(l['jobId']));
}

/** SIGKILLs a worker that is running children right now, keeping its log lines, and starts a replacement. */
async function killBusyWorker(taskId: string): Promise<void> {
  const running = new Set(await r.smembers(createKeys(prefix).batch(taskId).running));
  const busy = [...workers.procs.values()].find((w) =>
    w.logs().some((l) => l['msg'] === 'batch child started' && running.has(String(l['child'] ?? '')) === true),
  );
  const victim = busy ?? [...workers.procs.values()][0];
  if (!victim) throw new Error('no worker to kill');
  gone.push(victim);
  await workers.kill(victim.pid);
  await workers.start(1);
}

describe('§26.8 batch crash safety', () => {
  it('loses no child and counts none twice through worker SIGKILLs, a gateway restart and a Redis restart', async () => {
    const watcher = await watchingClient(gateway.url);
    const items = Array.from({ length: SIZE }, (_v, n) => ({ n, delayMs: 300 }));
    const taskId = await startTask(watcher.client, 'fan_out', { items, concurrency: 12 }, { ttl: 600_000 });
    const batch = createKeys(prefix).batch(taskId);
    const done = async () => Number((await r.hget(batch.hash, 'completed')) ?? 0);

    for (const at of [15, 40, 65]) {
      await waitFor(async () => (await done()) >= at, { timeoutMs: 60_000, message: `${at} children done` });
      await killBusyWorker(taskId);
    }
    await watcher.client.close().catch(() => undefined);

    // The gateway dies and comes back on the same address; the batch goes on meanwhile (it runs on workers).
    await waitFor(async () => (await done()) >= 85, { timeoutMs: 60_000, message: '85 children done' });
    await gateway.kill('SIGKILL');
    gateway = await startGatewayProcess({
      REDIS_URL: redis.url,
      TASKRELAY_PREFIX: prefix,
      TASKRELAY_REAPER_INTERVAL_MS: '500',
      LOG_LEVEL: 'warn',
      PORT: String(gateway.port),
    });

    // Redis restarts with its append-only file: the batch, its children's jobs and the parent's delayed job survive.
    await waitFor(async () => (await done()) >= 100, { timeoutMs: 60_000, message: '100 children done' });
    await redis.kill();
    await redis.restart();

    const client = (await watchingClient(gateway.url)).client;
    const result = await taskResult(client, taskId, 120_000);
    const body = result.structuredContent as {
      total: number;
      completed: number;
      failed: number;
      cancelled: number;
      outcomes: Array<{ index: number; status: string }>;
    };
    expect(result.isError).toBeFalsy();
    // None lost: every child recorded as completed, in order.
    expect(body).toMatchObject({ total: SIZE, completed: SIZE, failed: 0, cancelled: 0 });
    expect(body.outcomes.map((o) => o.index)).toEqual(items.map((i) => i.n));
    expect(body.outcomes.every((o) => o.status === 'completed')).toBe(true);
    // None counted twice: the counter the records increment is the number of children, and one outcome each.
    expect(await done()).toBe(SIZE);
    expect(await r.hlen(batch.outcomes)).toBe(SIZE);
    // The faults hit children mid-run: some ran more than once (and still counted once).
    const starts = childStarts();
    const distinct = new Set(starts);
    expect(distinct.size).toBe(SIZE);
    expect(starts.length).toBeGreaterThan(SIZE);
    await client.close();
  }, 240_000);
});

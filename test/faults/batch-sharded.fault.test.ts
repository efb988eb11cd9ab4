/**
 * Fault suite, PROTOCOL.md §26.10 (and §26.8): a batch in the sharded layout on a 3-master Redis Cluster, its child
 * tool over three shards, survives the children's workers being SIGKILLed mid-run: no child is lost (every one is
 * recorded and the task completes with all of them) and none is counted twice (a child whose worker died running it
 * runs again, on its own shard, and its outcome is claimed there and counted once on the parent's shard).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectExactBatch, killBusyWorker, tracedWorkers } from '../helpers/batch-trace.js';
import { Cluster } from 'ioredis';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { type WorkerPool, startTask, taskResult, watchingClient } from '../helpers/faults.js';

const SIZE = 60;
const DIR = mkdtempSync(join(tmpdir(), 'f-batch-sharded-'));
const TRACE = join(DIR, 'trace.log');
/** Children done (recorded) when a busy children's worker is SIGKILLed. */
const KILLS = [12, 30];

const stack = useStack({
  name: 'f-batch-sharded',
  cluster: { braces: false },
  gateways: [{ LOG_LEVEL: 'warn' }],
  // The parent's worker serves the parent tool only.
  workers: [{ TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-parent.mjs`, WORKER_CONCURRENCY: '2' }],
  hookTimeoutMs: 180_000,
});
let workers: WorkerPool;
let redis: Cluster;

beforeAll(async () => {
  redis = new Cluster(stack.cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
  workers = await tracedWorkers(stack, `${ROOT}/test/fixtures/shard-batch-children.mjs`, TRACE);
});

afterAll(() => {
  redis?.disconnect();
});

describe('§26.10 batch crash safety in the sharded layout', () => {
  it('loses no child and counts none twice through SIGKILLs of the children’s workers', async () => {
    const watcher = await watchingClient(stack.gateway.url);
    await waitFor(async () => (await watcher.client.listTools()).tools.some((t) => t.name === 'fan_out'), {
      message: 'fan_out never reached the gateway',
    });
    const items = Array.from({ length: SIZE }, (_v, n) => ({ n, delayMs: 500 }));
    const taskId = await startTask(
      watcher.client,
      'fan_out',
      { items, concurrency: 12, tool: 'shard_child' },
      { ttl: 600_000 },
    );
    const keys = createKeys(stack.prefix, 'sharded');
    const batch = keys.forTask(taskId).batch(taskId);
    const done = async () => Number((await redis.hget(batch.hash, 'completed')) ?? 0);

    const diedRunning: number[] = [];
    for (const at of KILLS) {
      await waitFor(async () => (await done()) >= at, { timeoutMs: 60_000, message: `${at} children done` });
      // The children are not held back (as the single layout's suite holds them with gates): the batch may be over
      // before a later kill finds a busy worker. The first kill (12 of 60 done) always finds one: checked below.
      diedRunning.push(...(await killBusyWorker(workers, TRACE, async () => (await done()) >= SIZE)));
    }

    const result = await taskResult(watcher.client, taskId, 120_000);
    // None lost, none counted twice, and each child a killed worker held ran again (test/helpers/batch-trace.ts).
    const counted = { done: await done(), outcomes: await redis.hlen(batch.outcomes) };
    expectExactBatch(result, SIZE, counted, TRACE, diedRunning);
    // The child tool ran over three shards (child i on shard i mod 3, test/batch-sharded.e2e.test.ts).
    const registry = await redis.hgetall(keys.placement);
    const pool = toolQueue('default', 'shard_child');
    const codes = [0, 1, 2].map((i) => registry[`${pool}#${i}`] ?? '');
    expect(new Set(codes).size).toBe(3);
    await watcher.client.close();
  }, 240_000);
});

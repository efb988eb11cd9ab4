/**
 * Fault suite, PROTOCOL.md §26.10 (and §26.8): a batch in the sharded layout on a 3-master Redis Cluster, its child
 * tool over three shards, survives the children's workers being SIGKILLed mid-run: no child is lost (every one is
 * recorded and the task completes with all of them) and none is counted twice (a child whose worker died running it
 * runs again, on its own shard, and its outcome is claimed there and counted once on the parent's shard).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { tracedWorkers } from '../helpers/batch-trace.js';
import { batchThroughKills } from '../helpers/sharded-batch.js';
import { Cluster } from 'ioredis';
import { ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { type WorkerPool, watchingClient } from '../helpers/faults.js';

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
    await batchThroughKills({
      client: watcher.client,
      redis,
      prefix: stack.prefix,
      parentTool: 'fan_out',
      workers,
      trace: TRACE,
      size: SIZE,
      kills: KILLS,
    });
    await watcher.client.close();
  }, 240_000);
});

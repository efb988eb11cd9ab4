/**
 * Fault suite, PROTOCOL.md §26.10 (and §26.8), issue 45: a **Python parent's** batch in the sharded layout on a
 * 3-master Redis Cluster, its Python child tool over three shards, survives the children's Python workers being
 * SIGKILLed mid-run: no child is lost (every one is recorded and the task completes with all of them) and none is
 * counted twice (a child whose worker died running it runs again, on its own shard, and its outcome is claimed there
 * and counted once on the parent's shard). As test/faults/batch-sharded.fault.test.ts for the Node parent.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { batchThroughKills } from '../helpers/sharded-batch.js';
import { Cluster } from 'ioredis';
import { PYTHON, ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { WorkerPool, watchingClient } from '../helpers/faults.js';

const SIZE = 60;
const DIR = mkdtempSync(join(tmpdir(), 'f-py-batch-sharded-'));
const TRACE = join(DIR, 'trace.log');
/** Children done (recorded) when a busy children's worker is SIGKILLed. */
const KILLS = [12, 30];

if (PYTHON === undefined)
  console.log('python-batch-sharded fault suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('§26.10 a Python parent’s batch through SIGKILLs, sharded layout', () => {
  const stack = useStack({
    name: 'f-py-batch-sharded',
    cluster: { braces: false },
    gateways: [{ LOG_LEVEL: 'warn' }],
    workers: [],
    // The parent's Python worker serves the parent tool only.
    pythonWorkers: [
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_parent.py'), WORKER_CONCURRENCY: '2' },
    ],
    ready: { readyTimeoutMs: 60_000 },
    hookTimeoutMs: 180_000,
  });
  let workers: WorkerPool;
  let redis: Cluster;

  beforeAll(async () => {
    redis = new Cluster(stack.cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
    // Three Python workers of the child tool, with a short lock so a killed one's children come back quickly.
    workers = new WorkerPool(
      {
        TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_child.py'),
        WORKER_LOCK_DURATION_MS: '1500',
        WORKER_CONCURRENCY: '4',
        BATCH_TRACE_FILE: TRACE,
      },
      (env) => stack.addPythonWorker(env),
    );
    await workers.start(3);
  });

  afterAll(() => {
    redis?.disconnect();
  });

  it('loses no child and counts none twice through SIGKILLs of the children’s workers', async () => {
    const watcher = await watchingClient(stack.gateway.url);
    const diedRunning = await batchThroughKills({
      client: watcher.client,
      redis,
      prefix: stack.prefix,
      parentTool: 'py_fan_out',
      workers,
      trace: TRACE,
      size: SIZE,
      kills: KILLS,
    });
    console.log(`python parent, sharded: children a killed worker held, each ran again: ${diedRunning.join(', ')}`);
    await watcher.client.close();
  }, 240_000);
});

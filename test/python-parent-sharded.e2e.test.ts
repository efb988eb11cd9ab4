/**
 * PROTOCOL.md §26.10, issue 45: a **Python parent's** batch (`ctx.fan_out`) in the sharded key layout, on a real
 * 3-master Redis Cluster. The parent tool (`py_fan_out`) runs on a Python worker that serves nothing else; its child
 * tool (`shard_child`, `shards: 3`, Python) runs on two other Python workers, over three shards the placement puts on
 * the three masters. As test/batch-sharded.e2e.test.ts for the Node parent: child `i` queues on shard `i mod 3`; the
 * aggregate is exact with each child run and counted once; a cancel of the parent reaches every running child on its
 * own shard's channel (the children's workers' cancel sweep is 10 minutes here, so only the SPUBLISH can stop them in
 * time); fail-fast stops the rest. A second stack runs the same Python parent's batches on Node children (the batch
 * hash a Python parent wrote, read and recorded by Node workers).
 */
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster } from 'ioredis';
import { CancelTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { createKeys, masterOfSlot, slotOfCode, toolQueue, type Keys } from '@taskrelay/shared';
import { traced } from './helpers/batch-trace.js';
import { PYTHON, ROOT } from './helpers/processes.js';
import { clusterMasters } from './helpers/redis-cluster.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const TRACE = join(tmpdir(), `taskrelay-py-parent-sharded-${process.pid}-${Date.now()}.trace`);
writeFileSync(TRACE, '');
/** A gate file nobody makes: children waiting on it run until they are stopped. */
const NEVER = join(tmpdir(), `taskrelay-py-parent-sharded-never-${process.pid}`);
const CHILD_POOL = toolQueue('default', 'shard_child');
const child = {
  TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_child.py'),
  WORKER_CONCURRENCY: '8',
  BATCH_TRACE_FILE: TRACE,
  // Only the cancel a stopped batch publishes on each child's shard stops a running child within the test.
  WORKER_CANCEL_SWEEP_MS: '600000',
};

if (PYTHON === undefined) console.log('python-parent-sharded suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('§26.10 a Python parent’s batch in the sharded layout', () => {
  const stack = useStack({
    name: 'pyparentsharded',
    cluster: { braces: false },
    workers: [],
    pythonWorkers: [
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_parent.py'), WORKER_CONCURRENCY: '4' },
      child,
      child,
    ],
    mcp: true,
    ready: { readyTimeoutMs: 60_000 },
    hookTimeoutMs: 180_000,
  });

  let redis: Cluster;
  let keys: Keys;
  let codes: string[];
  let mcp: Client;

  beforeAll(async () => {
    redis = new Cluster(stack.cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
    keys = createKeys(stack.prefix, 'sharded');
    mcp = stack.mcp;
    await waitFor(
      async () => {
        const names = (await mcp.listTools()).tools.map((t) => t.name);
        return names.includes('py_fan_out') && names.includes('shard_child');
      },
      { message: 'the tools never reached the gateway' },
    );
    const registry = await redis.hgetall(keys.placement);
    codes = [0, 1, 2].map((i) => registry[`${CHILD_POOL}#${i}`] ?? '');
  });

  afterAll(() => {
    redis?.disconnect();
  });

  /** Lines of the children's workers with this message, for this parent. */
  function childLines(msg: string, parentId: string): number {
    return stack.pythonWorkers
      .slice(1)
      .flatMap((w) => w.logs())
      .filter((l) => l['msg'] === msg && l['parentId'] === parentId).length;
  }

  /** The shards whose queue holds child `index`'s job. */
  async function jobShards(parentId: string, index: number): Promise<string[]> {
    const found = await Promise.all(
      codes.map(async (code) =>
        (await redis.exists(`${keys.forShard(code).bullQueueKeyPrefix}${CHILD_POOL}:${parentId}.${index}`)) === 1
          ? code
          : undefined,
      ),
    );
    return found.filter((code): code is string => code !== undefined);
  }

  it('places the child tool’s three shards on the three masters', async () => {
    expect(codes.every((code) => /^[0-9a-f]{4}$/.test(code))).toBe(true);
    const masters = await clusterMasters(stack.cluster);
    expect(new Set(codes.map((code) => masterOfSlot(masters, slotOfCode(code)))).size).toBe(3);
  });

  it('aggregates exactly: every child run and counted once, the failures listed in order, over the three shards', async () => {
    const failing = new Set([3, 10, 17, 24]);
    const items = Array.from({ length: 30 }, (_v, n) => ({ n, delayMs: 30, fail: failing.has(n) }));
    // concurrency 8: four windows and more, so the parent's releases (and its children's, §26.3 step 4) re-add and
    // spread every window over the three shards.
    const taskId = await startTask(mcp, 'py_fan_out', { items, concurrency: 8, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 90_000);
    expect(result.structuredContent).toMatchObject({ total: 30, completed: 26, failed: 4, cancelled: 0 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.map((o) => o.index)).toEqual(items.map((_v, n) => n));
    expect(outcomes.map((o) => o.status)).toEqual(items.map((i) => (i.fail ? 'failed' : 'completed')));
    // Each child ran once (no worker died) and was counted once.
    expect(traced(TRACE, 'done', 0, 30).sort((a, b) => a - b)).toEqual(items.map((_v, n) => n));
    expect(childLines('batch child started', taskId)).toBe(30);
    // The batch's keys are on the parent's shard; its children's open work there is gone with the last record.
    expect(await redis.exists(keys.forTask(taskId).batch(taskId).open)).toBe(0);
    expect(await redis.zcard(keys.forTask(taskId).principalOpenTasks('anonymous'))).toBe(0);
  });

  it('queues child i on shard i mod 3; a cancel of the parent stops every running child on its shard', async () => {
    const items = Array.from({ length: 9 }, (_v, i) => ({ n: 100 + i, gate: NEVER }));
    const taskId = await startTask(mcp, 'py_fan_out', { items, concurrency: 9, tool: 'shard_child' });
    await waitFor(() => traced(TRACE, 'start', 100, 109).length === 9, {
      timeoutMs: 30_000,
      message: 'the 9 children never all started',
    });
    for (let i = 0; i < 9; i++) expect(await jobShards(taskId, i)).toEqual([codes[i % 3]]);
    await mcp.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    await waitFor(() => childLines('batch child stopped with its batch', taskId) === 9, {
      timeoutMs: 20_000,
      message: 'not every running child stopped',
    });
    expect(traced(TRACE, 'done', 100, 109)).toEqual([]);
    expect((await getTask(mcp, taskId)).status).toBe('cancelled');
    // Nothing of the batch is left queued on any shard.
    await waitFor(async () => (await Promise.all(items.map((_v, i) => jobShards(taskId, i)))).flat().length === 0, {
      message: 'children’s jobs left on their shards',
    });
  });

  it('fail-fast: the first failure stops the running children on every shard, counted cancelled', async () => {
    const items = Array.from({ length: 12 }, (_v, i) =>
      i === 5 ? { n: 200 + i, delayMs: 300, fail: true } : { n: 200 + i, gate: NEVER },
    );
    const taskId = await startTask(mcp, 'py_fan_out', { items, concurrency: 12, failFast: true, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 60_000);
    expect(result.structuredContent).toMatchObject({ total: 12, completed: 0, failed: 1, cancelled: 11 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.filter((o) => o.status === 'failed').map((o) => o.index)).toEqual([5]);
    await waitFor(() => childLines('batch child stopped with its batch', taskId) === 11, {
      timeoutMs: 20_000,
      message: 'not every running child stopped',
    });
    expect(traced(TRACE, 'done', 200, 212)).toEqual([205]);
  });
});

describe.skipIf(PYTHON === undefined)('§26.10 a Python parent’s sharded batch on Node children', () => {
  // The same Python parent; the child tool is shard-batch-children.mjs's `shard_child` on two Node workers. The batch
  // hash a Python parent wrote (its `childCodes`) is read by the Node children, who record, release and stop by it.
  const stack = useStack({
    name: 'pyparentnodekids',
    cluster: { braces: false },
    workers: [
      {
        TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-children.mjs`,
        WORKER_CONCURRENCY: '8',
        BATCH_TRACE_FILE: TRACE,
        WORKER_CANCEL_SWEEP_MS: '600000',
        LOG_LEVEL: 'info',
      },
      {
        TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-children.mjs`,
        WORKER_CONCURRENCY: '8',
        BATCH_TRACE_FILE: TRACE,
        WORKER_CANCEL_SWEEP_MS: '600000',
        LOG_LEVEL: 'info',
      },
    ],
    pythonWorkers: [
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_parent.py'), WORKER_CONCURRENCY: '4' },
    ],
    mcp: true,
    ready: { readyTimeoutMs: 60_000 },
    hookTimeoutMs: 180_000,
  });
  let mcp: Client;

  beforeAll(async () => {
    mcp = stack.mcp;
    await waitFor(
      async () => {
        const names = (await mcp.listTools()).tools.map((t) => t.name);
        return names.includes('py_fan_out') && names.includes('shard_child');
      },
      { message: 'the tools never reached the gateway' },
    );
  });

  function nodeLines(msg: string, parentId: string): number {
    return stack.workers.flatMap((w) => w.logs()).filter((l) => l['msg'] === msg && l['parentId'] === parentId).length;
  }

  it('aggregates exactly over the three shards, and a cancel stops every running Node child', async () => {
    const items = Array.from({ length: 24 }, (_v, i) => ({ n: 300 + i, delayMs: 30, fail: i === 9 }));
    const taskId = await startTask(mcp, 'py_fan_out', { items, concurrency: 8, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 90_000);
    expect(result.structuredContent).toMatchObject({ total: 24, completed: 23, failed: 1, cancelled: 0 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.map((o) => o.status)).toEqual(items.map((i) => (i.fail ? 'failed' : 'completed')));
    expect(traced(TRACE, 'done', 300, 324).sort((a, b) => a - b)).toEqual(items.map((i) => i.n));
    expect(nodeLines('batch child started', taskId)).toBe(24);

    const held = Array.from({ length: 6 }, (_v, i) => ({ n: 400 + i, gate: NEVER }));
    const stopped = await startTask(mcp, 'py_fan_out', { items: held, concurrency: 6, tool: 'shard_child' });
    await waitFor(() => traced(TRACE, 'start', 400, 406).length === 6, {
      timeoutMs: 30_000,
      message: 'the 6 children never all started',
    });
    await mcp.request({ method: 'tasks/cancel', params: { taskId: stopped } }, CancelTaskResultSchema);
    await waitFor(() => nodeLines('batch child stopped with its batch', stopped) === 6, {
      timeoutMs: 20_000,
      message: 'not every running Node child stopped',
    });
    expect(traced(TRACE, 'done', 400, 406)).toEqual([]);
  });
});

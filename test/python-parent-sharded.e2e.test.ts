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
import { beforeAll, describe, expect, it } from 'vitest';
import { CancelTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { traced } from './helpers/batch-trace.js';
import { PYTHON, ROOT } from './helpers/processes.js';
import { linesAbout, nodeShardChild, shardedParentChecks, waitForTools } from './helpers/sharded-batch.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const TRACE = join(tmpdir(), `taskrelay-py-parent-sharded-${process.pid}-${Date.now()}.trace`);
writeFileSync(TRACE, '');
/** A gate file nobody makes: children waiting on it run until they are stopped. */
const NEVER = join(tmpdir(), `taskrelay-py-parent-sharded-never-${process.pid}`);
const child = {
  TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_child.py'),
  WORKER_CONCURRENCY: '8',
  BATCH_TRACE_FILE: TRACE,
  // Only the cancel a stopped batch publishes on each child's shard stops a running child within the test.
  WORKER_CANCEL_SWEEP_MS: '600000',
};

/** A Node worker of the same child tool, for the second stack. */
const nodeChild = nodeShardChild(TRACE);

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

  shardedParentChecks({
    stack,
    parentTool: 'py_fan_out',
    children: () => stack.pythonWorkers.slice(1),
    trace: TRACE,
    never: NEVER,
    // The batch's keys are on the parent's shard; its children's open work there is gone with the last record.
    aggregate: async (taskId, { redis, keys }) => {
      expect(await redis.exists(keys.forTask(taskId).batch(taskId).open)).toBe(0);
      expect(await redis.zcard(keys.forTask(taskId).principalOpenTasks('anonymous'))).toBe(0);
    },
  });
});

describe.skipIf(PYTHON === undefined)('§26.10 a Python parent’s sharded batch on Node children', () => {
  // The same Python parent; the child tool is shard-batch-children.mjs's `shard_child` on two Node workers. The batch
  // hash a Python parent wrote (its `childCodes`) is read by the Node children, who record, release and stop by it.
  const stack = useStack({
    name: 'pyparentnodekids',
    cluster: { braces: false },
    workers: [nodeChild, nodeChild],
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
    await waitForTools(mcp, 'py_fan_out', 'shard_child');
  });

  const nodeLines = (msg: string, parentId: string) => linesAbout(stack.workers, msg, parentId);

  it('aggregates exactly over the three shards, and a cancel stops every running Node child', async () => {
    const items = Array.from({ length: 24 }, (_v, i) => ({ n: 300 + i, delayMs: 30, fail: i === 9 }));
    const taskId = await startTask(mcp, 'py_fan_out', { items, concurrency: 8, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 90_000);
    expect(result.structuredContent).toMatchObject({ total: 24, completed: 23, failed: 1, cancelled: 0 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.map((o) => o.status)).toEqual(items.map((i) => (i.fail ? 'failed' : 'completed')));
    expect(traced(TRACE, 'done', 300, 324).sort((a, b) => a - b)).toEqual(items.map((i) => i.n));
    // A worker's log lines reach this process through a pipe, behind the result that came through Redis: a loaded
    // machine delivered the last of them after the batch's result (seen 20 of 24 at first).
    await waitFor(() => nodeLines('batch child started', taskId) >= 24, { message: 'a child never said it started' });
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

/**
 * PROTOCOL.md §26.10 for the Python worker's side of a batch: with `TASKRELAY_KEY_LAYOUT=sharded` on one Redis (the
 * layout's test aid), a Node parent (`fan_out`) fans out to `shard_child`, a Python tool over three shards. The Python
 * worker takes child `i` from shard `i mod 3`'s queue, checks and claims under the child's lock there, and counts the
 * outcome on the parent's shard: the aggregate is exact, a large result goes by reference under that lock, and a
 * cancel of the parent stops every running child on its own shard's channel (the Python worker's cancel sweep is 10
 * minutes). A Python parent's batch in this layout: test/python-parent-sharded.e2e.test.ts.
 */
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { traced } from './helpers/batch-trace.js';
import { CancelTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { PYTHON, ROOT } from './helpers/processes.js';
import { linesAbout, waitForTools } from './helpers/sharded-batch.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const TRACE = join(tmpdir(), `taskrelay-py-batch-sharded-${process.pid}-${Date.now()}.trace`);
writeFileSync(TRACE, '');
const NEVER = join(tmpdir(), `taskrelay-py-batch-sharded-never-${process.pid}`);
const CHILD_POOL = toolQueue('default', 'shard_child');

if (PYTHON === undefined) console.log('python-batch-sharded suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('§26.10 a Node parent’s sharded batch on a Python child worker', () => {
  const stack = useStack({
    name: 'pybatchsharded',
    redis: {},
    env: { TASKRELAY_KEY_LAYOUT: 'sharded' },
    workers: [{ TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-parent.mjs`, WORKER_CONCURRENCY: '4' }],
    pythonWorkers: [
      {
        TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_shard_child.py'),
        WORKER_CONCURRENCY: '8',
        WORKER_CANCEL_SWEEP_MS: '600000',
        BATCH_TRACE_FILE: TRACE,
      },
    ],
    mcp: true,
  });
  let mcp: Client;

  beforeAll(async () => {
    mcp = stack.mcp;
    await waitForTools(mcp, 'fan_out', 'shard_child');
  });

  const pythonLines = (msg: string, parentId: string) => linesAbout(stack.pythonWorkers, msg, parentId);

  it('aggregates exactly, each child counted once, a large result by reference', async () => {
    const failing = new Set([2, 13]);
    const items = Array.from({ length: 24 }, (_v, n) => ({
      n,
      delayMs: 20,
      fail: failing.has(n),
      big: n === 5 ? 20_000 : 0,
    }));
    const taskId = await startTask(mcp, 'fan_out', { items, concurrency: 8, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 90_000);
    expect(result.structuredContent).toMatchObject({ total: 24, completed: 22, failed: 2, cancelled: 0 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.map((o) => o.status)).toEqual(items.map((i) => (i.fail ? 'failed' : 'completed')));
    expect(traced(TRACE, 'done', 0, 24).sort((a, b) => a - b)).toEqual(items.map((_v, n) => n));
    // A worker's log lines reach this process through a pipe, behind the result that came through Redis: a loaded
    // machine delivered the last of them after the batch's result (seen 20 of 24 at first).
    await waitFor(() => pythonLines('batch child started', taskId) >= 24, { message: 'a child never said it started' });
    expect(pythonLines('batch child started', taskId)).toBe(24);
    const keys = createKeys(stack.prefix, 'sharded');
    const fifth = JSON.parse((await stack.r.hget(keys.forTask(taskId).batch(taskId).outcomes, '5')) ?? '{}') as {
      result?: { content?: Array<{ type: string }> };
    };
    expect(fifth.result?.content?.some((block) => block.type === 'resource_link')).toBe(true);
  });

  it('takes child i from shard i mod 3; a cancel of the parent stops every running child', async () => {
    const registry = await stack.r.hgetall(createKeys(stack.prefix, 'sharded').placement);
    const codes = [0, 1, 2].map((i) => registry[`${CHILD_POOL}#${i}`] ?? '');
    expect(new Set(codes).size).toBe(3);
    const items = Array.from({ length: 6 }, (_v, i) => ({ n: 100 + i, gate: NEVER }));
    const taskId = await startTask(mcp, 'fan_out', { items, concurrency: 6, tool: 'shard_child' });
    await waitFor(() => traced(TRACE, 'start', 100, 106).length === 6, {
      timeoutMs: 30_000,
      message: 'children started',
    });
    const keys = createKeys(stack.prefix, 'sharded');
    for (let i = 0; i < 6; i++) {
      const lock = keys.forShard(codes[i % 3] ?? '').bullJobLock(CHILD_POOL, `${taskId}.${i}`);
      expect(await stack.r.exists(lock)).toBe(1);
    }
    await mcp.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    await waitFor(() => pythonLines('batch child stopped with its batch', taskId) === 6, {
      timeoutMs: 20_000,
      message: 'not every running child stopped',
    });
    expect(traced(TRACE, 'done', 100, 106)).toEqual([]);
  });
});

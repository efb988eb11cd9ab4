/**
 * Issue 48 F5, PROTOCOL.md §5: a job whose stored data cannot be read (not JSON, or JSON that is not a job's data)
 * fails its task with an error that says so, on a Node worker and on a Python worker alike; a batch child's job
 * (PROTOCOL.md §26) fails that child, counted once in its parent's aggregate, and the batch goes on. Before, data that was not
 * JSON failed inside BullMQ's fetch, outside any processor: the job sat active, was taken again at each stall check,
 * and its task stayed `working` until its deadline. Provoking it needs write access to Redis, as an operator's script
 * or another producer has.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { toolQueue } from '@taskrelay/shared';
import { FIXTURE_TOOLS, PYTHON, ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { getTask, startTask } from '../helpers/tasks.js';
import { taskResult, waitForTerminal } from '../helpers/faults.js';
import { waitFor } from '../helpers/wait-for.js';

/** How far ahead the jobs start: time to rewrite their data while they wait in the delayed set. */
const START_IN_MS = 4_000;

const stack = useStack({
  name: 'f-unreadable',
  redis: { owned: true },
  env: { WORKER_LOCK_DURATION_MS: '3000' },
  workers: [{ TASKRELAY_TOOLS: FIXTURE_TOOLS }, { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/batch-tools.mjs') }],
  pythonWorkers: PYTHON === undefined ? [] : [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py') }],
  mcp: true,
  hookTimeoutMs: 60_000,
});
let r: Redis;
let prefix: string;
let client: Client;

beforeAll(() => {
  ({ r, prefix, mcp: client } = stack);
});

/** Starts a delayed task of `tool`, and rewrites its waiting job's stored data to `data`. */
async function taskWithJobData(tool: string, args: Record<string, unknown>, data: string): Promise<string> {
  const taskId = await startTask(client, tool, args, {
    meta: { 'dev.taskrelay/start-at': new Date(Date.now() + START_IN_MS).toISOString() },
  });
  // BullMQ's job hash: `<prefix>:q-<pool>~<tool>:<id>`.
  const [jobKey, ...others] = await r.keys(`${prefix}:q-*~${tool}:${taskId}`);
  expect(jobKey, 'the waiting job').toBeDefined();
  expect(others).toEqual([]);
  expect(await r.hexists(jobKey ?? '', 'data')).toBe(1);
  await r.hset(jobKey ?? '', 'data', data);
  return taskId;
}

const workers = [
  { language: 'Node', tool: 'echo', args: { text: 'x' } },
  ...(PYTHON === undefined ? [] : [{ language: 'Python', tool: 'py_count', args: { n: 1 } }]),
];

describe.each(workers)('a $language worker given a job it cannot read', ({ tool, args }) => {
  it('fails the task of a job whose data is not JSON, saying so', async () => {
    const taskId = await taskWithJobData(tool, args, '{"taskId": "cut off');
    const task = await waitForTerminal(client, taskId, START_IN_MS + 15_000);
    expect(task.status).toBe('failed');
    expect(task.statusMessage).toMatch(/^Invalid job data: its stored data is not valid JSON \(.+\)$/);
  });

  it('fails the task of a job whose JSON is not a job’s data, saying so', async () => {
    const taskId = await taskWithJobData(tool, args, '{"tool": 42}');
    const task = await waitForTerminal(client, taskId, START_IN_MS + 15_000);
    expect(task.status).toBe('failed');
    expect(task.statusMessage).toMatch(/^Invalid job data: /);
  });

  it('still runs the next job of the tool', async () => {
    const taskId = await startTask(client, tool, args);
    await waitFor(async () => (await getTask(client, taskId)).status === 'completed', {
      timeoutMs: 15_000,
      message: 'a readable job did not complete',
    });
  });
});

const childWorkers = [
  { language: 'Node', childTool: 'maybe_fail' },
  ...(PYTHON === undefined ? [] : [{ language: 'Python', childTool: 'py_child' }]),
];

describe.each(childWorkers)('a $language worker given a batch child job it cannot read', ({ childTool }) => {
  it('fails that child with Invalid job data, counted once in the parent’s outcome, and runs the others', async () => {
    // The child tool's queue is paused while the children are queued: time to rewrite one child's stored data.
    const queue = new Queue(`q-${toolQueue('default', childTool)}`, { connection: r.duplicate(), prefix });
    try {
      await queue.pause();
      const parentId = await startTask(client, 'fan_out', { items: [{ n: 0 }, { n: 1 }, { n: 2 }], tool: childTool });
      const jobKey = `${prefix}:q-default~${childTool}:${parentId}.1`;
      await waitFor(async () => (await r.hexists(jobKey, 'data')) === 1, {
        timeoutMs: 15_000,
        message: 'the child jobs were never queued',
      });
      await r.hset(jobKey, 'data', '{"taskId": "cut off');
      await queue.resume();

      const parent = await waitForTerminal(client, parentId, 30_000);
      expect(parent.status, parent.statusMessage).toBe('completed');
      const batch = (await taskResult(client, parentId)).structuredContent as {
        total: number;
        completed: number;
        failed: number;
        outcomes: Array<{ index: number; status: string; error?: string }>;
      };
      expect(batch).toMatchObject({ total: 3, completed: 2, failed: 1 });
      expect(batch.outcomes.map((o) => o.status)).toEqual(['completed', 'failed', 'completed']);
      expect(batch.outcomes[1]?.error).toMatch(/^Invalid job data: its stored data is not valid JSON \(.+\)$/);
    } finally {
      await queue.close();
    }
  });
});

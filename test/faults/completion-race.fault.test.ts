/**
 * Issue 48 F6, PROTOCOL.md §7.5: a run that completes normally logs no `LOCK_LOST`. The cancel sweep re-reads the
 * status of every running task; it read `completed` (written by the run itself a moment before) while the run was
 * still registered, took the end for someone else's and aborted the run with `LOCK_LOST`, logging a warning: 2 of 10
 * and 6 of 30 large-result tasks in the adversarial probe. A short sweep interval and large results (whose terminal
 * write takes longest) make the window wide here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolve } from 'node:path';
import { PYTHON, ROOT, startPythonWorkerProcess, stopAll, type ManagedProcess } from '../helpers/processes.js';
import { startStack, type TestStack } from '../helpers/stack.js';
import { startTask, taskResult } from '../helpers/tasks.js';

const ABUSE_TOOLS = `${ROOT}/test/fixtures/abuse-tools.mjs`;
const TASKS = 40;

let stack: TestStack;
let python: ManagedProcess | undefined;

beforeAll(async () => {
  stack = await startStack({
    name: 'f-completion',
    redis: { owned: true },
    workers: [{ TASKRELAY_TOOLS: ABUSE_TOOLS, WORKER_CONCURRENCY: '8', WORKER_CANCEL_SWEEP_MS: '50' }],
  });
  if (PYTHON !== undefined) {
    python = await startPythonWorkerProcess({
      ...stack.env,
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'),
      WORKER_CONCURRENCY: '8',
      WORKER_CANCEL_SWEEP_MS: '50',
    });
  }
}, 60_000);

afterAll(async () => {
  await stopAll();
  await stack?.stop();
});

const workers = [
  { language: 'Node', tool: 'big_result', logs: () => stack.workers.flatMap((w) => w.logs()) },
  ...(PYTHON === undefined ? [] : [{ language: 'Python', tool: 'py_big_result', logs: () => python?.logs() ?? [] }]),
];

describe.each(workers)('a run on a $language worker that completes normally', ({ tool, logs }) => {
  it('is never taken for a lost lock by the cancel sweep, however large its result', async () => {
    const client = await stack.client();
    const ids = await Promise.all(
      Array.from({ length: TASKS }, (_, i) => startTask(client, tool, { bytes: 900_000, ms: 20 + (i % 7) * 15 })),
    );
    for (const id of ids) expect((await taskResult(client, id, 60_000)).isError).toBeFalsy();
    const lost = logs().filter((l) => l['reason'] === 'LOCK_LOST');
    expect(lost.length, JSON.stringify(lost.slice(0, 2))).toBe(0);
  }, 120_000);
});

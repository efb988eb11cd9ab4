/**
 * Issue 49 item 4, PROTOCOL.md §29.4: a Python tool fans out with `ctx.fan_out` (§26) to Python and Node children, and
 * asks for the client's roots with `ctx.list_roots`. Real processes: Redis, a Node gateway, a Node worker serving §26's
 * fixtures (test/fixtures/batch-tools.mjs, `maybe_fail`) and two Python workers serving
 * test/fixtures/python_batch_tools.py. Skipped, with one line, when no Python with taskrelay-worker is installed.
 */
import { mkdtempSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ListRootsRequestSchema, type ProgressNotification } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { PYTHON, ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';
import { scaled } from './helpers/load.js';

const PY_TOOLS = resolve(ROOT, 'test/fixtures/python_batch_tools.py');
const BATCH_TOOLS = resolve(ROOT, 'test/fixtures/batch-tools.mjs');
/** A short lock: a SIGKILLed worker's jobs are back in their queues within 5/6 of it (§10.5). */
const LOCK_MS = 3_000;

interface BatchResult {
  total: number;
  completed: number;
  failed: number;
  cancelled: number;
  truncated: boolean;
  outcomesOmitted: number;
  outcomes: Array<{ index: number; status: string; error?: string }>;
}

if (PYTHON === undefined) {
  console.log('python-batch suite skipped: no .venv/bin/python with taskrelay-worker (needs Python 3.11+)');
}

describe.skipIf(PYTHON === undefined)('§29.4 batch fan-out and roots from a Python tool', () => {
  const dir = mkdtempSync(join(tmpdir(), 'py-batch-'));
  const trace = join(dir, 'trace.txt');
  const python = {
    TASKRELAY_TOOLS: PY_TOOLS,
    PY_BATCH_TRACE_FILE: trace,
    WORKER_CONCURRENCY: '3',
    // A cancel must reach a running child by its message here, not by the sweep (§26.7).
    WORKER_CANCEL_SWEEP_MS: '60000',
  };
  const stack = useStack({
    name: 'pybatch',
    env: { WORKER_LOCK_DURATION_MS: String(LOCK_MS), WORKER_SHUTDOWN_GRACE_MS: '300' },
    workers: [{ TASKRELAY_TOOLS: BATCH_TOOLS, TASKRELAY_QUEUE: 'batches' }],
    pythonWorkers: [python, python],
  });
  let client: Client;
  let keys: ReturnType<typeof createKeys>;
  const progress: ProgressNotification['params'][] = [];

  const addPython = () => stack.addPythonWorker(python);
  const alive = () => stack.pythonWorkers.filter((p) => p.child.exitCode === null && p.child.signalCode === null);
  const traced = () => (existsSync(trace) ? readFileSync(trace, 'utf8').split('\n').filter(Boolean) : []);

  beforeAll(async () => {
    keys = createKeys(stack.prefix);
    client = await stack.client({}, undefined, {
      capabilities: { roots: {} },
      progress,
      before(c) {
        c.setRequestHandler(ListRootsRequestSchema, () =>
          Promise.resolve({ roots: [{ uri: 'file:///work/a', name: 'a' }, { uri: 'file:///work/b' }] }),
        );
      },
    });
  });

  it('a Python parent fans out to Python children: the aggregate, the outcomes and the parent’s progress', async () => {
    const items = Array.from({ length: 8 }, (_, n) => ({ n, delayMs: 20, ...(n === 5 ? { fail: true } : {}) }));
    const taskId = await startTask(
      client,
      'py_fan_out',
      { items, tool: 'py_part', concurrency: 3 },
      { progressToken: 'py-parent' },
    );
    const result = await taskResult(client, taskId, 30_000);
    const batch = result.structuredContent as unknown as BatchResult;
    expect(batch).toMatchObject({ total: 8, completed: 7, failed: 1, cancelled: 0, truncated: false });
    expect(batch.outcomes.map((o) => o.status)).toEqual([
      'completed',
      'completed',
      'completed',
      'completed',
      'completed',
      'failed',
      'completed',
      'completed',
    ]);
    expect(batch.outcomes[5]?.error).toBe('child 5 failed as asked');
    // Each child ran once, on the Python workers (the child tool's queue, which both consume).
    const started = alive()
      .flatMap((p) => p.logs())
      .filter((l) => l['parentId'] === taskId && l['msg'] === 'batch child started');
    expect(started.map((l) => l['child']).sort((a, b) => Number(a) - Number(b))).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    // The parent's progress: strictly increasing, ending at the total.
    const values = progress.filter((p) => p.progressToken === 'py-parent').map((p) => p.progress);
    expect(values.length).toBeGreaterThan(0);
    expect(values).toEqual([...values].sort((a, b) => a - b));
    expect(new Set(values).size).toBe(values.length);
    expect(values.at(-1)).toBe(8);
    // The batch ended: no open children left in the principal's open work.
    expect(await stack.r.scard(keys.batch(taskId).open)).toBe(0);
  });

  it('a Python parent fans out to a Node child tool (another queue, from the catalogs)', async () => {
    const items = Array.from({ length: 5 }, (_, n) => ({ n, delayMs: 10, ...(n === 2 ? { fail: true } : {}) }));
    const taskId = await startTask(client, 'py_fan_out', { items, tool: 'maybe_fail', concurrency: 2 });
    const batch = (await taskResult(client, taskId, 30_000)).structuredContent as unknown as BatchResult;
    expect(batch).toMatchObject({ total: 5, completed: 4, failed: 1, cancelled: 0 });
    expect(batch.outcomes.map((o) => o.status)).toEqual(['completed', 'completed', 'failed', 'completed', 'completed']);
    expect(batch.outcomes[2]?.error).toBe('child 2 failed');
    expect(await stack.r.hget(keys.batch(taskId).hash, 'childPool')).toBe('batches~maybe_fail');
  });

  it('a bad fan_out is the tool’s error, naming what is wrong, and nothing is stored', async () => {
    const taskId = await startTask(client, 'py_fan_out', { items: [], tool: 'py_part' });
    const result = await taskResult(client, taskId, 20_000);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toContain('ctx.fan_out: items must not be empty');
    expect(await stack.r.exists(keys.batch(taskId).hash)).toBe(0);
  });

  it('a cancel of the Python parent stops its running children at once, removes its queued ones, and frees its open work', async () => {
    const gate = join(dir, 'never');
    const items = Array.from({ length: 10 }, (_, n) => ({ n: 100 + n, gate }));
    const taskId = await startTask(client, 'py_fan_out', { items, tool: 'py_part', concurrency: 10 });
    // Six slots between the two Python workers: some children run, the rest of the window waits in the queue.
    await waitFor(async () => (await stack.r.scard(keys.batch(taskId).running)) >= 4, {
      message: 'four children never ran',
      timeoutMs: scaled(15_000),
    });
    const owner = (await stack.r.hget(keys.batch(taskId).hash, 'owner')) ?? '';
    const cancelled = await client.experimental.tasks.cancelTask(taskId);
    expect(cancelled.status).toBe('cancelled');
    const logs = () =>
      alive()
        .flatMap((p) => p.logs())
        .filter((l) => l['parentId'] === taskId);
    // Every running child stops on a cancel message, the parent's or its last run's for each child (the sweep is a
    // minute away in this suite).
    await waitFor(
      () => {
        const started = logs().filter((l) => l['msg'] === 'batch child started').length;
        return (
          started > 0 && logs().filter((l) => l['msg'] === 'batch child stopped with its batch').length === started
        );
      },
      { message: 'the running children were not stopped', timeoutMs: scaled(10_000) },
    );
    // The parent's last run (promoted by the cancel) stops the batch: none recorded, no child left queued or counted
    // in its principal's open work.
    const open = async () =>
      (await stack.r.zrange(keys.principalOpenTasks(owner), 0, -1)).filter((id) => id.startsWith(`${taskId}.`));
    await waitFor(async () => (await open()).length === 0, {
      message: 'the children stayed in their principal’s open work',
      timeoutMs: scaled(5_000),
    });
    expect(await stack.r.hget(keys.batch(taskId).hash, 'stopped')).toBe('1');
    expect(await stack.r.hlen(keys.batch(taskId).outcomes)).toBe(0);
    expect(await stack.r.zcard(`${keys.bullQueueKeyPrefix}default~py_part:prioritized`)).toBe(0);
    expect(traced().filter((l) => / start 1\d\d$/.test(l)).length).toBe(
      logs().filter((l) => l['msg'] === 'batch child started').length,
    );
  });

  it('a SIGKILL of a Python worker mid-batch still ends the batch with each child recorded once', async () => {
    const items = Array.from({ length: 16 }, (_, n) => ({ n: 200 + n, delayMs: 400 }));
    const taskId = await startTask(client, 'py_fan_out', { items, tool: 'py_part', concurrency: 4 });
    // Some recorded, some running: kill a Python worker that runs one of them.
    await waitFor(async () => (await stack.r.hlen(keys.batch(taskId).outcomes)) >= 3, {
      message: 'no child recorded',
      timeoutMs: scaled(20_000),
    });
    const running = alive().find((p) =>
      p.logs().some((l) => l['parentId'] === taskId && l['msg'] === 'batch child started'),
    );
    expect(running).toBeDefined();
    await running!.kill('SIGKILL');
    await addPython();
    const batch = (await taskResult(client, taskId, scaled(60_000))).structuredContent as unknown as BatchResult;
    expect(batch).toMatchObject({ total: 16, completed: 16, failed: 0, cancelled: 0 });
    expect(batch.outcomes.every((o) => o.status === 'completed')).toBe(true);
    // Every child finished at least once; the counters and the outcome hash count each once.
    const done = new Set(traced().flatMap((l) => /^\d+ done (2\d\d)$/.exec(l)?.slice(1, 2).map(Number) ?? []));
    expect([...done].sort((a, b) => a - b)).toEqual(items.map((i) => i.n));
    expect(await stack.r.hget(keys.batch(taskId).hash, 'completed')).toBe('16');
  });

  it('Python children release the next window while their parent’s replay is busy (§26.3 step 4)', async () => {
    const items = Array.from({ length: 12 }, (_, n) => ({ n: 300 + n, delayMs: 100 }));
    const taskId = await startTask(client, 'py_fan_out', { items, tool: 'py_part', concurrency: 2, replayMs: 3_000 });
    const batch = (await taskResult(client, taskId, scaled(60_000))).structuredContent as unknown as BatchResult;
    expect(batch).toMatchObject({ total: 12, completed: 12, failed: 0 });
    // Between the first replay's start and its end (3 s holding its slot), more than a window of children started:
    // the children released the next windows themselves.
    const lines = traced();
    const from = lines.indexOf(lines.find((l) => / parent-start 300$/.test(l)) ?? '');
    const to = lines.indexOf(lines.find((l) => / parent-slept 300$/.test(l)) ?? '');
    expect(from).toBeGreaterThanOrEqual(0);
    expect(to).toBeGreaterThan(from);
    const during = lines.slice(from, to).filter((l) => / start 3\d\d$/.test(l));
    expect(during.length).toBeGreaterThan(2);
  });

  it('ctx.list_roots asks the client for its roots (roots/list) and returns them', async () => {
    const taskId = await startTask(client, 'py_roots', {});
    const result = await taskResult(client, taskId, 20_000);
    expect(result.structuredContent).toEqual({ uris: ['file:///work/a', 'file:///work/b'] });
  });
});

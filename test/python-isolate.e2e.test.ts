/**
 * Issue 49 item 4, PROTOCOL.md §29.5: isolated runs of Python tools (`isolate=True`, `max_memory_mb`, §31): each run in
 * a child process whose `ctx` calls cross to the worker. Real processes: Redis, a Node gateway and one Python worker
 * serving test/fixtures/python_isolated_tools.py, with a 2 s lock. Skipped, with one line, when no Python with
 * taskrelay-worker is installed.
 */
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ElicitRequestSchema, type ProgressNotification } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { PYTHON, ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';
import { scaled } from './helpers/load.js';

const PY_TOOLS = resolve(ROOT, 'test/fixtures/python_isolated_tools.py');
/** A short lock: a handler that blocked the worker's loop for longer would lose its job (§10.4). */
const LOCK_MS = 2_000;

if (PYTHON === undefined) {
  console.log('python-isolate suite skipped: no .venv/bin/python with taskrelay-worker (needs Python 3.11+)');
}

function alivePid(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe.skipIf(PYTHON === undefined)('§29.5 isolated runs of Python tools', () => {
  const stack = useStack({
    name: 'pyiso',
    env: { WORKER_LOCK_DURATION_MS: String(LOCK_MS), WORKER_SHUTDOWN_GRACE_MS: '300' },
    workers: [],
    pythonWorkers: [{ TASKRELAY_TOOLS: PY_TOOLS }],
  });
  let client: Client;
  let keys: ReturnType<typeof createKeys>;
  const worker = () => stack.pythonWorkers[0]!;
  const dir = mkdtempSync(join(tmpdir(), 'py-iso-'));
  const progress: ProgressNotification['params'][] = [];
  const started = (taskId: string) =>
    worker()
      .logs()
      .filter((l) => l['taskId'] === taskId && l['msg'] === 'tool started');
  const storedError = async (taskId: string) =>
    JSON.parse((await stack.r.hget(keys.task(taskId), 'error')) ?? '{}') as { code?: string; message?: string };

  beforeAll(async () => {
    keys = createKeys(stack.prefix);
    client = await stack.client({}, undefined, {
      capabilities: { elicitation: {} },
      progress,
      before(c) {
        c.setRequestHandler(ElicitRequestSchema, () => Promise.resolve({ action: 'accept', content: { name: 'Ada' } }));
      },
    });
  });

  it('runs in a child process; its progress and log lines reach the caller and the worker', async () => {
    const taskId = await startTask(client, 'py_iso_progress', {}, { progressToken: 'iso' });
    const result = (await taskResult(client, taskId, 30_000)).structuredContent as { pid: number; attempt: number };
    expect(result.attempt).toBe(1);
    expect(result.pid).not.toBe(worker().child.pid);
    const values = progress.filter((p) => p.progressToken === 'iso').map((p) => p.progress);
    expect(values.at(-1)).toBe(3);
    expect(values).toEqual([...values].sort((a, b) => a - b));
    expect(
      worker()
        .logs()
        .some((l) => l['taskId'] === taskId && l['msg'] === 'isolated run reporting' && l['child'] === result.pid),
    ).toBe(true);
  });

  it('a handler that never yields for twice the lock duration keeps its job: the worker’s loop stays free', async () => {
    const taskId = await startTask(client, 'py_iso_busy', { ms: 2 * LOCK_MS });
    const result = (await taskResult(client, taskId, 30_000)).structuredContent as { attempt: number };
    expect(result.attempt).toBe(1);
    expect(started(taskId)).toHaveLength(1);
    expect(
      worker()
        .logs()
        .some((l) => l['taskId'] === taskId && l['reason'] === 'LOCK_LOST'),
    ).toBe(false);
  });

  it('a run past max_memory_mb fails its task with MEMORY_LIMIT, is not retried, and the worker lives on', async () => {
    const taskId = await startTask(client, 'py_iso_hog', {});
    const result = await taskResult(client, taskId, 30_000);
    expect(result.isError).toBe(true);
    const message = 'Tool py_iso_hog ran out of memory: its run used more than maxMemoryMb 128 MB and was stopped';
    expect(await storedError(taskId)).toMatchObject({ code: 'MEMORY_LIMIT', message });
    expect(started(taskId)).toHaveLength(1);
    expect(worker().child.exitCode).toBeNull();
    const after = await startTask(client, 'py_iso_progress', {});
    expect((await taskResult(client, after, 30_000)).structuredContent).toMatchObject({ attempt: 1 });
  });

  it('a cancel kills a child that never yields once its kill_grace_ms is up', async () => {
    const pidfile = join(dir, 'spin.pid');
    const taskId = await startTask(client, 'py_iso_spin', { pidfile });
    await waitFor(() => existsSync(pidfile) && readFileSync(pidfile, 'utf8').length > 0, {
      message: 'the spinning child never started',
      timeoutMs: scaled(20_000),
    });
    const pid = Number(readFileSync(pidfile, 'utf8'));
    expect(alivePid(pid)).toBe(true);
    expect((await client.experimental.tasks.cancelTask(taskId)).status).toBe('cancelled');
    await waitFor(() => !alivePid(pid), { message: 'the child was not killed', timeoutMs: scaled(5_000) });
    expect(
      worker()
        .logs()
        .some(
          (l) =>
            l['taskId'] === taskId && l['msg'] === 'isolated run did not end within kill_grace_ms; killing its child',
        ),
    ).toBe(true);
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('cancelled');
  });

  it('a child that exits without a result fails its run with TOOL_FAILED, as Node words it', async () => {
    const taskId = await startTask(client, 'py_iso_crash', {});
    await taskResult(client, taskId, 30_000);
    expect(await storedError(taskId)).toMatchObject({
      code: 'TOOL_FAILED',
      message: "Tool py_iso_crash's isolated run ended without a result (exit code 3)",
    });
  });

  it('a question asked in the child suspends the run, and the resumed run gets its answer and runs its step', async () => {
    const taskId = await startTask(client, 'py_iso_ask', {});
    const result = (await taskResult(client, taskId, 30_000)).structuredContent as { greeting: string };
    expect(result.greeting).toBe('Hello Ada');
    expect(started(taskId).length).toBeGreaterThanOrEqual(2);
  });
});

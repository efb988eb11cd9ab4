/**
 * Issue 48 P1, PROTOCOL.md §5.7 and §29: a Python worker sent SIGTERM with several long jobs in flight keeps their
 * locks renewed through its whole grace (which is several lock durations long here), then hands each job back, as the
 * Node worker does (test/faults/worker-drain.fault.test.ts). Before, bullmq's fetch loop ended at once on close and
 * stopped renewing: the locks lapsed mid-grace (`LOCK_LOST`), the hand-back answered -2, and the tasks sat `working`
 * with no worker until another worker's stall check.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { waitFor } from '../helpers/wait-for.js';
import { PYTHON, ROOT, type ManagedProcess } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { getTask, startTask } from '../helpers/tasks.js';

if (PYTHON === undefined) console.log('python-drain fault suite skipped: no .venv/bin/python (needs Python 3.11+)');

/** Four lock durations: the locks must be renewed through it. */
const LOCK_MS = 1_500;
const GRACE_MS = 6_000;
const IN_FLIGHT = 4;
const PUT_BACK = 'job put back, at the front of its queue, for another worker';
const HANDED_BACK = 'Waiting to be resumed: its worker stopped and put its run back in the queue';

describe.skipIf(PYTHON === undefined)('a Python worker sent SIGTERM at load', () => {
  const stack = useStack({ name: 'f-pydrain', redis: { owned: true }, workers: [], mcp: true });
  let client: Client;
  let draining: ManagedProcess;
  /** A live worker of the same tool, busy with `blocker` (one slot) while the other drains. */
  let busy: ManagedProcess;
  let blocker: string;
  /** The handed-back task the live worker took, and then died running. */
  let resumed: string | undefined;
  const tasks: string[] = [];
  let exitCode: number | null;
  let drainMs: number;
  const seenBeforeResume: Array<{ status: string; statusMessage?: string | undefined }> = [];

  beforeAll(async () => {
    client = stack.mcp;
    const env = {
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'),
      WORKER_LOCK_DURATION_MS: String(LOCK_MS),
      WORKER_SHUTDOWN_GRACE_MS: String(GRACE_MS),
      WORKER_HEARTBEAT_MS: '500',
    };
    busy = await stack.addPythonWorker({ ...env, WORKER_CONCURRENCY: '1' });
    blocker = await startTask(client, 'py_count', { n: 1_000, delay_ms: 100 });
    await waitFor(() => busy.logs().some((l) => l['taskId'] === blocker && l['msg'] === 'tool started'));
    // Free slots beside the jobs in flight: bullmq then has a fetch pending, which its close ends at once.
    draining = await stack.addPythonWorker({ ...env, WORKER_CONCURRENCY: String(2 * IN_FLIGHT) });
    for (let i = 0; i < IN_FLIGHT; i += 1) tasks.push(await startTask(client, 'py_count', { n: 1_000, delay_ms: 100 }));
    await waitFor(
      () => tasks.every((id) => draining.logs().some((l) => l['taskId'] === id && l['msg'] === 'tool started')),
      { timeoutMs: 20_000, message: 'the tasks did not all start on the worker' },
    );
    // Some progress first ("step n of 1000"), so that stale progress would show.
    for (const id of tasks) await waitFor(async () => (await getTask(client, id)).statusMessage !== undefined);
    const signalledAt = Date.now();
    void draining.kill('SIGTERM');
    exitCode = await draining.exited;
    drainMs = Date.now() - signalledAt;
    for (const id of tasks) {
      const task = await getTask(client, id);
      seenBeforeResume.push({ status: task.status, statusMessage: task.statusMessage });
    }
  }, 120_000);

  it('keeps every job lock through the grace: no run ends with LOCK_LOST', () => {
    const lost = draining.logs().filter((l) => l['reason'] === 'LOCK_LOST' || l['msg'] === 'BullMQ worker error');
    expect(lost, JSON.stringify(lost.slice(0, 3))).toEqual([]);
    expect(drainMs).toBeGreaterThanOrEqual(GRACE_MS);
  });

  it('hands every job back after the grace, and exits 0', () => {
    for (const id of tasks) {
      const lines = draining.logs().filter((l) => l['taskId'] === id && typeof l['msg'] === 'string');
      expect(
        lines.map((l) => l['msg']),
        id,
      ).toContain(PUT_BACK);
    }
    expect(exitCode).toBe(0);
  });

  it('a handed-back task says it waits to be resumed, not its last run’s progress (issue 48 P2)', () => {
    for (const seen of seenBeforeResume) {
      expect(seen).toEqual({ status: 'working', statusMessage: HANDED_BACK });
    }
  });

  it('the next run of a handed-back task clears that message as it starts', async () => {
    await client.experimental.tasks.cancelTask(blocker);
    // The live worker has one slot: it takes one of the handed-back jobs (they share the front of the queue).
    const taken = await waitFor(
      () => tasks.find((id) => busy.logs().some((l) => l['taskId'] === id && l['msg'] === 'tool started')),
      { timeoutMs: 15_000, message: 'no handed-back job was taken by the live worker' },
    );
    resumed = taken;
    await waitFor(async () => (await getTask(client, taken)).statusMessage?.startsWith('step') === true);
  });

  it('a task whose run died with the last worker of its tool says so, not its stale progress (issue 48 P2)', async () => {
    const first = resumed ?? '';
    await busy.kill('SIGKILL');
    // The worker's catalog entry lapses within 3 heartbeats; then the gateway knows no worker serves the tool.
    await waitFor(
      async () =>
        /^Waiting to be resumed: no live worker serves tool py_count/.test(
          (await getTask(client, first)).statusMessage ?? '',
        ),
      {
        timeoutMs: 15_000,
        message: 'the task kept showing its stale progress',
      },
    );
    expect((await getTask(client, first)).status).toBe('working');
  });
});

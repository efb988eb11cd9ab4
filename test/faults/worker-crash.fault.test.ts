/**
 * Fault suite, PROTOCOL.md §5.6 and §10.5–§10.6: a SIGKILLed worker's job is taken over by another worker; stalls are
 * not attempts (each tool has its own `maxStalls`, default 10); a run is a run (`ctx.attempt` counts them).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { useStack } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait-for.js';
import type { GatewayProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  FaultRecords,
  TERMINAL,
  WorkerPool,
  startTask,
  overlappingRuns,
  taskResult,
  textOf,
  watchingClient,
  type WatchingClient,
} from '../helpers/faults.js';

const stack = useStack({
  name: 'f-crash',
  redis: { owned: true },
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
  workers: [],
});
let r: Redis;
let gateway: GatewayProcess;
let records: FaultRecords;
let pool: WorkerPool;

beforeAll(async () => {
  ({ r, gateway } = stack);
  records = new FaultRecords(r, stack.prefix);
  pool = new WorkerPool({ ...stack.env, TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_LOCK_DURATION_MS: '2000' });
  await pool.start(2);
});

afterAll(async () => {
  await pool?.stopAll();
});

/**
 * SIGKILLs the worker running the task's nth run (once it reported a few steps), marks it in the records, and starts
 * a replacement worker. Fails at once, naming the status, when the task ends instead of starting that run.
 */
async function killRunningWorker(client: Client, taskId: string, nth: number): Promise<number> {
  const outcome = await waitFor(
    async () => {
      const starts = (await records.events(taskId)).filter((e) => e.e === 'start');
      if (starts[nth - 1]) return { run: starts[nth - 1] };
      const task = await client.experimental.tasks.getTask(taskId);
      return TERMINAL.has(task.status) ? { ended: task } : undefined;
    },
    { timeoutMs: 15_000, message: `run ${nth} of task ${taskId} did not start` },
  );
  if (!outcome.run) {
    throw new Error(`task ended ${outcome.ended?.status} (${outcome.ended?.statusMessage}) before run ${nth} started`);
  }
  await records.waitForSteps(taskId, outcome.run.run, 3);
  await pool.kill(outcome.run.pid);
  await records.markKilled(taskId, outcome.run.pid);
  await pool.start(1);
  return outcome.run.pid;
}

const terminalNotices = (watcher: WatchingClient, taskId: string) =>
  watcher.statuses.filter((s) => s.taskId === taskId && TERMINAL.has(s.status));

describe('§5.6 a SIGKILLed worker mid-run', () => {
  let watcher: WatchingClient;
  let taskId: string;
  let killedPid: number;

  beforeAll(async () => {
    watcher = await watchingClient(gateway.url);
    taskId = await startTask(watcher.client, 'steady', { ms: 3_000, stepMs: 100 }, { progressToken: 'crash-1' });
    const first = await records.waitForStart(taskId);
    await records.waitForSteps(taskId, first.run, 5);
    // The client has seen the first run's progress before the crash.
    await waitFor(() => watcher.progress.some((p) => p.progressToken === 'crash-1'), {
      message: 'no progress reached the client before the crash',
    });
    killedPid = await killRunningWorker(watcher.client, taskId, 1);
    await taskResult(watcher.client, taskId, 30_000);
    await waitFor(() => terminalNotices(watcher, taskId).length > 0, { message: 'no terminal status notification' });
  });

  afterAll(async () => {
    await watcher?.close();
  });

  it('hands the job to another worker, which completes the task exactly once', async () => {
    const runs = await records.runs(taskId);
    expect(runs.map((run) => run.pid)).toHaveLength(2);
    expect(runs[1]?.pid).not.toBe(killedPid);
    const finished = runs.filter((run) => run.events.some((e) => e.e === 'end' && e.outcome === 'returned'));
    expect(finished.map((run) => run.pid)).toEqual([runs[1]?.pid]);
    expect(overlappingRuns(await records.events(taskId))).toEqual([]);

    const task = await watcher.client.experimental.tasks.getTask(taskId);
    expect(task.status).toBe('completed');
    const result = await taskResult(watcher.client, taskId);
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toMatchObject({ pid: runs[1]?.pid, taskId });
    expect(terminalNotices(watcher, taskId).map((s) => s.status)).toEqual(['completed']);
  });

  it('shows the client progress that never goes back, and keeps it coming from the run that took over', async () => {
    const seen = watcher.progress.filter((p) => p.progressToken === 'crash-1');
    const values = seen.map((p) => p.progress);
    for (let i = 1; i < values.length; i++) expect(values[i]).toBeGreaterThan(values[i - 1] ?? -Infinity);
    const takeover = (await records.runs(taskId))[1];
    expect(seen.some((p) => p.message?.startsWith(`${takeover?.pid}:`))).toBe(true);
  });

  it('counts the takeover as a new run: ctx.attempt is 2 and ctx.taskId is unchanged (§10.6)', async () => {
    const runs = await records.runs(taskId);
    expect(runs.map((run) => run.attempt)).toEqual([1, 2]);
    expect(new Set(runs.flatMap((run) => run.events.map((e) => e.taskId)))).toEqual(new Set([taskId]));
  });
});

describe('§10.6 stalls are not attempts', () => {
  it('completes a task whose worker was SIGKILLed three times in a row (more than maxStalledCount 1, fewer than maxStalls 10)', async () => {
    const watcher = await watchingClient(gateway.url);
    // 6 s a run: each kill comes a few steps into its run, even when a loaded machine slows the test's polling (with
    // 1.5 s, run 2 once ended before the test got to kill it).
    const taskId = await startTask(watcher.client, 'steady', { ms: 6_000, stepMs: 100 });
    const killed: number[] = [];
    for (let nth = 1; nth <= 3; nth++) killed.push(await killRunningWorker(watcher.client, taskId, nth));

    const result = await taskResult(watcher.client, taskId, 30_000);
    expect(textOf(result)).not.toMatch(/stopped responding/);
    expect(result.isError).not.toBe(true);
    expect((await watcher.client.experimental.tasks.getTask(taskId)).status).toBe('completed');
    const runs = await records.runs(taskId);
    expect(runs).toHaveLength(4);
    expect(killed).not.toContain(runs[3]?.pid);
    expect(result.structuredContent).toMatchObject({ pid: runs[3]?.pid });
    await watcher.close();
  });

  it('fails a maxStalls: 1 tool taken over twice with "stopped responding", and tasks/result returns that failure', async () => {
    const watcher = await watchingClient(gateway.url);
    const taskId = await startTask(watcher.client, 'fragile', { ms: 20_000, stepMs: 100 });
    // A waiter that is already blocked when the task fails must be answered.
    const waiting = taskResult(watcher.client, taskId, 30_000);
    await killRunningWorker(watcher.client, taskId, 1);
    await killRunningWorker(watcher.client, taskId, 2);

    const result = await waiting;
    expect(result.isError).toBe(true);
    expect(textOf(result)).toMatch(/stopped responding/);
    const task = await watcher.client.experimental.tasks.getTask(taskId);
    expect(task.status).toBe('failed');
    // Over its stall budget, the job fails without running the tool a third time.
    expect(await records.runs(taskId)).toHaveLength(2);
    await watcher.close();
  });
});

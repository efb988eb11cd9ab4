/**
 * Fault suite, docs/CONFIGURATION.md (`WORKER_SHUTDOWN_GRACE_MS`) and docs/MCP.md (a draining worker still counts), PROTOCOL.md §5:
 * a worker sent SIGTERM lets running jobs finish within its grace, aborts longer ones with `WORKER_SHUTDOWN` and hands
 * them back without using an attempt, keeps its tools listed while it drains, and exits 0.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { createKeys } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import type { ManagedProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  startTask,
  rejectionOf,
  taskResult,
  waitForTerminal,
  useFaultStack,
  type FaultEvent,
  type WatchingClient,
} from '../helpers/faults.js';
import { scaled } from '../helpers/load.js';

const GRACE_MS = 5_000;

const fault = useFaultStack({
  name: 'f-drain',
  workerEnv: {
    TASKRELAY_TOOLS: FAULT_TOOLS,
    WORKER_LOCK_DURATION_MS: '2000',
    WORKER_SHUTDOWN_GRACE_MS: String(GRACE_MS),
    WORKER_HEARTBEAT_MS: '500',
  },
});
let r: Redis;
let records: FaultRecords;
let watcher: WatchingClient;
let draining: ManagedProcess;
let replacement: ManagedProcess;
/** Fits in the grace. */
let shortTask: string;
/** Its first run is longer than the grace (but shorter than the 10 s a worker would wait by default). */
let longTask: string;
const seenWhileDraining: { tools?: string[]; toolsError?: unknown; call?: string; callError?: unknown } = {};
let exitCode: number | null | 'still running';
/** The long task's stored status message between the drain and the next run. */
let handedBackMessage: string | null;

beforeAll(async () => {
  ({ records, watcher } = fault);
  ({ r } = fault.stack);
  [draining] = fault.stack.workers as [ManagedProcess];

  longTask = await startTask(watcher.client, 'steady_once', { ms: 500, firstRunMs: 7_000 });
  await records.waitForStart(longTask, { pid: draining.pid });
  shortTask = await startTask(watcher.client, 'steady', { ms: 2_500 });
  await records.waitForStart(shortTask, { pid: draining.pid });
  void draining.kill('SIGTERM');

  // Checked once the short job is done: by then the drain has lasted longer than the gateway's catalog cache.
  await waitFor(async () => (await records.events(shortTask)).some((e) => e.e === 'end'), {
    timeoutMs: 10_000,
    message: 'the short job did not end',
  });
  try {
    seenWhileDraining.tools = (await watcher.client.listTools()).tools.map((t) => t.name);
  } catch (error) {
    seenWhileDraining.toolsError = error;
  }
  const accepted = startTask(watcher.client, 'steady', { ms: 100 });
  seenWhileDraining.callError = await rejectionOf(accepted);
  if (!seenWhileDraining.callError) seenWhileDraining.call = await accepted;
  if (draining.child.exitCode !== null) throw new Error('the worker exited before the drain was observed');

  exitCode = await Promise.race([
    draining.exited,
    new Promise<'still running'>((resolve) => setTimeout(() => resolve('still running'), scaled(20_000)).unref()),
  ]);
  handedBackMessage = await r.hget(createKeys(fault.stack.prefix).task(longTask), 'statusMessage');
  replacement = await fault.stack.addWorker();
  await Promise.all(
    [shortTask, longTask, seenWhileDraining.call]
      .filter((id): id is string => id !== undefined)
      .map((id) => waitForTerminal(watcher.client, id, 30_000)),
  );
});

const runEnd = (events: FaultEvent[], pid: number) => events.find((e) => e.e === 'end' && e.pid === pid);

describe('a worker sent SIGTERM', () => {
  it('lets a running job that fits in WORKER_SHUTDOWN_GRACE_MS finish on the draining worker', async () => {
    expect(runEnd(await records.events(shortTask), draining.pid)).toMatchObject({ outcome: 'returned' });
    expect((await watcher.client.experimental.tasks.getTask(shortTask)).status).toBe('completed');
    expect((await taskResult(watcher.client, shortTask)).structuredContent).toMatchObject({ pid: draining.pid });
  });

  it('aborts a job longer than the grace with WORKER_SHUTDOWN and hands it back: an attempts: 1 tool completes on another worker', async () => {
    expect(runEnd(await records.events(longTask), draining.pid)).toMatchObject({
      outcome: 'threw',
      reason: 'WORKER_SHUTDOWN',
    });
    const task = await watcher.client.experimental.tasks.getTask(longTask);
    expect(task.status, task.statusMessage).toBe('completed');
    expect((await taskResult(watcher.client, longTask)).structuredContent).toMatchObject({ pid: replacement.pid });
  });

  it('a handed-back task says it waits to be resumed until its next run starts (issue 48 P2)', async () => {
    expect(handedBackMessage).toBe('Waiting to be resumed: its worker stopped and put its run back in the queue');
    expect((await watcher.client.experimental.tasks.getTask(longTask)).statusMessage).toBeUndefined();
  });

  it('exits with code 0 once its jobs are finished or handed back', () => {
    expect(exitCode).toBe(0);
  });

  it('keeps its tools listed while it drains, and a new call is accepted and queued for the next worker', async () => {
    expect(seenWhileDraining.toolsError).toBeUndefined();
    expect(seenWhileDraining.tools).toEqual(expect.arrayContaining(['steady', 'steady_once']));
    expect(seenWhileDraining.callError).toBeUndefined();
    const call = seenWhileDraining.call ?? '';
    // Not taken by the draining worker; run by the next one.
    expect((await records.runs(call)).map((run) => run.pid)).toEqual([replacement.pid]);
    expect((await watcher.client.experimental.tasks.getTask(call)).status).toBe('completed');
  });
});

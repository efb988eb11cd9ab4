/**
 * Fault suite, PROTOCOL.md §5 and §25 (issue 20): a job a draining worker hands back at SIGTERM goes to the front of
 * its queue, so it runs again before the jobs queued after it (it used to re-enter behind every job of its fair-share
 * priority, and ran again 100 s later on a busy pool). Its second run is a new run: `ctx.attempt` is 2.
 *
 * One slot per worker, so the order jobs start in is the order the pool hands them out: a long task A runs on the
 * first worker; B, C and D are queued behind it; the worker is sent SIGTERM, aborts A after its grace and hands it
 * back; a second worker then runs A, B, C, D in that order.
 *
 * The same holds for a batch child (PROTOCOL.md §26): both runs share one hand-back (engine/run-envelope.ts). A child
 * used to go back with a 0 ms delayed move, behind every job of its fair-share priority queued meanwhile.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { ManagedProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  startTask,
  waitForTerminal,
  useFaultStack,
  type WatchingClient,
} from '../helpers/faults.js';
import { scaled } from '../helpers/load.js';

/** One slot, a short lock and grace: a SIGTERM hands its run back within a second. */
const WORKER = {
  TASKRELAY_TOOLS: FAULT_TOOLS,
  WORKER_CONCURRENCY: '1',
  WORKER_LOCK_DURATION_MS: '2000',
  WORKER_SHUTDOWN_GRACE_MS: '300',
  WORKER_HEARTBEAT_MS: '500',
};

const fault = useFaultStack({
  name: 'f-handback',
  workerEnv: WORKER,
});
let records: FaultRecords;
let watcher: WatchingClient;
let draining: ManagedProcess;
let replacement: ManagedProcess;
let handedBack: string;
let queuedAfter: string[];
let exitCode: number | null | 'still running';

beforeAll(async () => {
  ({ records, watcher } = fault);
  [draining] = fault.stack.workers as [ManagedProcess];

  // Far longer than the grace on its first run; short when it runs again.
  handedBack = await startTask(watcher.client, 'steady_once', { ms: 300, firstRunMs: 60_000 });
  await records.waitForStart(handedBack, { pid: draining.pid });
  queuedAfter = [];
  // The same tool: one queue (PROTOCOL.md §3.2), whose order the hand-back is about.
  for (let i = 0; i < 3; i++) queuedAfter.push(await startTask(watcher.client, 'steady_once', { ms: 300 }));
  void draining.kill('SIGTERM');
  exitCode = await Promise.race([
    draining.exited,
    new Promise<'still running'>((resolve) => setTimeout(() => resolve('still running'), scaled(20_000)).unref()),
  ]);
  replacement = await fault.stack.addWorker();
  await Promise.all([handedBack, ...queuedAfter].map((id) => waitForTerminal(watcher.client, id, 30_000)));
});

describe('a job handed back at SIGTERM', () => {
  it('is aborted on the draining worker with WORKER_SHUTDOWN, which exits 0 having run nothing else', async () => {
    expect(exitCode).toBe(0);
    const first = (await records.runs(handedBack))[0];
    expect(first?.pid).toBe(draining.pid);
    expect(first?.events.at(-1)).toMatchObject({ e: 'end', outcome: 'threw', reason: 'WORKER_SHUTDOWN' });
    for (const id of queuedAfter) expect((await records.runs(id)).map((run) => run.pid)).toEqual([replacement.pid]);
  });

  it('runs again before the jobs queued after it, as run 2 (ctx.attempt)', async () => {
    const runs = await records.runs(handedBack);
    expect(runs.map((run) => [run.pid, run.attempt])).toEqual([
      [draining.pid, 1],
      [replacement.pid, 2],
    ]);
    // One slot: each task ends before the next starts, so the order they ended in is the order they were handed out.
    const ended = await Promise.all(
      [handedBack, ...queuedAfter].map(async (id) => {
        const task = await watcher.client.experimental.tasks.getTask(id);
        expect(task.status, task.statusMessage).toBe('completed');
        return { id, at: Date.parse(task.lastUpdatedAt) };
      }),
    );
    const order = [...ended].sort((a, b) => a.at - b.at).map((e) => e.id);
    expect(order).toEqual([handedBack, ...queuedAfter]);
  });
});

describe('a batch child handed back at SIGTERM', () => {
  let childId: string;
  let after: string[];
  let first: ManagedProcess;
  let second: ManagedProcess;
  let client: WatchingClient;
  const batch = useFaultStack({
    name: 'f-handback-batch',
    workerEnv: WORKER,
  });

  beforeAll(async () => {
    const batchRecords = batch.records;
    client = batch.watcher;
    [first] = batch.stack.workers as [ManagedProcess];
    // One child, far longer than the grace on its first run. The parent suspends while it runs (no slot held).
    const parent = await startTask(client.client, 'fan_steady', { items: [{ ms: 300, firstRunMs: 60_000 }] });
    childId = `${parent}.0`;
    await batchRecords.waitForStart(childId, { pid: first.pid });
    // Queued after the child started, by the same principal, who then has nothing else waiting: the fair-share
    // priority the child was given, so only the hand-back's place in that priority orders them.
    after = [];
    // The child's tool, so one queue (PROTOCOL.md §3.2).
    for (let i = 0; i < 3; i++) after.push(await startTask(client.client, 'steady_once', { ms: 300 }));
    void first.kill('SIGTERM');
    await first.exited;
    second = await batch.stack.addWorker();
    await Promise.all([parent, ...after].map((id) => waitForTerminal(client.client, id, 30_000)));
    records = batchRecords;
  });

  it('runs again before the jobs queued after it', async () => {
    const runs = await records.runs(childId);
    expect(runs.map((run) => run.pid)).toEqual([first.pid, second.pid]);
    expect(runs[0]?.events.at(-1)).toMatchObject({ e: 'end', outcome: 'threw', reason: 'WORKER_SHUTDOWN' });
    const startOf = async (id: string, pid: number) =>
      (await records.runs(id)).find((run) => run.pid === pid)?.events.find((e) => e.e === 'start')?.at ?? Infinity;
    const childAgain = await startOf(childId, second.pid);
    for (const id of after) expect(childAgain).toBeLessThan(await startOf(id, second.pid));
  });
});

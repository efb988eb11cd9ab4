/**
 * Fault suite, PROTOCOL.md §3.2 (issue 30 item 1): the tool, not the tool set, is the unit of queueing. Two tool sets
 * share `steady` and `steady_once` (test/fixtures/tool-set-a.mjs, tool-set-b.mjs); each is its own pool, and every
 * worker of a tool takes its work:
 * - a batch's children run on the workers of the child tool, not only on the parent's tool set;
 * - a task handed back at SIGTERM by the last worker of its tool set runs on a worker of the other set;
 * - a task whose worker was SIGKILLed is taken over by a worker of the other set;
 * - one process serving several tool queues runs at most WORKER_CONCURRENCY jobs at once, across them all.
 * Before, a job went to one pool (a queue per tool set): the children stayed on set A's one worker, and the handed-back
 * or orphaned task sat queued while set B's workers served its tool.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { ROOT, type ManagedProcess } from '../helpers/processes.js';
import {
  overlappingRuns,
  startTask,
  useFaultStack,
  waitForTerminal,
  type FaultEvent,
  type FaultRecords,
  type WatchingClient,
} from '../helpers/faults.js';

const SET_A = resolve(ROOT, 'test/fixtures/tool-set-a.mjs');
const SET_B = resolve(ROOT, 'test/fixtures/tool-set-b.mjs');

// Workers start in the tests: each its tool set.
const faults = useFaultStack({
  name: 'f-toolq',
  workers: [],
  workerEnv: { WORKER_LOCK_DURATION_MS: '2000', WORKER_SHUTDOWN_GRACE_MS: '300', WORKER_HEARTBEAT_MS: '500' },
});
const { stack } = faults;
let records: FaultRecords;
let watcher: WatchingClient;

beforeAll(() => {
  ({ records, watcher } = faults);
});

const workerEnv = (tools: string, extra: Record<string, string> = {}) => ({ TASKRELAY_TOOLS: tools, ...extra });

/** The pids that started a run of each child of a batch, read from the children's records. */
async function childPids(parentId: string): Promise<number[]> {
  const pids: number[] = [];
  for (const id of await records.taskIds()) {
    if (!id.startsWith(`${parentId}.`) && id !== parentId) continue;
    for (const event of await records.events(id)) if (event.e === 'start') pids.push(event.pid);
  }
  return pids;
}

describe('§3.2 any worker that serves a tool takes its work', () => {
  let a: ManagedProcess;
  let b1: ManagedProcess;
  let b2: ManagedProcess;

  it("runs a batch's children on the workers of the child tool, across both tool sets", async () => {
    [a, b1, b2] = await Promise.all([
      stack.addWorker(workerEnv(SET_A, { WORKER_CONCURRENCY: '2' })),
      stack.addWorker(workerEnv(SET_B, { WORKER_CONCURRENCY: '2' })),
      stack.addWorker(workerEnv(SET_B, { WORKER_CONCURRENCY: '2' })),
    ]);
    const items = Array.from({ length: 24 }, () => ({ ms: 200 }));
    const parentId = await startTask(watcher.client, 'fan_wide', { items });
    expect((await waitForTerminal(watcher.client, parentId, 60_000)).status).toBe('completed');
    const pids = await childPids(parentId);
    expect(pids).toHaveLength(24);
    const byPid = new Map<number, number>();
    for (const pid of pids) byPid.set(pid, (byPid.get(pid) ?? 0) + 1);
    // Set B does not serve fan_wide, yet its workers ran children: 24 of 200 ms on 6 slots, not on A's 2.
    expect((byPid.get(b1.pid) ?? 0) + (byPid.get(b2.pid) ?? 0), JSON.stringify([...byPid])).toBeGreaterThan(0);
    expect(byPid.size).toBeGreaterThanOrEqual(2);
  }, 90_000);

  it('runs a task handed back at SIGTERM by the last worker of its tool set on a worker of the other set', async () => {
    await Promise.all([b1.kill('SIGTERM'), b2.kill('SIGTERM')]);
    // Only set A serves steady now: its run starts there.
    const taskId = await startTask(watcher.client, 'steady_once', { ms: 300, firstRunMs: 60_000 });
    await records.waitForStart(taskId, { pid: a.pid });
    const b = await stack.addWorker(workerEnv(SET_B));
    await a.kill('SIGTERM');
    // The last worker of set A handed it back; set B's worker takes it from the tool's queue.
    const second = await records.waitForStart(taskId, { nth: 2, timeoutMs: 20_000 });
    expect(second.pid).toBe(b.pid);
    expect((await waitForTerminal(watcher.client, taskId, 20_000)).status).toBe('completed');
    a = b;
  }, 60_000);

  it('takes over a task whose worker was SIGKILLed on a worker of the other tool set', async () => {
    const taskId = await startTask(watcher.client, 'steady', { ms: 300, firstRunMs: 60_000 });
    await records.waitForStart(taskId, { pid: a.pid });
    const other = await stack.addWorker(workerEnv(SET_A));
    await a.kill('SIGKILL');
    await records.markKilled(taskId, a.pid);
    const second = await records.waitForStart(taskId, { nth: 2, timeoutMs: 20_000 });
    expect(second.pid).toBe(other.pid);
    expect((await waitForTerminal(watcher.client, taskId, 20_000)).status).toBe('completed');
    expect(overlappingRuns(await records.events(taskId))).toEqual([]);
    await other.kill('SIGTERM');
  }, 60_000);

  it('runs at most WORKER_CONCURRENCY jobs at once in one process, across its tool queues', async () => {
    const worker = await stack.addWorker(workerEnv(SET_B, { WORKER_CONCURRENCY: '2' }));
    const ids = await Promise.all(
      ['steady', 'steady_once', 'fragile', 'steady', 'steady_once', 'fragile'].map((tool) =>
        startTask(watcher.client, tool, { ms: 300 }),
      ),
    );
    for (const id of ids) expect((await waitForTerminal(watcher.client, id, 30_000)).status).toBe('completed');
    const events: FaultEvent[] = [];
    for (const id of ids) events.push(...(await records.events(id)).filter((e) => e.pid === worker.pid));
    // The most runs open at once, from their start and end times.
    const edges = events
      .filter((e) => e.e === 'start' || e.e === 'end')
      .map((e) => ({ at: e.at ?? 0, delta: e.e === 'start' ? 1 : -1 }))
      .sort((x, y) => x.at - y.at || x.delta - y.delta);
    let open = 0;
    let most = 0;
    for (const edge of edges) {
      open += edge.delta;
      most = Math.max(most, open);
    }
    expect(events.filter((e) => e.e === 'start')).toHaveLength(6);
    expect(most).toBe(2);
    await worker.kill('SIGTERM');
  }, 60_000);

  it('starts a job on the free slot at once while another tool holds the other one', async () => {
    const worker = await stack.addWorker(workerEnv(SET_B, { WORKER_CONCURRENCY: '2' }));
    const long = await startTask(watcher.client, 'steady', { ms: 30_000 });
    await records.waitForStart(long, { pid: worker.pid });
    // Taking this job fills the process: BullMQ's loop must start it, not wait for a third slot first (it used to
    // hold it unstarted until the long run ended).
    const short = await startTask(watcher.client, 'steady_once', { ms: 100 });
    expect((await waitForTerminal(watcher.client, short, 15_000)).status).toBe('completed');
    expect((await records.events(long)).some((e) => e.e === 'end')).toBe(false);
    await watcher.client.experimental.tasks.cancelTask(long);
    await worker.kill('SIGTERM');
  }, 60_000);
});

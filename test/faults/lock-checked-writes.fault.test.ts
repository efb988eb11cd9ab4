/**
 * Fault suite, PROTOCOL.md §10.4: only the run that holds a job's lock may write for it. A worker cut off from Redis
 * for longer than its lock loses the job to another worker; the first run is aborted with `LOCK_LOST` and nothing it
 * sends afterwards (progress, result) lands, even when its writes reach Redis late. The worker under test talks to
 * Redis through a TCP proxy the test controls; the gateway, the second worker and the tools' records go direct.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestRedis } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait-for.js';
import type { GatewayProcess, ManagedProcess } from '../helpers/processes.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  useFaultStack,
  TERMINAL,
  startTask,
  overlappingRuns,
  taskResult,
  waitForTerminal,
  watchingClient,
  type FaultEvent,
  type WatchingClient,
} from '../helpers/faults.js';
import { scaled } from '../helpers/load.js';

const LOCK_MS = 2_000;

const faultStack = useFaultStack({
  name: 'f-lock',
  workerEnv: {
    TASKRELAY_TOOLS: FAULT_TOOLS,
    WORKER_LOCK_DURATION_MS: String(LOCK_MS),
    WORKER_SHUTDOWN_GRACE_MS: '1000',
  },
  workers: [],
});
let redis: TestRedis;
let gateway: GatewayProcess;
let records: FaultRecords;

beforeAll(() => {
  ({ records } = faultStack);
  ({ redis, gateway } = faultStack.stack);
});

/** SIGTERM, and SIGKILL if it is not gone in time: after a clean exit, everything it sent has been processed. */
async function stop(proc: ManagedProcess): Promise<void> {
  void proc.kill('SIGTERM');
  const exited = await Promise.race([
    proc.exited.then(() => true),
    new Promise<boolean>((resolve) => setTimeout(() => resolve(false), scaled(15_000)).unref()),
  ]);
  if (!exited) await proc.kill('SIGKILL');
}

describe.each([
  { fault: 'pause' as const, what: 'partitioned (its writes are delivered late)' },
  { fault: 'cut' as const, what: 'disconnected (it reconnects and replays its queued writes)' },
])('§10.4 a worker $what for longer than its lock', ({ fault }) => {
  let proxy: TcpProxy;
  let watcher: WatchingClient;
  let taskId: string;
  let first: FaultEvent;
  let second: FaultEvent;
  let events: FaultEvent[];
  const token = `lock-${fault}`;

  beforeAll(async () => {
    proxy = await startTcpProxy({ port: redis.port });
    const cutOff = await faultStack.stack.addWorker({ REDIS_URL: proxy.url, FAULT_RECORD_REDIS_URL: redis.url });
    watcher = await watchingClient(gateway.url);
    taskId = await startTask(watcher.client, 'steady', { ms: 8_000, stepMs: 100 }, { progressToken: token });
    first = await records.waitForStart(taskId, { pid: cutOff.pid });
    const other = await faultStack.stack.addWorker();
    await records.waitForSteps(taskId, first.run, 3);

    if (fault === 'pause') proxy.pause();
    else proxy.cut();
    // Everything the first run records after this marker, it did after it was cut off.
    await records.markFault(taskId, fault);
    second = await records.waitForStart(taskId, { pid: other.pid, timeoutMs: 20_000 });
    // Reconnect while the second run is still going: the first run's late writes now reach Redis.
    proxy.resume();

    await waitForTerminal(watcher.client, taskId, 30_000);
    await waitFor(
      async () => {
        const ended = (await records.events(taskId)).filter((e) => e.e === 'end').map((e) => e.run);
        return ended.includes(first.run) && ended.includes(second.run);
      },
      { timeoutMs: 30_000, message: 'both runs did not end' },
    );
    // A clean exit flushes whatever the cut-off worker still had queued.
    await Promise.all([stop(cutOff), stop(other)]);
    events = await records.events(taskId);
  });

  afterAll(async () => {
    await watcher?.close();
    await proxy?.close();
  });

  it('aborts the run that lost its lock with LOCK_LOST, so the tool never runs in two places at once', () => {
    const firstEnd = events.find((e) => e.run === first.run && e.e === 'end');
    expect.soft(firstEnd).toMatchObject({ outcome: 'threw', reason: 'LOCK_LOST' });
    expect(overlappingRuns(events)).toEqual([]);
  });

  it('never lets the first run’s later progress reach the client or the task', async () => {
    const marker = events.findIndex((e) => e.fault === fault);
    const late = new Set(
      events
        .slice(marker + 1)
        .filter((e) => e.run === first.run && e.e === 'progress')
        .map((e) => e.message),
    );
    const seen = watcher.progress.filter((p) => p.progressToken === token).map((p) => p.message);
    expect(seen.filter((message) => late.has(message))).toEqual([]);
    const task = await watcher.client.experimental.tasks.getTask(taskId);
    expect(late.has(task.statusMessage)).toBe(false);
  });

  it('never lets the first run’s result land: the task completes exactly once, with the second run’s result', async () => {
    const task = await watcher.client.experimental.tasks.getTask(taskId);
    expect(task.status).toBe('completed');
    const result = await taskResult(watcher.client, taskId);
    expect(result.structuredContent).toMatchObject({ pid: second.pid });
    const terminal = watcher.statuses.filter((s) => s.taskId === taskId && TERMINAL.has(s.status));
    expect(terminal.map((s) => s.status)).toEqual(['completed']);
  });
});

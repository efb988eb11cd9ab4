/**
 * Fault suite, docs/MCP.md (Redis unreachable) and PROTOCOL.md §6.6: a durable Redis (AOF, fsync always) is
 * SIGKILLed and restarted on the same port and data dir. During the outage requests fail fast with "Task store
 * unavailable" and /readyz is 503; afterwards everything reconnects by itself, and every task stored before the
 * outage — queued, running or already terminal — is there and ends as it should.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { TestRedis } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait-for.js';
import type { GatewayProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  startTask,
  isMcpError,
  rejectionOf,
  taskResult,
  waitForTerminal,
  useFaultStack,
  type WatchingClient,
} from '../helpers/faults.js';

const fault = useFaultStack({
  name: 'f-aof',
  redis: { owned: true, appendOnly: true },
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
  workers: [{ TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_CONCURRENCY: '2', WORKER_LOCK_DURATION_MS: '2000' }],
});
let redis: TestRedis;
let gateway: GatewayProcess;
let records: FaultRecords;
let watcher: WatchingClient;

const readyz = async () => (await fetch(gateway.url.replace(/\/mcp$/, '/readyz'))).status;

const tasks = { done: '', running: [] as string[], queued: [] as string[] };
let doneResult: CallToolResult;
const duringOutage: { call?: unknown; get?: unknown; readyz?: number } = {};

beforeAll(async () => {
  ({ records, watcher } = fault);
  ({ redis, gateway } = fault.stack);

  // One task already terminal, two running (the worker's two slots), two queued behind them.
  tasks.done = await startTask(watcher.client, 'steady', { ms: 100 });
  doneResult = await taskResult(watcher.client, tasks.done);
  for (let i = 0; i < 2; i++) tasks.running.push(await startTask(watcher.client, 'steady', { ms: 4_000 }));
  for (const taskId of tasks.running) await records.waitForStart(taskId);
  for (let i = 0; i < 2; i++) tasks.queued.push(await startTask(watcher.client, 'steady', { ms: 300 }));
  for (const taskId of tasks.queued) expect(await records.events(taskId)).toEqual([]);

  await redis.kill();
  await waitFor(async () => (await readyz()) === 503, { timeoutMs: 10_000, message: 'readyz stayed 200' });
  duringOutage.readyz = await readyz();
  [duringOutage.call, duringOutage.get] = await Promise.all([
    rejectionOf(startTask(watcher.client, 'steady', { ms: 100 }, { timeoutMs: 10_000 })),
    rejectionOf(watcher.client.experimental.tasks.getTask(tasks.running[0] ?? '', { timeout: 10_000 })),
  ]);

  await redis.restart();
  await waitFor(async () => (await readyz()) === 200, { timeoutMs: 15_000, message: 'readyz stayed 503' });
});

describe('a Redis restart (AOF, same port and data dir)', () => {
  it('answers requests during the outage with -32603 "Task store unavailable", and /readyz with 503', () => {
    expect(duringOutage.readyz).toBe(503);
    // The client's McpError message is "MCP error <code>: " + the message on the wire.
    for (const error of [duringOutage.call, duringOutage.get]) {
      expect(isMcpError(error, -32603), String(error)).toBe(true);
      expect((error as Error).message).toMatch(/^MCP error -32603: Task store unavailable/);
    }
  });

  it('keeps a terminal result: the task completed before the outage is readable by id with the same result', async () => {
    const task = await watcher.client.experimental.tasks.getTask(tasks.done);
    expect(task.status).toBe('completed');
    expect(await taskResult(watcher.client, tasks.done)).toEqual(doneResult);
  });

  it('keeps running and queued tasks: each completes after the restart and is readable by id', async () => {
    for (const taskId of [...tasks.running, ...tasks.queued]) {
      const task = await waitForTerminal(watcher.client, taskId, 30_000);
      expect(task.status, `task ${taskId}: ${task.statusMessage}`).toBe('completed');
      expect((await taskResult(watcher.client, taskId)).structuredContent).toMatchObject({ taskId });
    }
  });

  it('reconnects by itself: a call made after the restart completes', async () => {
    const taskId = await waitFor(() => startTask(watcher.client, 'steady', { ms: 100 }), {
      timeoutMs: 15_000,
      message: 'calls did not recover',
    });
    expect((await taskResult(watcher.client, taskId)).structuredContent).toMatchObject({ taskId });
  });
});

/**
 * Fault suite, docs/MCP.md and PROTOCOL.md §10.9: a task belongs to Redis, not to the gateway that created it. A
 * gateway that is SIGKILLed or restarted leaves its tasks running, and any other gateway serves them by id
 * (`tasks/get`, `tasks/result`); a gateway sent SIGTERM drains its requests in flight
 * (`GATEWAY_SHUTDOWN_GRACE_MS`) before it exits 0.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from '../helpers/wait-for.js';
import type { ManagedProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  useFaultStack,
  startTask,
  rejectionOf,
  taskResult,
  watchingClient,
} from '../helpers/faults.js';

const fault = useFaultStack({
  name: 'f-gw',
  env: { TASKRELAY_REAPER_INTERVAL_MS: '500', GATEWAY_SHUTDOWN_GRACE_MS: '8000' },
  gateways: [],
  workers: [{ TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_LOCK_DURATION_MS: '2000' }],
});
let records: FaultRecords;
let worker: ManagedProcess;

beforeAll(() => {
  ({ records } = fault);
  [worker] = fault.stack.workers as [ManagedProcess];
});

/** Every task ran exactly once, on the one worker, and completed with that run's result, read through `url`. */
async function expectServedById(url: string, taskIds: string[]) {
  const watcher = await watchingClient(url);
  for (const taskId of taskIds) {
    expect(['working', 'completed']).toContain((await watcher.client.experimental.tasks.getTask(taskId)).status);
    const result = await taskResult(watcher.client, taskId);
    expect(result.structuredContent).toMatchObject({ taskId, pid: worker.pid });
    expect((await watcher.client.experimental.tasks.getTask(taskId)).status).toBe('completed');
    expect((await records.runs(taskId)).map((run) => run.pid)).toEqual([worker.pid]);
  }
  await watcher.close();
}

describe('a gateway that goes away', () => {
  it('leaves the tasks of a SIGKILLed gateway running, and its restart on the same address serves them by id', async () => {
    const first = await fault.stack.addGateway();
    const watcher = await watchingClient(first.url);
    const taskIds: string[] = [];
    for (let i = 0; i < 3; i++) taskIds.push(await startTask(watcher.client, 'steady', { ms: 2_500 }));
    for (const taskId of taskIds) await records.waitForStart(taskId);
    const orphanedWaiter = rejectionOf(taskResult(watcher.client, taskIds[0] ?? ''));

    await first.kill('SIGKILL');
    await orphanedWaiter;
    await watcher.close().catch(() => undefined);
    const restarted = await fault.stack.addGateway({ PORT: String(first.port) });
    await expectServedById(restarted.url, taskIds);
    await restarted.kill();
  });

  it('loses no task in a rolling restart: after SIGTERM, the replacement serves the old gateway’s tasks by id', async () => {
    const old = await fault.stack.addGateway();
    const watcher = await watchingClient(old.url);
    const taskIds: string[] = [];
    for (let i = 0; i < 3; i++) taskIds.push(await startTask(watcher.client, 'steady', { ms: 2_500 }));
    for (const taskId of taskIds) await records.waitForStart(taskId);

    const replacement = await fault.stack.addGateway();
    const exited = old.kill('SIGTERM');
    await watcher.close().catch(() => undefined);
    await expectServedById(replacement.url, taskIds);
    expect(await exited).toBe(0);
    await replacement.kill();
  });

  it('answers a plain call in flight within GATEWAY_SHUTDOWN_GRACE_MS after SIGTERM, then exits 0', async () => {
    const gateway = await fault.stack.addGateway();
    const watcher = await watchingClient(gateway.url);
    const before = new Set(await records.taskIds());
    const call = watcher.client.callTool({ name: 'steady', arguments: { ms: 2_000 } }, CallToolResultSchema, {
      timeout: 12_000,
    });
    const outcome = call.then(
      (result) => ({ result }),
      (error: unknown) => ({ error }),
    );
    // The plain call's task is the one new task the fault tool records.
    const callTask = await waitFor(async () => (await records.taskIds()).find((id) => !before.has(id)), {
      message: 'the plain call did not start',
    });
    await records.waitForStart(callTask, { pid: worker.pid });
    const exited = gateway.kill('SIGTERM');

    const answered = await outcome;
    expect('error' in answered ? String(answered.error) : '').toBe('');
    expect('result' in answered && answered.result.structuredContent).toMatchObject({
      pid: worker.pid,
      taskId: callTask,
    });
    expect(await exited).toBe(0);
    await watcher.close().catch(() => undefined);
  });
});

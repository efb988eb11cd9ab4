/**
 * PROTOCOL.md §5.6, §10.5, §10.6: a worker killed mid-job has its job taken over within WORKER_LOCK_DURATION_MS; a
 * crash is not the tool's fault, so a job killed twice still completes; a job whose workers keep dying past the tool's
 * `maxStalls` ends `failed` instead of staying `working` forever.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { FIXTURE_TOOLS, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';

const stack = useStack({
  name: 'crash',
  env: { TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_LOCK_DURATION_MS: '1000' },
  workers: [],
  mcp: true,
});
let client: Client;

beforeAll(() => {
  client = stack.mcp;
});

const started = (worker: ManagedProcess, taskId: string) =>
  worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started');

async function startSleepy(ms: number, name = 'sleepy'): Promise<string> {
  const created = await client.request(
    { method: 'tools/call', params: { name, arguments: { ms, stepMs: 50 }, task: {} } },
    CreateTaskResultSchema,
  );
  return created.task.taskId;
}

/** A sleepy task whose first worker is SIGKILLed once it started, taken over by a second worker (still running). */
async function killedOnce(ms: number) {
  const first = await stack.addWorker();
  const taskId = await startSleepy(ms);
  await waitFor(() => started(first, taskId));
  await first.kill('SIGKILL');
  const second = await stack.addWorker();
  await waitFor(() => started(second, taskId), { timeoutMs: 15_000, message: 'job not taken over' });
  return { taskId, second };
}

describe('§5.6 worker crash', () => {
  it('hands the job of a SIGKILLed worker to another worker, which completes the task', async () => {
    const { taskId, second } = await killedOnce(1_500);
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('completed');
    await second.kill();
  });

  it('completes a task whose workers were killed twice: stalls are not attempts', async () => {
    const { taskId, second } = await killedOnce(2_000);
    await second.kill('SIGKILL');
    const third = await stack.addWorker();
    await waitFor(() => started(third, taskId), { timeoutMs: 15_000, message: 'job not taken over twice' });
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toEqual({ ms: 2_000 });
    const task = await client.experimental.tasks.getTask(taskId);
    expect(task.status).toBe('completed');
    await third.kill();
  });

  it('fails the task of a job whose workers keep dying past its maxStalls, so it never stays working', async () => {
    const first = await stack.addWorker();
    const taskId = await startSleepy(60_000, 'sleepy_fragile');
    await waitFor(() => started(first, taskId));
    await first.kill('SIGKILL');
    const second = await stack.addWorker();
    await waitFor(() => started(second, taskId), { timeoutMs: 15_000, message: 'job not taken over' });
    await second.kill('SIGKILL');
    const third = await stack.addWorker();
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toMatch(/stopped responding 2 times/);
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('failed');
    expect(started(third, taskId)).toBe(false);
    await third.kill();
  });
});

/**
 * Issue 4, PROTOCOL.md §7: a cancel from any client, for any task or call, stops the work cooperatively in whichever
 * worker holds it, frees that worker, never runs a retry, and leaves exactly one terminal state.
 */
import { setTimeout as delay } from 'node:timers/promises';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { Queue } from 'bullmq';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import {
  FIXTURE_TOOLS,
  connectClient,
  readMetric,
  startGatewayProcess,
  type ManagedProcess,
} from './helpers/processes.js';
import { startTask } from './helpers/tasks.js';

const stack = useStack({
  name: 'cancel',
  // Concurrency 1: a freed slot shows as the next task starting.
  workers: [{ TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_CONCURRENCY: '1', WORKER_ABORT_GRACE_MS: '300' }],
});
let r: Redis;
let prefix: string;
let worker: ManagedProcess;
let client: Client;

beforeAll(async () => {
  ({ r, prefix } = stack);
  worker = stack.workers[0]!;
  client = await stack.client();
});

const status = async (taskId: string) => (await client.experimental.tasks.getTask(taskId)).status;
const hash = (taskId: string) => r.hgetall(createKeys(prefix).task(taskId));
const workerLogs = (taskId: string) => worker.logs().filter((l) => l['taskId'] === taskId);

const metric = (name: string, trigger: string) => readMetric(stack.gateway.url, name, { trigger });

/** With concurrency 1, a short task finishing proves the worker's only slot is free. */
async function expectWorkerFree(): Promise<void> {
  const probe = await startTask(client, 'echo', { probe: true });
  await waitFor(async () => (await status(probe)) === 'completed', {
    timeoutMs: 5_000,
    message: 'worker slot not freed',
  });
}

describe('§7 cancel flow', () => {
  it('removes a queued job so it never starts', async () => {
    const running = await startTask(client, 'sleepy', { ms: 30_000, stepMs: 100 });
    await waitFor(async () => (await hash(running))['progress'] !== undefined);
    const queued = await startTask(client, 'sleepy', { ms: 30_000, stepMs: 100 });
    const cancelled = await client.experimental.tasks.cancelTask(queued);
    expect(cancelled.status).toBe('cancelled');
    // The job waits in the pool the gateway routed it to (PROTOCOL.md §3.2), stored as the task's queue.
    const pool = (await hash(queued))['queue'] ?? '';
    expect(pool).not.toBe('');
    const queue = new Queue(createKeys(prefix).queueName(pool), {
      connection: r,
      prefix: createKeys(prefix).bullPrefix,
    });
    expect(await queue.getJob(queued)).toBeUndefined();
    await client.experimental.tasks.cancelTask(running);
    await expectWorkerFree();
    expect(workerLogs(queued).filter((l) => l['msg'] === 'tool started')).toEqual([]);
    expect(await status(queued)).toBe('cancelled');
    await queue.close();
  });

  it('aborts a running handler with CLIENT_CANCELLED, frees its slot and never retries it', async () => {
    const taskId = await startTask(client, 'sleepy', { ms: 30_000, stepMs: 50 });
    await waitFor(async () => (await hash(taskId))['progress'] !== undefined);
    const cancelled = await client.experimental.tasks.cancelTask(taskId);
    expect(cancelled.status).toBe('cancelled');
    expect(cancelled.statusMessage).toMatch(/cancel/i);
    await expectWorkerFree();
    // Logged on the worker side with the task id and the principal, as on the gateway side.
    await waitFor(() =>
      workerLogs(taskId).some((l) => l['reason'] === 'CLIENT_CANCELLED' && l['principal'] === 'anonymous'),
    );
    expect(stack.gateway.logs().find((l) => l['taskId'] === taskId && l['msg'] === 'task cancelled')).toMatchObject({
      principal: 'anonymous',
      reason: 'CLIENT_CANCELLED',
      trigger: 'tasks/cancel',
    });
    expect(workerLogs(taskId).filter((l) => l['msg'] === 'tool started')).toHaveLength(1);
    expect(await status(taskId)).toBe('cancelled');
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
  });

  it('answers -32602 when cancelling a terminal task and leaves it unchanged', async () => {
    const taskId = await startTask(client, 'echo', { a: 1 });
    await waitFor(async () => (await status(taskId)) === 'completed');
    const error = await client.experimental.tasks.cancelTask(taskId).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(McpError);
    expect((error as McpError).code).toBe(-32602);
    expect((error as McpError).message).toMatch(/terminal status: completed/);
    expect(await status(taskId)).toBe('completed');
  });

  it('ends a cancel racing completion in exactly one terminal state, whichever of the two wins', async () => {
    // The cancel is sent `offsetMs` after the call. The offset moves towards the point where the two meet (later after
    // a cancel won, earlier after it came too late), so both outcomes happen, each checked, instead of one only.
    const outcomes = { cancelled: 0, 'too-late': 0 };
    let offsetMs = 0;
    for (let i = 0; i < 60 && (outcomes.cancelled < 3 || outcomes['too-late'] < 3); i++) {
      const taskId = await startTask(client, 'sleepy', { ms: 20, stepMs: 5 });
      // Not a wait for a condition: the offset is the race's variable.
      await delay(offsetMs);
      const cancel = await client.experimental.tasks.cancelTask(taskId).then(
        (t) => t.status,
        (e: unknown) => (e instanceof McpError && e.code === -32602 ? 'too-late' : Promise.reject(e)),
      );
      const final = await waitFor(async () => {
        const s = await status(taskId);
        return s === 'completed' || s === 'cancelled' || s === 'failed' ? s : undefined;
      });
      if (cancel === 'cancelled') {
        outcomes.cancelled++;
        expect(final).toBe('cancelled');
        offsetMs = offsetMs * 1.5 + 5;
      } else {
        expect(cancel).toBe('too-late');
        outcomes['too-late']++;
        expect(final).toBe('completed');
        offsetMs = offsetMs / 1.5;
      }
      // Whatever the job does later, the state holds.
      await expectWorkerFree();
      expect(await status(taskId)).toBe(final);
    }
    expect(outcomes.cancelled).toBeGreaterThanOrEqual(3);
    expect(outcomes['too-late']).toBeGreaterThanOrEqual(3);
  });

  it('reports a handler that ignores its signal cancelled at once, keeps the slot until it returns, drops its result', async () => {
    const taskId = await startTask(client, 'ignore_signal', { ms: 1_500 });
    await waitFor(() => workerLogs(taskId).some((l) => l['msg'] === 'tool started'));
    const cancelled = await client.experimental.tasks.cancelTask(taskId);
    expect(cancelled.status).toBe('cancelled');
    await waitFor(() => workerLogs(taskId).some((l) => l['level'] === 40 && /still running/.test(String(l['msg']))));
    await expectWorkerFree();
    expect(await status(taskId)).toBe('cancelled');
    expect((await hash(taskId))['result']).toBeUndefined();
  });

  it('fails a task that outlives its timeout with a clear message and TIMEOUT reason', async () => {
    const taskId = await startTask(client, 'slow_timeout', {});
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toMatch(/timed out after 200 ms/);
    expect(await status(taskId)).toBe('failed');
    await waitFor(() => workerLogs(taskId).some((l) => l['reason'] === 'TIMEOUT'));
    await expectWorkerFree();
  });
});

describe('§7 plain-call triggers', () => {
  it('cancels a plain call on notifications/cancelled and frees the worker', async () => {
    const before = await metric('taskrelay_cancel_requests_total', 'notifications/cancelled');
    const controller = new AbortController();
    let progressed = false;
    const call = client.callTool({ name: 'sleepy', arguments: { ms: 30_000, stepMs: 50 } }, CallToolResultSchema, {
      signal: controller.signal,
      onprogress: () => {
        progressed = true;
      },
    });
    await waitFor(() => progressed);
    controller.abort('user gave up');
    await expect(call).rejects.toThrow();
    await waitFor(
      async () => (await metric('taskrelay_cancel_requests_total', 'notifications/cancelled')) === before + 1,
    );
    await expectWorkerFree();
  });

  // A closed response stream cancels a plain call only on the 2026-07-28 transport; on 2025-11-25 it is no cancel
  // and the stream can be resumed. Both, and a task call's closed stream, are in modern-transport.e2e.test.ts.

  it('bounds every tool by the gateway-wide maximum timeout', async () => {
    const env = { ...stack.env, TASKRELAY_MAX_TOOL_TIMEOUT_MS: '300' };
    const strict = await startGatewayProcess(env);
    const strictClient = await connectClient(strict.url);
    const result = await strictClient.callTool({ name: 'sleepy', arguments: { ms: 30_000, stepMs: 50 } });
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toMatch(/timed out after 300 ms/);
    await strictClient.close();
    await strict.kill();
    await expectWorkerFree();
  });
});

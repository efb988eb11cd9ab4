/**
 * Fault suite, PROTOCOL.md §10.7: per-tool `attempts` and `backoff`; `NonRetryableError`, cancel and timeout never
 * retry; the final failure carries the last error. Each retry is a run of its own (`ctx.attempt`).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { startRedis, uniquePrefix, type TestRedis } from '../helpers/redis.js';
import { startGatewayProcess, startWorkerProcess, stopAll } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  FaultRecords,
  startTask,
  taskResult,
  testRedis,
  textOf,
  watchingClient,
  type WatchingClient,
} from '../helpers/faults.js';

let redis: TestRedis;
let r: Redis;
let records: FaultRecords;
let watcher: WatchingClient;
let client: Client;

beforeAll(async () => {
  redis = await startRedis({ owned: true });
  r = testRedis(redis.url);
  const prefix = uniquePrefix('f-retry');
  records = new FaultRecords(r, prefix);
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: prefix };
  const [gateway] = await Promise.all([
    startGatewayProcess({ ...env, TASKRELAY_REAPER_INTERVAL_MS: '500' }),
    startWorkerProcess({ ...env, TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_LOCK_DURATION_MS: '2000' }),
  ]);
  watcher = await watchingClient(gateway.url);
  client = watcher.client;
});

afterAll(async () => {
  await watcher?.close();
  r?.disconnect();
  await stopAll();
  await redis?.stop();
});

async function runToFailure(tool: string) {
  const taskId = await startTask(client, tool, {});
  const result = await taskResult(client, taskId);
  const task = await client.experimental.tasks.getTask(taskId);
  return { taskId, result, task, runs: await records.runs(taskId) };
}

describe('§10.7 retries', () => {
  it('runs an attempts: 3 tool three times and fails its task with the last attempt’s message', async () => {
    const { task, result, runs } = await runToFailure('fail_each_attempt');
    expect(task.status).toBe('failed');
    expect(result.isError).toBe(true);
    expect(textOf(result)).toContain('attempt 3 failed');
    expect(textOf(result)).not.toMatch(/attempt [12] failed/);
    expect(runs.map((run) => run.attempt)).toEqual([1, 2, 3]);
  });

  it('never retries a NonRetryableError, even with attempts left', async () => {
    const { task, result, runs } = await runToFailure('fail_non_retryable');
    expect(task.status).toBe('failed');
    expect(textOf(result)).toContain('not worth retrying');
    expect(runs).toHaveLength(1);
  });

  it('never retries a timeout, even with attempts left', async () => {
    const { task, result, runs } = await runToFailure('timeout_with_attempts');
    expect(task.status).toBe('failed');
    expect(textOf(result)).toMatch(/timed out/);
    expect(runs).toHaveLength(1);
    expect(runs[0]?.events.find((e) => e.e === 'end')).toMatchObject({ reason: 'TIMEOUT' });
  });
});

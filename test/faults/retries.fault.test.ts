/**
 * Fault suite, PROTOCOL.md §10.7: per-tool `attempts` and `backoff`; `NonRetryableError`, cancel and timeout never
 * retry; the final failure carries the last error. Each retry is a run of its own (`ctx.attempt`).
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { FAULT_TOOLS, type FaultRecords, startTask, taskResult, textOf, useFaultStack } from '../helpers/faults.js';

const fault = useFaultStack({
  name: 'f-retry',
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
  workers: [{ TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_LOCK_DURATION_MS: '2000' }],
});
let records: FaultRecords;
let client: Client;

beforeAll(() => {
  ({ records } = fault);
  client = fault.watcher.client;
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

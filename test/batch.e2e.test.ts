/**
 * PROTOCOL.md §26: batch fan-out. One `batch_report` task fans out one `build_report` child job per report across
 * every worker of the pool; the caller sees the children's count as strictly increasing progress on its own token, a
 * result listing every report, a cancel that stops the children, and (with the fixture parent) fail-fast against
 * collect-all.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import {
  CancelTaskResultSchema,
  ProgressNotificationSchema,
  type ProgressNotification,
} from '@modelcontextprotocol/sdk/types.js';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, connectClient, type GatewayProcess, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { absenceWindow } from './helpers/load.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
/** The children's queue: the child tool's (PROTOCOL.md §3.2). */
const CHILD_QUEUE = toolQueue('default', 'build_report');

const stack = useStack({
  name: 'batch',
  gateways: [{ LOG_LEVEL: 'warn' }],
  workers: [
    { WORKER_CONCURRENCY: '6', LOG_LEVEL: 'info' },
    { WORKER_CONCURRENCY: '6', LOG_LEVEL: 'info' },
    { TASKRELAY_TOOLS: BATCH_TOOLS, TASKRELAY_QUEUE: 'batch', WORKER_CONCURRENCY: '4' },
  ],
});
let r: Redis;
let prefix: string;
let gateway: GatewayProcess;
let demoWorkers: ManagedProcess[];

beforeAll(() => {
  ({ r, prefix, gateway } = stack);
  demoWorkers = stack.workers.slice(0, 2);
});

async function recordingClient() {
  const client = await connectClient(gateway.url);
  const received: ProgressNotification['params'][] = [];
  client.setNotificationHandler(ProgressNotificationSchema, (n) => {
    received.push(n.params);
  });
  return { client, received };
}

/** Log lines of the demo workers with the given message. */
function workerLines(msg: string): Array<Record<string, unknown>> {
  return demoWorkers.flatMap((w) => w.logs().filter((l) => l['msg'] === msg));
}

describe('§26 batch_report', () => {
  it('runs one child per report on every worker, with strictly increasing progress on the caller token', async () => {
    const { client, received } = await recordingClient();
    const reports = Array.from({ length: 60 }, (_v, i) => `r${i}`);
    const taskId = await startTask(client, 'batch_report', { reports, items: 3, delayMs: 20 }, { progressToken: 'b1' });
    const result = await taskResult(client, taskId, 60_000);
    expect(result.isError).toBeFalsy();
    expect(result.structuredContent).toEqual({
      completed: 60,
      failed: 0,
      reports: reports.map((report) => ({ report, status: 'completed' })),
    });
    const mine = received.filter((p) => p.progressToken === 'b1');
    expect(mine.length).toBeGreaterThan(1);
    const values = mine.map((p) => p.progress);
    for (let i = 1; i < values.length; i++) expect(values[i]).toBeGreaterThan(values[i - 1] as number);
    expect(mine.at(-1)).toMatchObject({ progress: 60, total: 60 });
    expect(mine.every((p) => p.total === 60)).toBe(true);
    expect(mine.at(-1)?.message).toBe('60 of 60 children done (0 failed)');
    expect(received.every((p) => p.progressToken === 'b1')).toBe(true);
    // Both workers of the pool ran children.
    const ran = demoWorkers.map((w) => w.logs().filter((l) => l['msg'] === 'batch child started').length);
    expect(ran.every((n) => n > 0)).toBe(true);
    expect(ran.reduce((a, b) => a + b, 0)).toBe(60);
    const task = await getTask(client, taskId);
    expect(task.statusMessage).toBe('60 of 60 children done (0 failed)');
    await client.close();
  }, 90_000);

  it('a cancel removes the queued children, aborts the running ones, and starts none after it', async () => {
    const client = await connectClient(gateway.url);
    const reports = Array.from({ length: 300 }, (_v, i) => `c${i}`);
    // Each child would take 20 s: only an abort ends the running ones within the test.
    const taskId = await startTask(client, 'batch_report', { reports, items: 1000, delayMs: 20 });
    const keys = createKeys(prefix).batch(taskId);
    await waitFor(async () => (await r.scard(keys.running)) >= 8, { timeoutMs: 20_000, message: 'children running' });
    const startedBefore = workerLines('batch child started').filter((l) => String(l['jobId']).startsWith(taskId));
    // The dashboard shows the batch with its children's counts (PROTOCOL.md §26.9).
    const overview = (await (await fetch(gateway.url.replace(/\/mcp$/, '/admin/api/overview'))).json()) as {
      batches: Array<{ taskId: string; total: number; queued: number; running: number; done: number; failed: number }>;
    };
    const shown = overview.batches.find((b) => b.taskId === taskId);
    expect(shown).toMatchObject({ childTool: 'build_report', total: 300, done: 0, failed: 0 });
    expect(shown?.running).toBeGreaterThanOrEqual(8);
    expect((shown?.queued ?? 0) + (shown?.running ?? 0)).toBe(64);
    await client.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    const cancelledAt = Date.now();
    expect((await getTask(client, taskId)).status).toBe('cancelled');
    // Every running child stops at once (20 s of work each otherwise).
    await waitFor(
      () => {
        const stopped = workerLines('batch child stopped with its batch').filter((l) =>
          String(l['jobId']).startsWith(taskId),
        );
        return stopped.length >= startedBefore.length;
      },
      { timeoutMs: 10_000, message: 'running children aborted' },
    );
    const pool = `${prefix}:q-${CHILD_QUEUE}`;
    await waitFor(async () => (await r.zcard(`${pool}:prioritized`)) + (await r.llen(`${pool}:wait`)) === 0, {
      timeoutMs: 10_000,
      message: 'queued children removed',
    });
    await absenceWindow(1_000);
    const times = workerLines('batch child started').map((l) => Date.parse(String(l['time'])));
    expect(times.every((t) => Number.isFinite(t))).toBe(true);
    const startedAfter = workerLines('batch child started').filter(
      (l) => String(l['jobId']).startsWith(taskId) && Date.parse(String(l['time'])) > cancelledAt + 200,
    );
    expect(startedAfter).toEqual([]);
    expect(await r.hlen(keys.outcomes)).toBe(0);
    await client.close();
  }, 60_000);
});

describe('§26 fail-fast and collect-all', () => {
  const items = Array.from({ length: 30 }, (_v, n) => ({ n, delayMs: 100, fail: n === 3 }));

  it('collects every child, the failure counted', async () => {
    const client = await connectClient(gateway.url);
    const taskId = await startTask(client, 'fan_out', { items, concurrency: 4 });
    const result = await taskResult(client, taskId, 60_000);
    const body = result.structuredContent as { completed: number; failed: number; cancelled: number; outcomes: any[] };
    expect(body).toMatchObject({ total: 30, completed: 29, failed: 1, cancelled: 0, truncated: false });
    expect(body.outcomes[3]).toEqual({ index: 3, status: 'failed', error: 'child 3 failed' });
    expect(body.outcomes.filter((o) => o.status === 'completed')).toHaveLength(29);
    await client.close();
  }, 90_000);

  it('fail-fast ends the batch at the first failure and never runs the rest', async () => {
    const client = await connectClient(gateway.url);
    const taskId = await startTask(client, 'fan_out', { items, concurrency: 4, failFast: true });
    const result = await taskResult(client, taskId, 60_000);
    const body = result.structuredContent as { completed: number; failed: number; cancelled: number; outcomes: any[] };
    expect(body.failed).toBe(1);
    expect(body.cancelled).toBeGreaterThan(10);
    expect(body.completed + body.failed + body.cancelled).toBe(30);
    expect(body.outcomes[3]).toMatchObject({ status: 'failed' });
    expect(body.outcomes.at(-1)).toMatchObject({ index: 29, status: 'cancelled' });
    await client.close();
  }, 90_000);

  it('lists at most 1000 outcomes inline; the rest are paged', async () => {
    const client = await connectClient(gateway.url);
    const many = Array.from({ length: 1_200 }, (_v, n) => ({ n }));
    const taskId = await startTask(client, 'fan_out', { items: many, concurrency: 200 });
    const result = await taskResult(client, taskId, 60_000);
    const body = result.structuredContent as Record<string, any>;
    expect(body).toMatchObject({ total: 1_200, completed: 1_200, truncated: true, outcomesOmitted: 200 });
    expect(body['outcomes']).toHaveLength(1_200);
    expect(body['outcomes'].map((o: { index: number }) => o.index)).toEqual(many.map((i) => i.n));
    await client.close();
  }, 90_000);
});

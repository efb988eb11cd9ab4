/**
 * Issue 13: Prometheus metrics on the gateway (`/metrics`) and on a worker (`WORKER_METRICS_PORT`): tasks created and
 * ended by tool and status, durations, queue depth, live tasks, worker slots, queue wait and cancel latency. Issue 34
 * item 7: a queue whose last worker left is still reported, with 0 workers, while a job waits in it.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { toolQueue } from '@taskrelay/shared';

/** build_report's queue: one per tool and TASKRELAY_QUEUE (PROTOCOL.md §3.2). */
const BUILD_QUEUE = toolQueue('default', 'build_report');
import getPort from 'get-port';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { WORKER_MAIN, readMetric, spawnNode } from './helpers/processes.js';
import { startTask } from './helpers/tasks.js';

const metricsPort = await getPort({ host: '127.0.0.1' });
const stack = useStack({
  name: 'metrics',
  workers: [{ WORKER_CONCURRENCY: '1', WORKER_METRICS_PORT: String(metricsPort) }],
});
let client: Client;
let env: Record<string, string | undefined>;
/** readMetric() wants an `/mcp` URL and reads its sibling `/metrics`. */
const workerUrl = `http://127.0.0.1:${metricsPort}/mcp`;

beforeAll(async () => {
  env = stack.env;
  client = await stack.client();
});

const g = (name: string, labels: Record<string, string> = {}) => readMetric(stack.gateway.url, name, labels);
/** Jobs waiting in `queue`: queued with their fair-share priority (PROTOCOL §25), BullMQ counts them as prioritized. */
const queuedJobs = async (queue: string) =>
  (await g('taskrelay_queue_jobs', { queue, state: 'waiting' })) +
  (await g('taskrelay_queue_jobs', { queue, state: 'prioritized' }));
/** The gateway's series of `name` whose labels include `labels`, as `{labels} value` lines (absent: none). */
async function series(name: string, labels: Record<string, string>): Promise<string[]> {
  const text = await (await fetch(stack.gateway.url.replace(/\/mcp$/, '/metrics'))).text();
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) && wanted.every((w) => l.includes(w)))
    .map((l) => l.slice(name.length));
}
const w = (name: string, labels: Record<string, string> = {}) => readMetric(workerUrl, name, labels);
const tool = 'build_report';

describe('metrics', () => {
  it('count a completed task by tool and status on the gateway, and its wait and run on the worker', async () => {
    const result = await client.callTool(
      { name: tool, arguments: { report: 'plain', items: 3, delayMs: 5 } },
      CallToolResultSchema,
      { onprogress: () => undefined },
    );
    expect(result.isError).toBeFalsy();
    expect(await g('taskrelay_tasks_created_total', { tool, mode: 'call' })).toBe(1);
    await waitFor(async () => (await g('taskrelay_tasks_finished_total', { tool, status: 'completed' })) === 1, {
      timeoutMs: 5_000,
      message: 'tasks_finished_total{completed} never reached 1',
    });
    expect(await g('taskrelay_task_duration_seconds_count', { tool, status: 'completed' })).toBe(1);
    expect(await g('taskrelay_progress_notifications_total')).toBeGreaterThan(0);
    expect(await w('taskrelay_worker_jobs_started_total', { tool })).toBe(1);
    expect(await w('taskrelay_queue_wait_seconds_count', { tool })).toBe(1);
    await waitFor(async () => (await w('taskrelay_worker_run_seconds_count', { tool })) === 1, {
      timeoutMs: 5_000,
      message: 'worker_run_seconds never counted the run',
    });
  });

  it('show a running task, busy slots and queue depth, then the cancel and its latency on both sides', async () => {
    const running = await startTask(client, 'build_report', { report: 'm', items: 100_000, delayMs: 20 });
    await waitFor(async () => (await w('taskrelay_worker_slots', { state: 'busy' })) === 1, {
      timeoutMs: 10_000,
      message: 'the worker never showed a busy slot',
    });
    expect(await w('taskrelay_worker_slots', { state: 'idle' })).toBe(0);
    // Concurrency 1: a second task waits in the queue.
    const queued = await startTask(client, 'build_report', { report: 'm', items: 1, delayMs: 0 });
    await waitFor(async () => (await queuedJobs(BUILD_QUEUE)) === 1, {
      timeoutMs: 5_000,
      message: 'queue depth never showed the waiting job',
    });
    expect(await g('taskrelay_queue_jobs', { queue: BUILD_QUEUE, state: 'active' })).toBe(1);
    expect(await g('taskrelay_tasks_live', { tool, status: 'working' })).toBe(2);
    expect(await g('taskrelay_workers_live', { queue: BUILD_QUEUE })).toBe(1);

    await client.experimental.tasks.cancelTask(running);
    expect(await g('taskrelay_cancel_seconds_count', { trigger: 'tasks/cancel' })).toBe(1);
    expect(await g('taskrelay_tasks_finished_total', { tool, status: 'cancelled' })).toBe(1);
    await waitFor(
      async () => (await w('taskrelay_worker_cancel_seconds_count', { reason: 'CLIENT_CANCELLED' })) === 1,
      {
        timeoutMs: 10_000,
        message: 'the worker never observed the cancel latency',
      },
    );
    // The slot freed by the cancel runs the queued task.
    await waitFor(async () => (await client.experimental.tasks.getTask(queued)).status === 'completed', {
      timeoutMs: 10_000,
      message: 'the queued task never completed',
    });
    await waitFor(async () => (await g('taskrelay_tasks_live', { tool, status: 'working' })) === 0, {
      timeoutMs: 5_000,
      message: 'live tasks never dropped to 0',
    });
  });

  it('keep reporting a queue whose last worker left while a job waits in it, with 0 workers, until it is empty', async () => {
    const echoQueue = toolQueue('fixtures', 'echo');
    const fixtures = await stack.addWorker(FIXTURE_WORKER);
    await waitFor(async () => (await series('taskrelay_workers_live', { queue: echoQueue })).length === 1, {
      timeoutMs: 5_000,
      message: 'the fixture worker was never counted',
    });
    // SIGTERM: a clean exit deletes its heartbeat, so the queue has no live worker at once.
    expect(await fixtures.kill('SIGTERM')).toBe(0);
    // Its pool is remembered (PROTOCOL.md §24): the call is accepted and waits in the queue.
    const taskId = await startTask(client, 'echo', { hello: 'queued' });
    await waitFor(async () => (await queuedJobs(echoQueue)) === 1, {
      timeoutMs: 5_000,
      message: 'the queue of the waiting job vanished from /metrics with its last worker',
    });
    expect(await series('taskrelay_workers_live', { queue: echoQueue })).toEqual(['{queue="fixtures~echo"} 0']);

    // A worker starts and runs it; once the queue is empty and its worker gone, the queue is no longer reported.
    const again = await stack.addWorker(FIXTURE_WORKER);
    await waitFor(async () => (await client.experimental.tasks.getTask(taskId)).status === 'completed', {
      timeoutMs: 15_000,
      message: 'the queued task never ran',
    });
    expect(await again.kill('SIGTERM')).toBe(0);
    await waitFor(async () => (await series('taskrelay_queue_jobs', { queue: echoQueue })).length === 0, {
      timeoutMs: 5_000,
      message: 'an empty queue with no worker stayed reported',
    });
    expect(await series('taskrelay_workers_live', { queue: echoQueue })).toEqual([]);
  });

  it('name every metric of both processes taskrelay_*', async () => {
    for (const url of [stack.gateway.url, workerUrl]) {
      const text = await (await fetch(url.replace(/\/mcp$/, '/metrics'))).text();
      const names = text
        .split('\n')
        .filter((l) => l.startsWith('# TYPE '))
        .map((l) => l.split(' ')[2]!);
      expect(names.length).toBeGreaterThan(10);
      expect(names.filter((n) => !n.startsWith('taskrelay_'))).toEqual([]);
    }
    expect((await fetch(workerUrl.replace(/\/mcp$/, '/other'))).status).toBe(404);
  });

  it('stops a worker with one line when WORKER_METRICS_PORT is invalid', async () => {
    const proc = spawnNode(WORKER_MAIN, { ...env, WORKER_METRICS_PORT: '70000' });
    expect(await proc.exited).toBe(1);
    expect(proc.output().trim()).toBe(
      'taskrelay-worker: Invalid configuration: WORKER_METRICS_PORT must be at most 65535 (got "70000")',
    );
  });
});

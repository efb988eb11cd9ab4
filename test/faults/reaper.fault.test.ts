/**
 * Fault suite, PROTOCOL.md §10.1–§10.3: nothing stays non-terminal for ever. The reaper (every
 * TASKRELAY_REAPER_INTERVAL_MS, in some gateway) fails a task whose job never existed, was evicted, or sits in BullMQ's
 * failed set, depending on no in-process event; a `tasks/result` waiter blocked before that is answered.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { UnrecoverableError, Worker } from 'bullmq';
import { TaskStore, createKeys, toolQueue } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import {
  FAULT_TOOLS,
  startTask,
  taskResult,
  testRedis,
  textOf,
  useFaultStack,
  type FaultStack,
  type WatchingClient,
} from '../helpers/faults.js';

const IDEMPOTENCY_KEY = 'dev.taskrelay/idempotency-key';
/** A reaper running every 500 ms answers well within this; today's code never does. */
const REAPED_WITHIN_MS = 10_000;

/**
 * A gateway whose catalog still lists the fault tools but with no worker consuming their queue: a worker published
 * its catalog (a long heartbeat keeps it listed) and was SIGKILLed, so calls are accepted and their jobs wait.
 */
function useGatewayWithoutWorkers(name: string): FaultStack {
  const faults = useFaultStack({
    name,
    gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
    workers: [{ TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_HEARTBEAT_MS: '60000' }],
  });
  beforeAll(async () => {
    await faults.stack.workers[0]?.kill('SIGKILL');
  });
  return faults;
}

/** The queue of the fault worker's `steady` tool (PROTOCOL.md §3.2): where its calls' jobs wait. */
const FAULT_POOL = toolQueue('default', 'steady');

/** BullMQ's job hash of a `steady` task (jobId = taskId) in its tool's queue. */
const jobKey = (prefix: string, taskId: string) => `${prefix}:${createKeys(prefix).queueName(FAULT_POOL)}:${taskId}`;

async function expectReapedFailed(watcher: WatchingClient, taskId: string, waiting: Promise<unknown>) {
  const result = (await waiting) as Awaited<ReturnType<typeof taskResult>>;
  expect(result.isError).toBe(true);
  const task = await watcher.client.experimental.tasks.getTask(taskId);
  expect(task.status).toBe('failed');
  return { result, task };
}

describe('§10.3 the reaper, with no worker consuming the queue', () => {
  const faults = useGatewayWithoutWorkers('f-reaper');
  const { stack } = faults;

  it('fails a task that was stored but never enqueued (its gateway died in between)', async () => {
    // Exactly what a gateway writes before it enqueues (§4.2), then nothing: the gateway "died".
    const store = new TaskStore(stack.r, createKeys(stack.prefix));
    const record = await store.records.create({
      tool: 'steady',
      queue: 'default',
      principal: 'anonymous',
      mode: 'task',
      ttl: 60_000,
      pollInterval: 1_000,
    });
    expect(await stack.r.exists(jobKey(stack.prefix, record.taskId))).toBe(0);
    const waiting = taskResult(faults.watcher.client, record.taskId, REAPED_WITHIN_MS);
    await expectReapedFailed(faults.watcher, record.taskId, waiting);
  });

  it('fails a queued task whose BullMQ job was evicted', async () => {
    const taskId = await startTask(faults.watcher.client, 'steady', { ms: 100 });
    expect(await stack.r.exists(jobKey(stack.prefix, taskId))).toBe(1);
    const waiting = taskResult(faults.watcher.client, taskId, REAPED_WITHIN_MS);
    expect(await stack.r.del(jobKey(stack.prefix, taskId))).toBe(1);
    await expectReapedFailed(faults.watcher, taskId, waiting);
  });

  it('gives a client retrying with the same idempotency key a fresh task once the never-started one was reaped', async () => {
    const meta = { [IDEMPOTENCY_KEY]: `reaped-${stack.prefix}` };
    const first = await startTask(faults.watcher.client, 'steady', { ms: 100 }, { meta });
    const waiting = taskResult(faults.watcher.client, first, REAPED_WITHIN_MS);
    await stack.r.del(jobKey(stack.prefix, first));
    await expectReapedFailed(faults.watcher, first, waiting);

    const retried = await startTask(faults.watcher.client, 'steady', { ms: 100 }, { meta });
    expect(retried).not.toBe(first);
    expect((await faults.watcher.client.experimental.tasks.getTask(retried)).status).toBe('working');
  });
});

describe('§10.3 the reaper, for a job BullMQ failed on its own', () => {
  const faults = useGatewayWithoutWorkers('f-reaper-failed');
  const { stack } = faults;

  it('fails a task whose job sits in the failed set while the task is still working, with BullMQ’s failedReason', async () => {
    const { prefix } = stack;
    const { watcher } = faults;
    const taskId = await startTask(watcher.client, 'steady', { ms: 100 });
    const waiting = taskResult(watcher.client, taskId, REAPED_WITHIN_MS);

    // A bare BullMQ worker fails the job without touching the task (as a stall-failed job whose observer died).
    const keys = createKeys(prefix);
    const connection = testRedis(stack.redis.url);
    const raw = new Worker(
      keys.queueName(FAULT_POOL),
      async () => {
        throw new UnrecoverableError('failed behind the task store’s back');
      },
      { connection, prefix: keys.bullPrefix },
    );
    try {
      await waitFor(
        async () => (await stack.r.zscore(`${prefix}:${keys.queueName(FAULT_POOL)}:failed`, taskId)) !== null,
        {
          message: 'the raw worker did not fail the job',
        },
      );
    } finally {
      await raw.close();
      connection.disconnect();
    }

    const { result, task } = await expectReapedFailed(watcher, taskId, waiting);
    expect(`${task.statusMessage ?? ''}\n${textOf(result)}`).toContain('failed behind the task store’s back');
  });
});

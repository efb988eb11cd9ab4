/**
 * startWorker against a real Redis, with this file playing the gateway (task hash, BullMQ job, cancel publish).
 * Titles follow the sections of docs/PROTOCOL.md.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { NonRetryableError, WorkerCatalogSchema, toolPool, type WorkerCatalog } from '@taskrelay/shared';
import { startRedis, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import type { ToolContext } from '../src/context-types.js';
import { defineTool } from '../src/define-tool.js';
import { CancelledError } from '../src/errors.js';
import { Harness, gate } from './harness.js';

// What the tools saw, by task id (task ids are unique, so tests never share an entry).
const runs = new Map<string, number>();
const started = new Set<string>();
const aborts = new Map<string, string>();
let ignoreGate = gate();
let holdShutdownable = true;

function ran(ctx: ToolContext): void {
  runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
  started.add(ctx.taskId);
}

/** Sleeps until cancelled, recording the reason. */
async function sleepUntilCancelled(ctx: ToolContext): Promise<string> {
  try {
    await ctx.sleep(60_000);
  } catch (error) {
    if (error instanceof CancelledError) aborts.set(ctx.taskId, error.reason);
    throw error;
  }
  return 'not reached';
}

const echo = defineTool({
  name: 'echo',
  description: 'Returns its arguments.',
  inputSchema: z.looseObject({}),
  run(input, ctx) {
    ran(ctx);
    return { ...input };
  },
});

const strict = defineTool({
  name: 'strict',
  description: 'Has required, bounded arguments.',
  inputSchema: z.object({ report: z.string(), items: z.number().int().min(1) }),
  run(_input, ctx) {
    ran(ctx);
    return 'ran';
  },
});

const steps = defineTool({
  name: 'steps',
  description: 'Reports progress n times, stepMs apart.',
  inputSchema: z.object({ n: z.number().int().min(1), stepMs: z.number().int().min(0) }),
  async run({ n, stepMs }, ctx) {
    ran(ctx);
    for (let i = 1; i <= n; i++) {
      await ctx.sleep(stepMs);
      ctx.progress(i, n, `step ${i}`);
    }
    return `done ${n}`;
  },
});

const waitCancel = defineTool({
  name: 'wait_cancel',
  description: 'Sleeps until cancelled.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ran(ctx);
    return sleepUntilCancelled(ctx);
  },
});

const ignoring = defineTool({
  name: 'ignoring',
  description: 'Ignores its signal until the test opens the gate.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ran(ctx);
    await ignoreGate.promise;
    return 'late result';
  },
});

const flaky = defineTool({
  name: 'flaky',
  description: 'Fails its first attempt.',
  inputSchema: z.object({}),
  attempts: 2,
  run(_input, ctx) {
    ran(ctx);
    if (ctx.attempt === 1) throw new Error('first attempt fails');
    return `succeeded on attempt ${ctx.attempt}`;
  },
});

const failing = defineTool({
  name: 'failing',
  description: 'Always fails with an ordinary error.',
  inputSchema: z.object({}),
  run(_input, ctx): never {
    ran(ctx);
    throw new Error('boom');
  },
});

const refusing = defineTool({
  name: 'refusing',
  description: 'Fails without retry.',
  inputSchema: z.object({}),
  run(_input, ctx): never {
    ran(ctx);
    throw new NonRetryableError('nope');
  },
});

const shutdownable = defineTool({
  name: 'shutdownable',
  description: 'Sleeps until cancelled while held, else returns at once.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ran(ctx);
    if (holdShutdownable) return sleepUntilCancelled(ctx);
    return 'finished elsewhere';
  },
});

let redis: TestRedis;
let h: Harness;

beforeAll(async () => {
  redis = await startRedis();
});

afterAll(async () => {
  await redis?.stop();
});

beforeEach(() => {
  h = new Harness(redis.url);
  ignoreGate = gate();
  holdShutdownable = true;
});

afterEach(async () => {
  ignoreGate.open();
  await h.close();
});

describe('§3 tool catalog and heartbeat', () => {
  it('the catalog is in Redis when startWorker resolves, refreshed every heartbeat, and removed on close', async () => {
    const handle = await h.start([echo, steps], { heartbeatMs: 200, workerId: 'w-catalog' });
    const key = h.keys.workerCatalog('w-catalog');
    const read = async (): Promise<WorkerCatalog> =>
      WorkerCatalogSchema.parse(JSON.parse((await h.redis.get(key)) ?? 'null'));

    const first = await read();
    // Named by its tools at their versions (PROTOCOL.md §24.9).
    const pool = toolPool(
      'default',
      [echo, steps].map((t) => ({ name: t.name, version: t.version })),
    );
    expect(first).toEqual({
      workerId: 'w-catalog',
      queue: pool,
      queueName: 'default',
      tools: [echo.descriptor, steps.descriptor],
      heartbeatAt: expect.any(Number) as number,
    });
    expect(handle).toMatchObject({ workerId: 'w-catalog', queue: pool });
    const expiry = Number(await h.redis.zscore(h.keys.workers, 'w-catalog'));
    expect(expiry).toBe(first.heartbeatAt + 600);
    const pttl = await h.redis.pttl(key);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(600);

    await waitFor(async () => (await read()).heartbeatAt > first.heartbeatAt, { message: 'no heartbeat' });

    await handle.close();
    await handle.close();
    expect(await h.redis.exists(key)).toBe(0);
    expect(await h.redis.zscore(h.keys.workers, 'w-catalog')).toBeNull();
  });
});

describe('§5 running a job', () => {
  it('a job runs its tool and completes the task with the result', async () => {
    await h.start([echo]);
    const taskId = await h.enqueue('echo', { a: 1 });
    const task = await h.waitForStatus(taskId, 'completed');
    expect(task.result).toEqual({ content: [{ type: 'text', text: '{"a":1}' }], structuredContent: { a: 1 } });
    expect(runs.get(taskId)).toBe(1);
    await waitFor(async () => (await h.jobState(taskId)) === 'unknown', { message: 'job not removed on completion' });
  });

  it('a task cancelled before its job starts, or missing, never runs the tool (a run that starts before its tool)', async () => {
    await h.start([echo]);
    const cancelled = await h.enqueue('echo', {}, { jobless: true });
    await h.cancel(cancelled, false);
    // Not a gateway's job (no principal): its run starts before the tool, as every run did before §21.2.1. A
    // gateway's job is removed by the cancel; the deferred start's bound is in first-run-start.integration.test.ts.
    await h.addJob(cancelled, 'echo', {}, { noPrincipal: true });
    await h.addJob('no-such-task', 'echo', {}, { noPrincipal: true });

    await waitFor(() => h.logs.find('task is missing or already terminal; tool not run', cancelled));
    await waitFor(() => h.logs.find('task is missing or already terminal; tool not run', 'no-such-task'));
    expect(runs.has(cancelled)).toBe(false);
    expect(runs.has('no-such-task')).toBe(false);
    expect(await h.task(cancelled)).toMatchObject({ status: 'cancelled' });
    expect(await h.task('no-such-task')).toBeUndefined();
  });

  it('invalid arguments fail the task with an isError result naming the field, without retry', async () => {
    await h.start([strict]);
    const taskId = await h.enqueue('strict', { items: 0 }, { attempts: 3 });
    const task = await h.waitForStatus(taskId, 'failed');
    const text =
      'Invalid arguments for tool strict: report: Invalid input: expected string, received undefined; items: Too small: expected number to be >=1';
    expect(task.result).toEqual({ content: [{ type: 'text', text }], isError: true });
    expect(task.statusMessage).toBe(text);
    expect(task.error).toEqual({ code: 'INVALID_ARGUMENTS', message: text });
    await waitFor(async () => (await h.jobState(taskId)) === 'failed', { message: 'job not failed' });
    expect(runs.has(taskId)).toBe(false);
  });

  it('a hand-made job for a tool this worker does not serve, in a queue it consumes, fails with TOOL_NOT_FOUND', async () => {
    const handle = await h.start([echo]);
    const taskId = await h.enqueue('elsewhere', {}, { jobless: true });
    await h.addJob(taskId, 'elsewhere', {}, { intoQueueOf: 'echo' });
    const task = await h.waitForStatus(taskId, 'failed');
    expect(task.error).toEqual({
      code: 'TOOL_NOT_FOUND',
      message: `Tool elsewhere is not served by worker ${handle.workerId} (queue default~echo)`,
    });
    expect(task.result?.isError).toBe(true);
  });

  it('an ordinary error is retried while attempts remain, then the task completes', async () => {
    await h.start([flaky]);
    const taskId = await h.enqueue('flaky', {}, { attempts: flaky.attempts });
    const task = await h.waitForStatus(taskId, 'completed');
    expect(runs.get(taskId)).toBe(2);
    expect(task.result).toEqual({ content: [{ type: 'text', text: 'succeeded on attempt 2' }] });
    expect(task.error).toBeUndefined();
    expect(h.logs.find('tool failed; the job will be retried', taskId)).toMatchObject({ attempt: 1 });
  });

  it('an ordinary error fails the task once attempts are exhausted', async () => {
    await h.start([failing]);
    const taskId = await h.enqueue('failing', {}, { attempts: 2 });
    const task = await h.waitForStatus(taskId, 'failed');
    expect(runs.get(taskId)).toBe(2);
    expect(task).toMatchObject({
      statusMessage: 'boom',
      result: { content: [{ type: 'text', text: 'boom' }], isError: true },
      error: { code: 'TOOL_FAILED', message: 'boom' },
    });
    await waitFor(async () => (await h.jobState(taskId)) === 'failed', { message: 'job not failed' });
  });

  it('a NonRetryableError fails the task at once with its message', async () => {
    await h.start([refusing]);
    const taskId = await h.enqueue('refusing', {}, { attempts: 3 });
    const task = await h.waitForStatus(taskId, 'failed');
    expect(task).toMatchObject({
      statusMessage: 'nope',
      result: { content: [{ type: 'text', text: 'nope' }], isError: true },
      error: { code: 'NON_RETRYABLE', message: 'nope' },
    });
    await waitFor(async () => (await h.jobState(taskId)) === 'failed', { message: 'job not failed' });
    expect(runs.get(taskId)).toBe(1);
  });
});

describe('§6 progress flow', () => {
  it('progress lands in the hash and is published on the owning gateway channel, all before the terminal status', async () => {
    const events: Array<{ channel: string; message: Record<string, unknown> }> = [];
    const mine = h.keys.gatewayChannel(h.gatewayId);
    const other = h.keys.gatewayChannel('another-gateway');
    await h.subscribe([mine, other], (channel, message) => {
      events.push({ channel, message: JSON.parse(message) as Record<string, unknown> });
    });
    await h.start([steps]);
    const taskId = await h.enqueue('steps', { n: 5, stepMs: 20 });

    const task = await h.waitForStatus(taskId, 'completed');
    expect(task).toMatchObject({ progress: 5, total: 5, progressMessage: 'step 5', statusMessage: 'step 5' });
    const terminal = await waitFor(
      () => events.findIndex((e) => e.message['type'] === 'status' && e.message['status'] === 'completed') + 1,
    );

    const progress = events.filter((e) => e.channel === mine && e.message['type'] === 'progress');
    expect(progress.length).toBeGreaterThan(0);
    expect(progress.at(-1)?.message).toEqual({ type: 'progress', taskId, progress: 5, total: 5, message: 'step 5' });
    const values = progress.map((e) => e.message['progress'] as number);
    expect(values).toEqual([...values].sort((a, b) => a - b));
    expect(new Set(values).size).toBe(values.length);
    expect(events.findLastIndex((e) => e.message['type'] === 'progress')).toBeLessThan(terminal - 1);
    expect(events.some((e) => e.channel === other)).toBe(false);
  });
});

describe('§7 cancel flow', () => {
  it('a cancel message aborts a running tool with CLIENT_CANCELLED and the job is not retried', async () => {
    await h.start([waitCancel]);
    const taskId = await h.enqueue('wait_cancel', {}, { attempts: 3 });
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });

    await h.cancel(taskId);
    await waitFor(() => aborts.get(taskId), { message: 'tool not aborted' });
    expect(aborts.get(taskId)).toBe('CLIENT_CANCELLED');
    expect(h.logs.find('cancel received; aborting tool', taskId)).toMatchObject({ reason: 'CLIENT_CANCELLED' });
    // Done, not failed: the job is removed at once (no failed job left behind per cancel), and never retried.
    await waitFor(async () => (await h.jobState(taskId)) === 'unknown', { message: 'job not removed' });
    expect(runs.get(taskId)).toBe(1);
    const task = await h.task(taskId);
    expect(task).toMatchObject({ status: 'cancelled', cancelReason: 'CLIENT_CANCELLED' });
    expect(task?.result).toBeUndefined();
  });

  it('a worker that missed the cancel message still aborts the tool on its periodic sweep', async () => {
    await h.start([waitCancel], { cancelSweepMs: 100 });
    const taskId = await h.enqueue('wait_cancel', {});
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });

    await h.cancel(taskId, false);
    await waitFor(() => aborts.get(taskId), { message: 'tool not aborted by the sweep' });
    expect(aborts.get(taskId)).toBe('CLIENT_CANCELLED');
    expect(h.logs.find('task no longer live; aborting tool', taskId)).toMatchObject({ status: 'cancelled' });
    expect(await h.task(taskId)).toMatchObject({ status: 'cancelled' });
  });

  it('a worker whose cancel subscriber reconnects re-reads its running tasks and aborts the cancelled ones', async () => {
    const handle = await h.start([waitCancel], { cancelSweepMs: 600_000 });
    const taskId = await h.enqueue('wait_cancel', {});
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });

    await h.cancel(taskId, false);
    const clients = (await h.redis.client('LIST')) as string;
    const line = clients.split('\n').find((l) => l.includes(` name=taskrelay-worker:${handle.workerId}:cancel `));
    const id = /\bid=(\d+)/.exec(line ?? '')?.[1];
    expect(id).toBeDefined();
    await h.redis.client('KILL', 'ID', id ?? '');

    await waitFor(() => aborts.get(taskId), { message: 'tool not aborted after the reconnect' });
    expect(aborts.get(taskId)).toBe('CLIENT_CANCELLED');
  });

  it('a tool that runs past timeoutMs is aborted with TIMEOUT and fails its task, without retry', async () => {
    await h.start([waitCancel]);
    const taskId = await h.enqueue('wait_cancel', {}, { timeoutMs: 200, attempts: 3 });
    const task = await h.waitForStatus(taskId, 'failed');
    const message = 'Tool wait_cancel timed out after 200 ms';
    expect(task).toMatchObject({
      statusMessage: message,
      result: { content: [{ type: 'text', text: message }], isError: true },
      error: { code: 'TIMEOUT', message },
    });
    await waitFor(() => aborts.get(taskId), { message: 'tool not aborted' });
    expect(aborts.get(taskId)).toBe('TIMEOUT');
    await waitFor(async () => (await h.jobState(taskId)) === 'failed', { message: 'job not failed' });
    expect(runs.get(taskId)).toBe(1);
  });

  it('a handler ignoring its signal keeps its slot until it returns, and its result is discarded', async () => {
    await h.start([ignoring, echo], { concurrency: 1, abortGraceMs: 200 });
    const slow = await h.enqueue('ignoring', {});
    await waitFor(() => started.has(slow), { message: 'tool did not start' });
    await h.cancel(slow);
    const next = await h.enqueue('echo', {});

    await waitFor(() => h.logs.find(/^tool still running after its signal aborted/, slow), { message: 'no warning' });
    // abortGraceMs has passed since the abort and the one slot is still taken.
    expect(runs.has(next)).toBe(false);
    expect(await h.task(next)).toMatchObject({ status: 'working' });

    ignoreGate.open();
    await h.waitForStatus(next, 'completed');
    await waitFor(() => h.logs.find('tool returned after its task was cancelled; result discarded', slow));
    const task = await h.task(slow);
    expect(task).toMatchObject({ status: 'cancelled' });
    expect(task?.result).toBeUndefined();
  });
});

describe('worker shutdown', () => {
  it('close waits for a running tool that finishes within the grace period', async () => {
    const handle = await h.start([steps]);
    const taskId = await h.enqueue('steps', { n: 4, stepMs: 100 });
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });
    await handle.close({ graceMs: 10_000 });
    expect(await h.task(taskId)).toMatchObject({ status: 'completed', progress: 4 });
  });

  it('close aborts a tool still running after the grace period with WORKER_SHUTDOWN and puts its job back for another worker', async () => {
    const first = await h.start([shutdownable]);
    const taskId = await h.enqueue('shutdownable', {}, { attempts: 1 });
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });

    await first.close({ graceMs: 100 });
    expect(aborts.get(taskId)).toBe('WORKER_SHUTDOWN');
    expect(await h.task(taskId)).toMatchObject({ status: 'working' });
    expect(['delayed', 'waiting']).toContain(await h.jobState(taskId));
    expect((await h.queue.getJob(taskId))?.attemptsMade).toBe(0);

    holdShutdownable = false;
    await h.start([shutdownable]);
    const task = await h.waitForStatus(taskId, 'completed');
    expect(task.result).toEqual({ content: [{ type: 'text', text: 'finished elsewhere' }] });
    expect(runs.get(taskId)).toBe(2);
  });

  it('close gives up on a tool that ignores WORKER_SHUTDOWN, and another worker takes the job over when its lock expires', async () => {
    const first = await h.start([ignoring], { abortGraceMs: 100, lockDurationMs: 1_000 });
    const taskId = await h.enqueue('ignoring', {});
    await waitFor(() => started.has(taskId), { message: 'tool did not start' });

    await first.close({ graceMs: 50 });
    expect(h.logs.find(/^tools ignore their signal; closing without them/)).toMatchObject({ taskIds: [taskId] });
    expect(await h.task(taskId)).toMatchObject({ status: 'working' });

    ignoreGate.open();
    await h.start([ignoring], { lockDurationMs: 1_000 });
    const task = await h.waitForStatus(taskId, 'completed');
    expect(task.result).toEqual({ content: [{ type: 'text', text: 'late result' }] });
    expect(runs.get(taskId)).toBe(2);
  });

  it('a tool timeout applies even when the job carries none', async () => {
    const bounded = defineTool({
      name: 'bounded',
      description: 'Declares its own timeout.',
      inputSchema: z.object({}),
      timeoutMs: 100,
      async run(_input, ctx) {
        ran(ctx);
        return sleepUntilCancelled(ctx);
      },
    });
    await h.start([bounded]);
    const taskId = await h.enqueue('bounded', {});
    expect(await h.waitForStatus(taskId, 'failed')).toMatchObject({
      statusMessage: 'Tool bounded timed out after 100 ms',
      error: { code: 'TIMEOUT' },
    });
  });
});

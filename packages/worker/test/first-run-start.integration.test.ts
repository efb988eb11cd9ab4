/**
 * A first run's start is pipelined (PROTOCOL.md §21.2.1), against a real Redis: the start goes first, the tool and
 * the end do not wait for its answer, a longer run records its start as it begins, and what a task ended before the
 * start still keeps from the tool.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { Runs, toolQueue, type CancelRequest } from '@taskrelay/shared';
import { monitorRedis, type RedisMonitor } from '../../../test/helpers/monitor.js';
import { startRedis, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { defineTool } from '../src/define-tool.js';
import { CancelledError } from '../src/errors.js';
import { Harness, gate } from './harness.js';

const sideEffects = new Set<string>();
const aborted = new Map<string, string>();
let hold = gate();

const noop = defineTool({
  name: 'noop',
  description: 'Returns at once.',
  inputSchema: z.object({}),
  run: () => 'ok',
});

const held = defineTool({
  name: 'held',
  description: 'Returns when the test opens the gate.',
  inputSchema: z.object({}),
  async run() {
    await hold.promise;
    return 'released';
  },
});

const stepper = defineTool({
  name: 'stepper',
  description: 'Runs a step with a side effect.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    await ctx.step('side', () => {
      sideEffects.add(ctx.taskId);
      return 1;
    });
    return 'stepped';
  },
});

const sleeper = defineTool({
  name: 'sleeper',
  description: 'Sleeps until its signal aborts.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    try {
      await ctx.sleep(60_000);
    } catch (error) {
      if (error instanceof CancelledError) aborted.set(ctx.taskId, error.reason);
      throw error;
    }
    return 'not reached';
  },
});

const asker = defineTool({
  name: 'asker',
  description: 'Asks its client a question.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.elicit({ message: 'Go on?', requestedSchema: { type: 'object', properties: {} } });
    return answer.action;
  },
});

let redis: TestRedis;
let h: Harness;
const monitors: RedisMonitor[] = [];

beforeAll(async () => {
  // A server of its own: the round-trip count watches every command the server runs.
  redis = await startRedis({ owned: true });
});

afterAll(async () => {
  await redis?.stop();
});

beforeEach(() => {
  h = new Harness(redis.url);
  hold = gate();
});

afterEach(async () => {
  vi.restoreAllMocks();
  hold.open();
  for (const m of monitors.splice(0)) m.close();
  await h.close();
});

/** The task's hash field `name`, as stored (the record leaves some out). */
function field(taskId: string, name: string): Promise<string | null> {
  return h.redis.hget(h.keys.task(taskId), name);
}

/** The script calls (EVALSHA) that name the task's hash, from now on, in the server's order: the store's writes. */
async function taskScriptCalls(taskId: string): Promise<{ readonly scripts: string[] }> {
  const taskKey = h.keys.task(taskId);
  const monitor = await monitorRedis(redis.url);
  monitors.push(monitor);
  await monitor.ready((marker) => h.redis.echo(marker));
  const from = monitor.commands.length;
  // The start's arguments name the job's id twice (lock and share); the transition's name its status.
  return {
    get scripts() {
      return monitor.commands
        .slice(from)
        .filter((c) => c.name === 'evalsha' && c.args.includes(taskKey))
        .map((c) => (c.args.includes('completed') ? 'end' : 'start'));
    },
  };
}

/**
 * Whole reads of the task's hash (HGETALL, in a script or not) from now on: the test itself reads single fields.
 * `count` first waits until the monitor has seen everything the server ran before it.
 */
async function taskReads(taskId: string): Promise<{ count: () => Promise<number> }> {
  const taskKey = h.keys.task(taskId);
  const monitor = await monitorRedis(redis.url);
  monitors.push(monitor);
  await monitor.ready((marker) => h.redis.echo(marker));
  const from = monitor.commands.length;
  return {
    count: async () => {
      await monitor.ready((marker) => h.redis.echo(marker));
      return monitor.commands.slice(from).filter((c) => c.name === 'hgetall' && c.args[0] === taskKey).length;
    },
  };
}

/**
 * Holds every start's answer from the worker until `release()`: the start runs in Redis as sent, only the run does
 * not learn its outcome. A run that waited for its start before its tool or its end would stop there.
 */
function holdStartAnswers(): { release: () => void; held: () => number } {
  const gateOpen = gate();
  let held = 0;
  const original = Runs.prototype.startRun;
  vi.spyOn(Runs.prototype, 'startRun').mockImplementation(async function (this: Runs, ...args) {
    const answer = await original.apply(this, args);
    held++;
    await gateOpen.promise;
    return answer;
  });
  return { release: () => gateOpen.open(), held: () => held };
}

describe('§21.2.1 a first run’s start is pipelined', () => {
  it('a short first run sends its start, then its end, and neither its tool nor its end waits for the start', async () => {
    await h.start([noop]);
    // Each script's first call loads it (EVALSHA refused, then EVAL): one run first.
    await h.waitForStatus(await h.enqueue('noop', {}), 'completed');
    const taskId = await h.enqueue('noop', {}, { jobless: true });
    const share = h.keys.fairShare(toolQueue('default', 'noop'), 'test');
    await h.redis.zadd(share, 1, taskId);

    const calls = await taskScriptCalls(taskId);
    const answers = holdStartAnswers();
    await h.addJob(taskId, 'noop', {});
    // The result is written while the run has not yet read its start's answer: the end did not wait for it.
    await waitFor(async () => (await field(taskId, 'status')) === 'completed', {
      message: 'the end waited for the start’s answer',
    });
    expect(answers.held()).toBe(1);
    // And the job stays with its run until that answer is read: BullMQ's next move must not overtake the start.
    expect(await h.jobState(taskId)).toBe('active');
    answers.release();
    const done = await h.waitForStatus(taskId, 'completed');
    await waitFor(async () => (await h.jobState(taskId)) === 'unknown', { message: 'job not ended' });
    expect(calls.scripts).toEqual(['start', 'end']);
    // The start was recorded: when the run began, its attempt, and the job out of its principal's share.
    const startedAt = await field(taskId, 'startedAt');
    expect(startedAt).not.toBeNull();
    expect(Date.parse(startedAt ?? '')).toBeLessThanOrEqual(Date.parse(done.lastUpdatedAt));
    expect(done.attempt).toBe(1);
    expect(await h.redis.zscore(share, taskId)).toBeNull();
    expect(done.result).toEqual({ content: [{ type: 'text', text: 'ok' }] });
  });

  it('a longer first run records its start as it begins', async () => {
    await h.start([held]);
    const taskId = await h.enqueue('held', {});
    const startedAt = await waitFor(() => field(taskId, 'startedAt'));
    const running = await h.task(taskId);
    expect(running?.status).toBe('working');
    expect(running?.attempt).toBe(1);
    hold.open();
    await h.waitForStatus(taskId, 'completed');
    expect(await field(taskId, 'startedAt')).toBe(startedAt);
  });

  it('a task cancelled while queued, its job left behind: no step runs and nothing is recorded', async () => {
    await h.start([stepper, sleeper]);
    const stepped = await h.enqueue('stepper', {}, { jobless: true });
    const slept = await h.enqueue('sleeper', {}, { jobless: true });
    // The gateway's cancel removes a waiting job; here the remove never happened (a gateway killed in between).
    await h.cancel(stepped, false);
    await h.cancel(slept, false);
    await h.addJob(stepped, 'stepper', {});
    await h.addJob(slept, 'sleeper', {});

    await waitFor(() => h.logs.find('task ended before its run recorded its start; aborting tool', stepped));
    await waitFor(() => aborted.get(slept));
    expect(aborted.get(slept)).toBe('CLIENT_CANCELLED');
    await waitFor(async () => (await h.jobState(stepped)) === 'unknown' && (await h.jobState(slept)) === 'unknown', {
      message: 'jobs not ended',
    });
    expect(sideEffects.has(stepped)).toBe(false);
    for (const taskId of [stepped, slept]) {
      const task = await h.task(taskId);
      expect(task).toMatchObject({ status: 'cancelled' });
      expect(task?.result).toBeUndefined();
      expect(await field(taskId, 'startedAt')).toBeNull();
    }
  });

  it('a first run ended by its gateway’s shutdown still leaves its principal’s waiting share', async () => {
    await h.start([sleeper]);
    const taskId = await h.enqueue('sleeper', {}, { jobless: true });
    const share = h.keys.fairShare(toolQueue('default', 'sleeper'), 'test');
    await h.redis.zadd(share, 1, taskId);
    const answers = holdStartAnswers();
    await h.addJob(taskId, 'sleeper', {});
    await waitFor(() => h.logs.find('tool started', taskId));
    // A drain ends the plain call as the gateway does (§11): cancelled first, then the workers told.
    await h.store.runs.transition(taskId, 'cancelled', { cancelReason: 'GATEWAY_SHUTDOWN' });
    const request: CancelRequest = { taskId, reason: 'GATEWAY_SHUTDOWN' };
    await h.redis.publish(h.keys.cancelChannel, JSON.stringify(request));
    await waitFor(() => aborted.get(taskId));
    expect(aborted.get(taskId)).toBe('GATEWAY_SHUTDOWN');
    // The run writes no end, but its job stays with it until the start's answer is read.
    await waitFor(() => h.logs.find('tool stopped: the gateway holding its call shut down', taskId));
    expect(answers.held()).toBe(1);
    expect(await h.jobState(taskId)).toBe('active');
    answers.release();
    await waitFor(async () => (await h.jobState(taskId)) === 'unknown', { message: 'job not ended' });
    await waitFor(async () => (await h.redis.zscore(share, taskId)) === null, { message: 'share entry not left' });
  });

  it('a first run’s start answers without the record: a tool that reads none of it costs no read of the task', async () => {
    await h.start([noop]);
    const taskId = await h.enqueue('noop', {}, { jobless: true });
    const reads = await taskReads(taskId);
    await h.addJob(taskId, 'noop', {});
    await waitFor(async () => (await field(taskId, 'status')) === 'completed', { message: 'noop did not complete' });
    expect(await field(taskId, 'attempt')).toBe('1');
    expect(await reads.count()).toBe(0);
  });

  it('a first run whose tool runs a step reads the record once, after its start: a redrive’s stored step is found', async () => {
    await h.start([stepper]);
    const { taskId } = await h.store.records.create({
      tool: 'stepper',
      queue: toolQueue('default', 'stepper'),
      principal: 'test',
      mode: 'task',
      ttl: 60_000,
      pollInterval: 100,
      gatewayId: h.gatewayId,
      steps: JSON.stringify({ side: 1 }),
    });
    const reads = await taskReads(taskId);
    await h.addJob(taskId, 'stepper', {});
    await waitFor(async () => (await field(taskId, 'status')) === 'completed', { message: 'stepper did not complete' });
    expect(sideEffects.has(taskId)).toBe(false);
    expect(await reads.count()).toBe(1);
  });

  it('a first run reads its client’s capabilities with the start before it asks', async () => {
    await h.start([asker]);
    const taskId = await h.enqueue('asker', {}, { clientCapabilities: [] });
    const task = await h.waitForStatus(taskId, 'failed');
    expect(task.error?.code).toBe('CAPABILITY_MISSING');
    expect(task.inputRequests ?? {}).toEqual({});
  });
});

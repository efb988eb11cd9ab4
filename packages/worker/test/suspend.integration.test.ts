/**
 * PROTOCOL.md §12 against a real Redis: runs that suspend (input requests, timed) free their slot, and a later run on
 * any worker replays the handler with the answers, the durable state and the step results.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startRedis, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { defineTool } from '../src/define-tool.js';
import { waitForApproval } from '../src/demo-tools.js';
import { Harness, gate } from './harness.js';

const runs = new Map<string, number>();
const stepCalls = new Map<string, number>();
const attempts = new Map<string, number[]>();
let busyGate = gate();

function count(map: Map<string, number>, id: string): number {
  const n = (map.get(id) ?? 0) + 1;
  map.set(id, n);
  return n;
}

const askTwice = defineTool({
  name: 'ask_twice',
  description: 'Asks two questions, one after the other, and returns both answers.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    count(runs, ctx.taskId);
    attempts.set(ctx.taskId, [...(attempts.get(ctx.taskId) ?? []), ctx.attempt]);
    const first = await ctx.elicit({
      message: 'Name?',
      requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] },
    });
    const second = await ctx.elicit({
      message: 'Sure?',
      requestedSchema: { type: 'object', properties: { sure: { type: 'boolean' } } },
    });
    return { first, second, answers: ctx.answers };
  },
});

const stepThenSuspend = defineTool({
  name: 'step_then_suspend',
  description: 'Runs a step, stores state, suspends once, then returns what it kept.',
  inputSchema: z.object({ forMs: z.number().int() }),
  async run({ forMs }, ctx) {
    count(runs, ctx.taskId);
    const id = await ctx.step('submit', () => `external-${count(stepCalls, ctx.taskId)}`);
    const state = ctx.state.get<{ polls: number }>() ?? { polls: 0 };
    await ctx.state.set({ polls: state.polls + 1 });
    if (state.polls === 0) await ctx.suspend({ forMs });
    return { id, polls: state.polls + 1 };
  },
});

const sampler = defineTool({
  name: 'sampler',
  description: 'Asks the client model once.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.sample({
      messages: [{ role: 'user', content: { type: 'text', text: 'Say hi' } }],
      maxTokens: 10,
    });
    return { model: answer.model, role: answer.role };
  },
});

const busy = defineTool({
  name: 'busy',
  description: 'Holds its slot until the test opens the gate.',
  inputSchema: z.object({}),
  async run() {
    await busyGate.promise;
    return 'done';
  },
});

const swallower = defineTool({
  name: 'swallower',
  description: 'Catches the suspension and returns anyway (a tool bug).',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    count(runs, ctx.taskId);
    try {
      await ctx.elicit({ message: 'Q?', requestedSchema: { type: 'object', properties: { a: { type: 'string' } } } });
    } catch {
      return 'swallowed';
    }
    return 'answered';
  },
});

const askTogether = defineTool({
  name: 'ask_together',
  description: 'Asks two questions at once.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    count(runs, ctx.taskId);
    const schema = { type: 'object' as const, properties: { v: { type: 'string' } } };
    const [a, b] = await Promise.all([
      ctx.elicit({ message: 'A?', requestedSchema: schema }),
      ctx.elicit({ message: 'B?', requestedSchema: schema }),
    ]);
    return { a: a.content?.['v'], b: b.content?.['v'] };
  },
});

const tools = [askTwice, askTogether, stepThenSuspend, sampler, busy, swallower, waitForApproval];

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
  busyGate = gate();
});
afterEach(async () => {
  busyGate.open();
  await h.close();
});

describe('§12.2 input requests', () => {
  it('suspends at each question, frees the slot, and replays with the answers on the next run', async () => {
    await h.start(tools, { concurrency: 1 });
    const id = await h.enqueue('ask_twice', {});
    const waiting = await h.waitForStatus(id, 'input_required');
    expect(waiting.pendingInput).toBe('1');
    expect(waiting.inputRequests?.['1']).toMatchObject({
      method: 'elicitation/create',
      params: { message: 'Name?' },
    });
    await waitFor(async () => ((await h.jobState(id)) === 'delayed' ? true : undefined), {
      message: 'job not delayed',
    });

    // The only slot is free while the task waits: another job runs to completion meanwhile.
    busyGate.open();
    const other = await h.enqueue('busy', {});
    await h.waitForStatus(other, 'completed');

    expect(await h.answer(id, 1, { action: 'accept', content: { name: 'Ada' } })).toBe(true);
    const second = await waitFor(
      async () => {
        const t = await h.task(id);
        return t?.status === 'input_required' && t.pendingInput === '2' ? t : undefined;
      },
      { message: 'second question not asked' },
    );
    expect(second.inputResponses).toEqual({ '1': { action: 'accept', content: { name: 'Ada' } } });
    expect(await h.answer(id, 2, { action: 'decline' })).toBe(true);

    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({
      first: { action: 'accept', content: { name: 'Ada' } },
      second: { action: 'decline' },
      answers: { '1': { action: 'accept', content: { name: 'Ada' } }, '2': { action: 'decline' } },
    });
    expect(runs.get(id)).toBe(3);
    expect(attempts.get(id)).toEqual([1, 2, 3]);
  });

  it('refuses a second answer, an answer to a request never asked, and changes nothing', async () => {
    await h.start(tools);
    const id = await h.enqueue('ask_twice', {});
    await h.waitForStatus(id, 'input_required');
    expect(await h.store.runs.answerInput(id, 2, { action: 'accept' }, Date.now() + 1000)).toEqual({
      ok: false,
      status: 'input_required',
    });
    expect(await h.answer(id, 1, { action: 'accept', content: { name: 'A' } })).toBe(true);
    expect(
      await h.store.runs.answerInput(id, 1, { action: 'accept', content: { name: 'B' } }, Date.now()),
    ).toMatchObject({
      ok: false,
    });
    const t = await waitFor(
      async () => {
        const r = await h.task(id);
        return r?.pendingInput === '2' ? r : undefined;
      },
      { message: 'second question not asked' },
    );
    expect(t.inputResponses?.['1']).toEqual({ action: 'accept', content: { name: 'A' } });
  });

  it('asks questions made at once together, and resumes only when both are answered', async () => {
    await h.start(tools);
    const id = await h.enqueue('ask_together', {});
    const waiting = await h.waitForStatus(id, 'input_required');
    expect(waiting.pendingInputs).toEqual(['1', '2']);
    expect(Object.keys(waiting.inputRequests ?? {})).toEqual(['1', '2']);
    expect(await h.answer(id, 2, { action: 'accept', content: { v: 'second' } })).toBe(true);
    const partly = await h.task(id);
    expect([partly?.status, partly?.pendingInputs]).toEqual(['input_required', ['1']]);
    expect(await h.answer(id, 1, { action: 'accept', content: { v: 'first' } })).toBe(true);
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({ a: 'first', b: 'second' });
    expect(runs.get(id)).toBe(2);
  });

  it('resumes on another worker after the one that asked is gone', async () => {
    const first = await h.start(tools);
    const id = await h.enqueue('wait_for_approval', { question: 'Deploy?' });
    await h.waitForStatus(id, 'input_required');
    await first.close({ graceMs: 0 });
    await h.start(tools);
    expect(await h.answer(id, 1, { action: 'accept', content: { approved: true } })).toBe(true);
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({ approved: true });
  });

  it('wait_for_approval completes with approved: false on decline', async () => {
    await h.start(tools);
    const id = await h.enqueue('wait_for_approval', { question: 'Deploy?' });
    await h.waitForStatus(id, 'input_required');
    await h.answer(id, 1, { action: 'decline' });
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({ approved: false });
  });

  it('a sampling request round-trips the same way', async () => {
    await h.start(tools);
    const id = await h.enqueue('sampler', {});
    const waiting = await h.waitForStatus(id, 'input_required');
    expect(waiting.inputRequests?.['1']?.method).toBe('sampling/createMessage');
    await h.answer(id, 1, { role: 'assistant', content: { type: 'text', text: 'hi' }, model: 'test-model' });
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({ model: 'test-model', role: 'assistant' });
  });

  it('§12.8 a cancel while waiting ends the task cancelled without running the tool again', async () => {
    await h.start(tools);
    const id = await h.enqueue('ask_twice', {});
    await h.waitForStatus(id, 'input_required');
    await h.cancel(id, false);
    await h.promote(id);
    await waitFor(async () => ((await h.jobState(id)) === 'unknown' ? true : undefined), {
      message: 'job not finished after the cancel',
    });
    expect((await h.task(id))?.status).toBe('cancelled');
    expect(runs.get(id)).toBe(1);
  });

  it('fails the task clearly when the client cannot answer elicitation', async () => {
    await h.start(tools);
    const id = await h.enqueue('wait_for_approval', { question: 'Deploy?' }, { clientCapabilities: ['sampling'] });
    const failed = await h.waitForStatus(id, 'failed');
    expect(failed.statusMessage).toMatch(/did not declare the elicitation capability/);
    expect(failed.inputRequests).toBeUndefined();
  });

  it('discards what a tool returns after swallowing its suspension, and still waits', async () => {
    await h.start(tools);
    const id = await h.enqueue('swallower', {});
    await h.waitForStatus(id, 'input_required');
    await waitFor(() => h.logs.find(/went on after its run suspended/, id), { message: 'no warning logged' });
    await h.answer(id, 1, { action: 'accept', content: { a: 'x' } });
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.content).toEqual([{ type: 'text', text: 'answered' }]);
  });
});

describe('§12.1 durable state, §12.6 timed suspension', () => {
  it('runs a step once and keeps state across a timed suspension', async () => {
    await h.start(tools);
    const id = await h.enqueue('step_then_suspend', { forMs: 100 });
    const done = await h.waitForStatus(id, 'completed');
    expect(done.result?.structuredContent).toEqual({ id: 'external-1', polls: 2 });
    expect(stepCalls.get(id)).toBe(1);
    expect(runs.get(id)).toBe(2);
    expect(done.state).toEqual({ polls: 2 });
    expect(done.steps).toEqual({ submit: 'external-1' });
  });

  it('refuses a state write from a run that does not hold the job lock', async () => {
    const id = await h.enqueue('echo', {}, { jobless: true });
    expect(await h.store.runs.setState(id, { queue: 'default', token: 'not-the-lock' }, 'state', { x: 1 })).toBe(
      'lock_lost',
    );
    expect((await h.task(id))?.state).toBeUndefined();
    await expect(
      h.store.runs.setState(id, { queue: 'default', token: 't' }, 'state', 'x'.repeat(70_000)),
    ).rejects.toThrow(RangeError);
  });
});

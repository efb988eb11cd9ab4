/**
 * Issue 19, PROTOCOL.md §17.3: what becomes of a 2026-07-28 plain call between its input rounds. A retry that carries
 * a progress token and accepts SSE gets the progress the tool reports after resuming, on its own token, whichever
 * replica it lands on (the retry takes the call's route); a round nobody retries ends when its `requestState` lapses
 * (the tool's input timeout): the reaper fails the call, its open-task place is free again, the stale state is refused.
 * Two gateways of one deployment, one worker, raw HTTP.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { createKeys, TaskStore } from '@taskrelay/shared';
import { waitFor } from './helpers/wait-for.js';
import { modernRequest, readSse } from './helpers/raw-mcp.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';

type Json = Record<string, any>;

// One gateway at start, the second after it: two starting at once on a loaded machine have missed the helper's 20 s
// readiness bound.
const stack = useStack({
  name: 'rounds',
  tokens: { alice: 'alice-t', bob: 'bob-t' },
  env: {
    // One unfinished call per principal: a round nobody retries is seen to hold its place, then to free it.
    TASKRELAY_MAX_OPEN_TASKS: '1',
    TASKRELAY_REAPER_INTERVAL_MS: '200',
  },
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/round-tools.mjs') }],
});
let store: TaskStore;
let gatewayA: GatewayProcess;
let gatewayB: GatewayProcess;

beforeAll(async () => {
  store = new TaskStore(stack.r, createKeys(stack.prefix));
  gatewayA = stack.gateway;
  gatewayB = await stack.addGateway();
});

interface CallOptions {
  gateway: GatewayProcess;
  token?: string;
  progressToken?: string;
}

/** One 2026-07-28 `tools/call`: every JSON-RPC message of its answer, in order (one JSON body, or an SSE stream). */
async function call(name: string, params: Json, options: CallOptions): Promise<Json[]> {
  const { headers, body } = modernRequest(
    'tools/call',
    { name, ...params },
    {
      capabilities: { elicitation: {} },
      meta: options.progressToken !== undefined ? { progressToken: options.progressToken } : {},
      headers: { authorization: `Bearer ${options.token ?? 'alice-t'}` },
    },
  );
  const res = await fetch(options.gateway.url, { method: 'POST', headers, body });
  if ((res.headers.get('content-type') ?? '').includes('application/json')) return [(await res.json()) as Json];
  const messages: Json[] = [];
  for await (const event of readSse(res)) messages.push(event.data as Json);
  return messages;
}

const final = (messages: Json[]) => messages.at(-1) as Json;
const progressOf = (messages: Json[]) =>
  messages.filter((m) => m['method'] === 'notifications/progress').map((m) => m['params'] as Json);

const taskIdOf = (requestState: string) =>
  (JSON.parse(Buffer.from(requestState.split('.')[0] ?? '', 'base64url').toString('utf8')) as Json)['t'] as string;

describe('§17.3 a retried round reports its progress on its own stream', () => {
  for (const [label, retryOn] of [
    ['on another replica', () => gatewayB],
    ['on the same gateway', () => gatewayA],
  ] as const) {
    it(`forwards the progress after the answer to the retry's token (${label})`, async () => {
      const round1 = await call(
        'progress_after_answer',
        { arguments: { pauseMs: 150 } },
        { gateway: gatewayA, progressToken: 'round-1' },
      );
      const asked = final(round1)['result'] as Json;
      expect(asked['resultType']).toBe('input_required');
      // Round 1's own progress, on its token, before its question.
      expect(progressOf(round1).map((p) => [p['progressToken'], p['progress']])).toEqual([['round-1', 1]]);
      const round2 = await call(
        'progress_after_answer',
        {
          arguments: { pauseMs: 150 },
          requestState: asked['requestState'],
          inputResponses: { '1': { action: 'accept', content: { ok: true } } },
        },
        { gateway: retryOn(), progressToken: 'round-2' },
      );
      expect(final(round2)['result']).toMatchObject({ resultType: 'complete', content: [{ text: 'ok=true' }] });
      const progress = progressOf(round2);
      // Every notification on the retry's token, rising, up to the last value (a close pair may be coalesced).
      expect(progress.length).toBeGreaterThan(0);
      expect(new Set(progress.map((p) => p['progressToken']))).toEqual(new Set(['round-2']));
      const values = progress.map((p) => p['progress'] as number);
      expect(values).toEqual([...values].sort((a, b) => a - b));
      expect(values.at(-1)).toBe(4);
      expect(values.every((v) => v >= 2)).toBe(true);
      // The call is owned by the gateway that served the retry now.
      const record = await store.records.get(taskIdOf(asked['requestState'] as string));
      expect(record?.status).toBe('completed');
    });
  }

  it('a retry without a progress token gets the result alone, and no other stream gets the progress', async () => {
    const round1 = await call('progress_after_answer', { arguments: { pauseMs: 50 } }, { gateway: gatewayA });
    const asked = final(round1)['result'] as Json;
    expect(asked['resultType']).toBe('input_required');
    const round2 = await call(
      'progress_after_answer',
      {
        arguments: { pauseMs: 50 },
        requestState: asked['requestState'],
        inputResponses: { '1': { action: 'accept', content: { ok: false } } },
      },
      { gateway: gatewayB },
    );
    expect(round2).toHaveLength(1);
    expect(final(round2)['result']).toMatchObject({ resultType: 'complete', content: [{ text: 'ok=false' }] });
  });
});

describe('§17.3 a round nobody retries', () => {
  it('ends when its requestState lapses: the call fails TIMEOUT, its open-task place is free, the state is refused', async () => {
    const round1 = await call('ask_briefly', { arguments: {} }, { gateway: gatewayA, token: 'bob-t' });
    const asked = final(round1)['result'] as Json;
    expect(asked['resultType']).toBe('input_required');
    const taskId = taskIdOf(asked['requestState'] as string);
    // The waiting call holds bob's only place (TASKRELAY_MAX_OPEN_TASKS=1).
    const refused = final(await call('ask_briefly', { arguments: {} }, { gateway: gatewayB, token: 'bob-t' }));
    expect(refused['error']?.['message']).toMatch(/Too many open tasks/);
    // Nobody retries: at the round's end (the tool's 1.5 s input timeout) the reaper fails the call.
    const ended = await waitFor(
      async () => {
        const record = await store.records.get(taskId);
        return record?.status === 'failed' ? record : undefined;
      },
      { timeoutMs: 10_000, message: 'the abandoned round never ended' },
    );
    expect(ended.error?.code).toBe('TIMEOUT');
    // Its place is free again: a new call of bob's is taken (and asks, as the first did).
    const again = final(await call('ask_briefly', { arguments: {} }, { gateway: gatewayB, token: 'bob-t' }));
    expect(again['result']?.['resultType']).toBe('input_required');
    // The lapsed state is refused, and changes nothing.
    const late = final(
      await call(
        'ask_briefly',
        {
          arguments: {},
          requestState: asked['requestState'],
          inputResponses: { '1': { action: 'accept', content: { ok: true } } },
        },
        { gateway: gatewayA, token: 'bob-t' },
      ),
    );
    expect(late['error']).toMatchObject({ code: -32602 });
    expect((await store.records.get(taskId))?.status).toBe('failed');
  });
});

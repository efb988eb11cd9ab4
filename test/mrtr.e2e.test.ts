/**
 * Issue 19, PROTOCOL.md §17: input rounds of a 2026-07-28 plain call (MRTR, SEP-2322). A tool that asks
 * (`ctx.elicit`, `ctx.sample`, `ctx.listRoots`) makes the `tools/call` answer an `InputRequiredResult`; the client
 * retries with `inputResponses` and the echoed, signed `requestState`, on any gateway replica, for as many rounds as the
 * tool asks. The same tool on a 2025-11-25 session asks on the request stream. Raw HTTP over two gateways of one
 * deployment (one Redis, one prefix), authenticated, so a state is seen to be bound to its principal. And SEP-2243
 * (§16.2): an argument a tool mirrors into an `Mcp-Param-*` header is checked against it.
 */
import { createHmac } from 'node:crypto';
import { resolve } from 'node:path';
import { Redis } from 'ioredis';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, type ElicitRequest } from '@modelcontextprotocol/sdk/types.js';
import { beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { TASKS_EXT, modernRequest } from './helpers/raw-mcp.js';

const EXT = TASKS_EXT;
type Json = Record<string, any>;

// No TASKRELAY_REQUEST_STATE_SECRET: the replicas agree on the key the first one stores in Redis (§17.2).
const stack = useStack({
  name: 'mrtr',
  tokens: { alice: 'alice-t', bob: 'bob-t' },
  gateways: [{}, {}],
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/conformance/tools.mjs') }],
});
let prefix: string;
let gatewayA: GatewayProcess;
let gatewayB: GatewayProcess;

beforeAll(() => {
  ({ prefix } = stack);
  [gatewayA, gatewayB] = stack.gateways as [GatewayProcess, GatewayProcess];
});

interface CallOptions {
  gateway?: GatewayProcess;
  token?: string;
  ext?: boolean;
  headers?: Record<string, string>;
}

/** One 2026-07-28 `tools/call` (or other request), as a 2026 client sends it. */
async function rpc(method: string, params: Json, options: CallOptions = {}): Promise<{ status: number; body: Json }> {
  const capabilities: Json = { elicitation: {}, sampling: {}, roots: {} };
  if (options.ext) capabilities['extensions'] = { [EXT]: {} };
  const { headers, body } = modernRequest(method, params, {
    capabilities,
    headers: { authorization: `Bearer ${options.token ?? 'alice-t'}`, ...options.headers },
  });
  const res = await fetch((options.gateway ?? gatewayA).url, { method: 'POST', headers, body });
  return { status: res.status, body: (await res.json()) as Json };
}

async function call(name: string, extra: Json = {}, options: CallOptions = {}): Promise<Json> {
  const { status, body } = await rpc('tools/call', { name, arguments: {}, ...extra }, options);
  if (body['error']) throw new Error(`tools/call ${name} → ${status} ${JSON.stringify(body['error'])}`);
  return body['result'] as Json;
}

async function callError(name: string, extra: Json, options: CallOptions = {}): Promise<Json> {
  const { body } = await rpc('tools/call', { name, arguments: {}, ...extra }, options);
  expect(body['result']).toBeUndefined();
  return body['error'] as Json;
}

const accept = (content: Json) => ({ action: 'accept', content });

/** The plain call's task behind a requestState (its payload is readable; only the MAC makes it trusted). */
function taskIdOf(requestState: string): string {
  const payload = JSON.parse(Buffer.from(requestState.split('.')[0] ?? '', 'base64url').toString('utf8')) as Json;
  return String(payload['t']);
}

async function taskStatus(taskId: string): Promise<string | null> {
  const client = new Redis(stack.redis.url);
  try {
    return await client.hget(`${prefix}:task:${taskId}`, 'status');
  } finally {
    client.disconnect();
  }
}

describe('§17 MRTR on 2026-07-28 plain calls', () => {
  it('answers a tool that asks with an InputRequiredResult, and its retry with the result (one round)', async () => {
    const round1 = await call('test_input_required_result_elicitation');
    expect(round1).toMatchObject({
      resultType: 'input_required',
      inputRequests: { user_name: { method: 'elicitation/create', params: { message: 'What is your name?' } } },
    });
    expect(round1).not.toHaveProperty('taskId');
    expect(typeof round1['requestState']).toBe('string');
    const round2 = await call('test_input_required_result_elicitation', {
      inputResponses: { user_name: accept({ name: 'Alice' }) },
      requestState: round1['requestState'],
    });
    expect(round2).toMatchObject({ resultType: 'complete', content: [{ type: 'text', text: 'Hello, Alice!' }] });
  });

  it('goes through as many rounds as the tool asks, each with a fresh requestState (two rounds)', async () => {
    const r1 = await call('test_input_required_result_multi_round');
    expect(Object.keys(r1['inputRequests'] as Json)).toEqual(['step1']);
    const r2 = await call('test_input_required_result_multi_round', {
      inputResponses: { step1: accept({ name: 'Ada' }) },
      requestState: r1['requestState'],
    });
    expect(r2['resultType']).toBe('input_required');
    expect(Object.keys(r2['inputRequests'] as Json)).toEqual(['step2']);
    expect(r2['requestState']).not.toBe(r1['requestState']);
    const r3 = await call('test_input_required_result_multi_round', {
      inputResponses: { step2: accept({ color: 'green' }) },
      requestState: r2['requestState'],
    });
    expect(r3).toMatchObject({ resultType: 'complete', content: [{ text: 'Ada likes green' }] });
  });

  it('asks again for what a retry left unanswered, and ignores keys it did not ask', async () => {
    const r1 = await call('test_input_required_result_multiple_inputs');
    expect(Object.keys(r1['inputRequests'] as Json).sort()).toEqual(['client_roots', 'greeting', 'user_name']);
    const r2 = await call('test_input_required_result_multiple_inputs', {
      inputResponses: { user_name: accept({ name: 'Bo' }), not_asked: accept({}) },
      requestState: r1['requestState'],
    });
    expect(r2['resultType']).toBe('input_required');
    expect(Object.keys(r2['inputRequests'] as Json).sort()).toEqual(['client_roots', 'greeting']);
    const r3 = await call('test_input_required_result_multiple_inputs', {
      inputResponses: {
        greeting: { role: 'assistant', content: { type: 'text', text: 'Hi' }, model: 'm' },
        client_roots: { roots: [{ uri: 'file:///a' }] },
      },
      requestState: r2['requestState'],
    });
    expect(r3).toMatchObject({ resultType: 'complete', content: [{ text: 'Hi Bo (1 roots)' }] });
  });

  it('refuses a tampered requestState with -32602 and changes nothing: the real one still works', async () => {
    const r1 = await call('test_input_required_result_tampered_state');
    const state = String(r1['requestState']);
    const taskId = taskIdOf(state);
    const [payload, mac] = state.split('.') as [string, string];
    const altered = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as Json;
    altered['e'] = Number(altered['e']) + 1;
    const forged = `${Buffer.from(JSON.stringify(altered)).toString('base64url')}.${mac}`;
    for (const bad of [`${state}-TAMPERED`, forged, 'not-a-state', `${payload}.`]) {
      const error = await callError('test_input_required_result_tampered_state', {
        inputResponses: { confirm: accept({ ok: true }) },
        requestState: bad,
      });
      expect(error).toMatchObject({ code: -32602, message: 'Invalid requestState' });
    }
    expect(await taskStatus(taskId)).toBe('input_required');
    const done = await call('test_input_required_result_tampered_state', {
      inputResponses: { confirm: accept({ ok: true }) },
      requestState: state,
    });
    expect(done).toMatchObject({ resultType: 'complete', content: [{ text: 'confirmed=true' }] });
  });

  it("refuses another principal's requestState, and a requestState used for another tool", async () => {
    const r1 = await call('test_input_required_result_request_state');
    const state = String(r1['requestState']);
    const answers = { inputResponses: { confirm: accept({ ok: true }) }, requestState: state };
    const asBob = await callError('test_input_required_result_request_state', answers, { token: 'bob-t' });
    expect(asBob).toMatchObject({ code: -32602, message: 'Invalid requestState' });
    const otherTool = await callError('test_input_required_result_tampered_state', answers);
    expect(otherTool).toMatchObject({ code: -32602, message: 'Invalid requestState' });
    expect(await taskStatus(taskIdOf(state))).toBe('input_required');
    const done = await call('test_input_required_result_request_state', answers);
    expect(done).toMatchObject({ resultType: 'complete', content: [{ text: 'state-ok: confirmed=true' }] });
  });

  it('refuses a retry with other arguments than the round it answers (R9), and the real retry still works', async () => {
    const r1 = await call('test_elicitation', { arguments: { message: 'pay alice 10' } });
    expect(r1).toMatchObject({ resultType: 'input_required' });
    const state = String(r1['requestState']);
    const key = Object.keys(r1['inputRequests'] as Json)[0] ?? '';
    const answers = { inputResponses: { [key]: accept({ username: 'a', email: 'a@x' }) }, requestState: state };
    const other = await callError('test_elicitation', { arguments: { message: 'pay mallory 1000' }, ...answers });
    expect(other).toMatchObject({ code: -32602 });
    expect(String(other['message'])).toMatch(/^Invalid requestState: it was issued for a call with other arguments/);
    expect(await taskStatus(taskIdOf(state))).toBe('input_required');
    const done = await call('test_elicitation', { arguments: { message: 'pay alice 10' }, ...answers });
    expect(done).toMatchObject({ resultType: 'complete' });
    expect(JSON.stringify(done['content'])).toContain('action=accept');
  });

  it('refuses an expired requestState, even one signed with the deployment key', async () => {
    const r1 = await call('test_input_required_result_request_state');
    const state = String(r1['requestState']);
    const client = new Redis(stack.redis.url);
    const key = await client.get(`${prefix}:request-state-key`).finally(() => client.disconnect());
    expect(key).toBeTruthy();
    const payload = JSON.parse(Buffer.from(state.split('.')[0] ?? '', 'base64url').toString('utf8')) as Json;
    const body = Buffer.from(JSON.stringify({ ...payload, e: Date.now() - 1000 })).toString('base64url');
    const mac = createHmac('sha256', Buffer.from(String(key), 'base64url'))
      .update(body)
      .digest('base64url');
    const error = await callError('test_input_required_result_request_state', {
      inputResponses: { confirm: accept({ ok: true }) },
      requestState: `${body}.${mac}`,
    });
    expect(error).toMatchObject({ code: -32602, message: 'Invalid requestState' });
    expect(await taskStatus(taskIdOf(state))).toBe('input_required');
  });

  it('takes the retry up on another gateway replica', async () => {
    const r1 = await call('test_input_required_result_sampling', {}, { gateway: gatewayA });
    expect(r1['inputRequests']).toMatchObject({ capital_question: { method: 'sampling/createMessage' } });
    const r2 = await call(
      'test_input_required_result_sampling',
      {
        inputResponses: {
          capital_question: { role: 'assistant', content: { type: 'text', text: 'Paris' }, model: 'm' },
        },
        requestState: r1['requestState'],
      },
      { gateway: gatewayB },
    );
    expect(r2).toMatchObject({ resultType: 'complete', content: [{ text: 'Sampling response: Paris' }] });
  });

  it('refuses an answer that does not fit its request with -32602, storing nothing', async () => {
    const r1 = await call('test_input_required_result_list_roots');
    const error = await callError('test_input_required_result_list_roots', {
      inputResponses: { client_roots: { roots: 'none' } },
      requestState: r1['requestState'],
    });
    expect(error['code']).toBe(-32602);
    expect(await taskStatus(taskIdOf(String(r1['requestState'])))).toBe('input_required');
  });

  it('lets an inputFirst tool end its rounds by becoming a task (tasks-mrtr-composition)', async () => {
    const r1 = await call('test_tool_with_task', {}, { ext: true });
    expect(r1).toMatchObject({ resultType: 'input_required', inputRequests: { user_name: {} } });
    expect(r1).not.toHaveProperty('taskId');
    const r2 = await call(
      'test_tool_with_task',
      { inputResponses: { user_name: accept({ name: 'Alice' }) }, requestState: r1['requestState'] },
      { ext: true, gateway: gatewayB },
    );
    expect(r2).toMatchObject({ resultType: 'task', status: 'working' });
    expect(r2).not.toHaveProperty('requestState');
    const taskId = String(r2['taskId']);
    // Every poll finds the task: never "not found" on the way, on the gateway of round 1 (which held the call's route).
    const errors: unknown[] = [];
    const done = await waitFor(
      async () => {
        const { body } = await rpc('tasks/get', { taskId }, { ext: true });
        if (body['error'] !== undefined) errors.push(body['error']);
        return body['result']?.['status'] === 'completed' ? (body['result'] as Json) : undefined;
      },
      { timeoutMs: 15_000, message: 'the task did not complete' },
    );
    expect(done['result']).toMatchObject({ content: [{ text: 'Hello, Alice! (finished as a task)' }] });
    expect(errors).toEqual([]);
    // Asked again once it ended: the same task, again.
    expect((await rpc('tasks/get', { taskId }, { ext: true })).body['result']).toMatchObject({ status: 'completed' });
    // A task of alice's only.
    const { body } = await rpc('tasks/get', { taskId }, { ext: true, token: 'bob-t' });
    expect(body['error']?.code).toBe(-32602);
  });
});

describe('§17.5 the same tool on a 2025-11-25 session', () => {
  it('asks on the request stream (elicitation/create) and returns the result to the same call', async () => {
    const client = new Client({ name: 'mrtr-legacy', version: '0' }, { capabilities: { elicitation: {} } });
    const asked: ElicitRequest['params'][] = [];
    client.setRequestHandler(ElicitRequestSchema, (request) => {
      asked.push(request.params);
      return { action: 'accept', content: { name: 'Bob' } };
    });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(gatewayA.url), {
        requestInit: { headers: { authorization: 'Bearer alice-t' } },
      }),
    );
    try {
      const result = await client.callTool({ name: 'test_input_required_result_elicitation', arguments: {} });
      expect(result).toMatchObject({ content: [{ type: 'text', text: 'Hello, Bob!' }] });
      expect(result).not.toHaveProperty('resultType');
      expect(asked).toHaveLength(1);
      expect(asked[0]).toMatchObject({ message: 'What is your name?' });
    } finally {
      await client.close();
    }
  });
});

describe('§16.2 SEP-2243 x-mcp-header', () => {
  const tenantCall = (tenant: unknown, headers: Record<string, string>) =>
    rpc('tools/call', { name: 'test_header_param', arguments: { tenant } }, { headers });

  it('publishes the annotation and serves a call whose Mcp-Param header matches, plain or Base64', async () => {
    const { body } = await rpc('tools/list', {});
    const tool = (body['result']['tools'] as Json[]).find((t) => t['name'] === 'test_header_param');
    expect(tool?.['inputSchema']?.['properties']?.['tenant']).toMatchObject({
      type: 'string',
      'x-mcp-header': 'Tenant',
    });
    const plain = await tenantCall('acme', { 'mcp-param-tenant': 'acme' });
    expect([plain.status, plain.body['result']?.['content']?.[0]?.['text']]).toEqual([200, 'tenant=acme']);
    const encoded = `=?base64?${Buffer.from(' Zürich ').toString('base64')}?=`;
    const decoded = await tenantCall(' Zürich ', { 'Mcp-Param-Tenant': encoded });
    expect([decoded.status, decoded.body['result']?.['content']?.[0]?.['text']]).toEqual([200, 'tenant= Zürich ']);
    // A value without the whole sentinel is literal.
    const literal = await tenantCall('=?base64?YWNtZQ==', { 'mcp-param-tenant': '=?base64?YWNtZQ==' });
    expect(literal.status).toBe(200);
  });

  it('refuses a missing, different or malformed Mcp-Param header with HTTP 400 and -32020', async () => {
    const cases: Array<Record<string, string>> = [
      {},
      { 'mcp-param-tenant': 'other' },
      { 'mcp-param-tenant': '=?base64?YWNtZQ?=' },
      { 'mcp-param-tenant': '=?base64?YW!!NtZQ==?=' },
    ];
    for (const headers of cases) {
      const answer = await tenantCall('acme', headers);
      expect([JSON.stringify(headers), answer.status, answer.body['error']?.['code']]).toEqual([
        JSON.stringify(headers),
        400,
        -32020,
      ]);
    }
  });
});

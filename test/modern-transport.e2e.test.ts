/**
 * Issue 8, PROTOCOL.md §14: the sessionless 2026-07-28 transport on the same /mcp endpoint, beside 2025-11-25
 * sessions, over the same stored tasks. Raw HTTP, as a 2026 client sends it (routing headers, per-request _meta).
 */
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { resolve } from 'node:path';
import { ROOT, readMetric } from './helpers/processes.js';
import { MODERN_VERSION, RawSession, TASKS_EXT, modernRequest, readSse } from './helpers/raw-mcp.js';

const V = MODERN_VERSION;
const EXT = TASKS_EXT;
type Json = Record<string, any>;

const stack = useStack({ name: 'modern', workers: [{}, FIXTURE_WORKER] });
const CONFORMANCE_TOOLS = resolve(ROOT, 'test/conformance/tools.mjs');

interface SendOptions {
  ext?: boolean;
  headers?: Record<string, string | undefined>;
  meta?: Json;
  signal?: AbortSignal;
  accept?: string;
}

/** The id of the last request sent. */
let lastId = 0;

/** The headers and body of one 2026-07-28 request (routing headers and the per-request _meta a 2026 client sends). */
function request(
  method: string,
  params: Json = {},
  options: SendOptions = {},
): { headers: Record<string, string>; body: string } {
  const built = modernRequest(method, params, {
    capabilities: options.ext ? { extensions: { [EXT]: {} } } : {},
    meta: { 'io.modelcontextprotocol/clientInfo': { name: 'raw-2026', version: '0' }, ...options.meta },
    headers: { ...(options.accept ? { accept: options.accept } : {}), ...options.headers },
  });
  lastId = built.id;
  return built;
}

function post(method: string, params: Json = {}, options: SendOptions = {}): Promise<Response> {
  const { headers, body } = request(method, params, options);
  return fetch(stack.gateway.url, { method: 'POST', headers, body, signal: options.signal ?? null });
}

/**
 * Sends one request in full, then closes the connection without reading a byte of the answer: the response stream
 * closes while the gateway is still handling the call. Resolves once the socket is closed.
 */
function sendAndHangUp(method: string, params: Json, options: SendOptions = {}): Promise<void> {
  const { headers, body } = request(method, params, options);
  const url = new URL(stack.gateway.url);
  const head = [
    `POST ${url.pathname} HTTP/1.1`,
    `host: ${url.host}`,
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    `content-length: ${Buffer.byteLength(body)}`,
    'connection: close',
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname);
    socket.once('error', reject);
    // Written to the kernel means sent on loopback; nothing was read, so destroy() closes with a FIN, not a reset.
    socket.write(`${head}\r\n\r\n${body}`, () => socket.destroy());
    socket.once('close', () => resolve());
  });
}

async function rpc(
  method: string,
  params: Json = {},
  options: SendOptions = {},
): Promise<{ status: number; body: Json }> {
  const res = await post(method, params, options);
  return { status: res.status, body: (await res.json()) as Json };
}

async function result(method: string, params: Json = {}, options: SendOptions = {}): Promise<Json> {
  const { status, body } = await rpc(method, params, options);
  if (body['error']) throw new Error(`${method} → ${status} ${JSON.stringify(body['error'])}`);
  return body['result'] as Json;
}

async function until(taskId: string, status: string): Promise<Json> {
  return waitFor(
    async () => {
      const task = await result('tasks/get', { taskId }, { ext: true });
      return task['status'] === status ? task : undefined;
    },
    { timeoutMs: 15_000, message: `task ${taskId} did not become ${status}` },
  );
}

describe('§14 the 2026-07-28 transport', () => {
  it('answers server/discover with the version, capabilities and the tasks extension, no initialize needed', async () => {
    const discovered = await result('server/discover');
    expect(discovered).toMatchObject({
      resultType: 'complete',
      supportedVersions: [V],
      capabilities: { tools: { listChanged: true }, extensions: { [EXT]: {} } },
      ttlMs: 0,
      cacheScope: 'private',
    });
    expect(discovered['capabilities']).not.toHaveProperty('tasks');
  });

  it('answers the prompt and resource lists (empty; the task-output templates), with caching hints, as server/discover declares them', async () => {
    const { capabilities } = (await result('server/discover')) as { capabilities: Json };
    expect(capabilities).toMatchObject({ prompts: {}, resources: {} });
    // Nothing is pushed for them, so no listChanged or subscribe is claimed.
    expect(capabilities['prompts']).toEqual({});
    expect(capabilities['resources']).toEqual({});
    const hints = { resultType: 'complete', ttlMs: 0, cacheScope: 'private' };
    expect(await result('prompts/list')).toEqual({ prompts: [], ...hints });
    expect(await result('resources/list')).toEqual({ resources: [], ...hints });
    // The task-output templates (PROTOCOL.md §34.1).
    const templates = await result('resources/templates/list');
    expect(templates).toMatchObject(hints);
    expect((templates['resourceTemplates'] as Json[]).map((t) => t['name'])).toEqual(['task-output', 'task-blob']);
    const prompt = await rpc('prompts/get', { name: 'p' }, { headers: { 'mcp-name': 'p' } });
    expect(prompt.body['error']).toMatchObject({ code: -32602, message: 'Unknown prompt: p' });
    const resource = await rpc('resources/read', { uri: 'file:///x' }, { headers: { 'mcp-name': 'file:///x' } });
    expect(resource.body['error']).toMatchObject({ code: -32602, data: { uri: 'file:///x' } });
  });

  it('lists tools and runs a plain call, each result marked complete', async () => {
    const listed = await result('tools/list');
    expect(listed['resultType']).toBe('complete');
    expect((listed['tools'] as Json[]).map((t) => t['name'])).toContain('build_report');
    const called = await result('tools/call', {
      name: 'build_report',
      arguments: { report: 'm', items: 2, delayMs: 1 },
    });
    expect(called).toMatchObject({ resultType: 'complete', structuredContent: { report: 'm', items: 2 } });
  });

  it('runs a task only for a request that declares the extension, and renders it flat', async () => {
    const sync = await result('tools/call', { name: 'sleepy', arguments: { ms: 10 } });
    expect(sync).toMatchObject({ resultType: 'complete', structuredContent: { ms: 10 } });
    const created = await result('tools/call', { name: 'sleepy', arguments: { ms: 50 } }, { ext: true });
    expect(created).toMatchObject({ resultType: 'task', status: 'working' });
    const done = await until(String(created['taskId']), 'completed');
    expect(done['result']).toMatchObject({ structuredContent: { ms: 50 } });
  });

  it('answers -32021 with the required capability for a task-only tool, and for tasks/* without the extension', async () => {
    const required = await rpc('tools/call', { name: 'wait_for_approval', arguments: { question: 'q' } });
    expect(required.body['error']).toMatchObject({
      code: -32021,
      data: { requiredCapabilities: { extensions: { [EXT]: {} } } },
    });
    for (const method of ['tasks/get', 'tasks/update', 'tasks/cancel']) {
      const gated = await rpc(method, { taskId: 'x', inputResponses: {} });
      expect(gated.body['error']?.code).toBe(-32021);
    }
  });

  it('answers HTTP 404 with -32601 to the methods the revision and the extension removed, and to unknown ones (§16.2)', async () => {
    const removed = ['initialize', 'ping', 'logging/setLevel', 'resources/subscribe', 'resources/unsubscribe'];
    for (const method of [...removed, 'tasks/result', 'tasks/list', 'no/such-method']) {
      const answer = await rpc(method, { taskId: 'x' }, { ext: true });
      expect([method, answer.status, answer.body['error']?.code]).toEqual([method, 404, -32601]);
      expect(answer.body['id']).toBe(lastId);
    }
  });

  it('answers -32021 naming the capability, with HTTP 400, when a tool asks what the client did not declare', async () => {
    const refused = await rpc('tools/call', { name: 'needs_sampling', arguments: {} });
    expect(refused.status).toBe(400);
    expect(refused.body['error']).toMatchObject({ code: -32021, data: { requiredCapabilities: { sampling: {} } } });
  });

  it('checks the routing headers against the body (-32020, HTTP 400), trimming whitespace', async () => {
    const mismatch = await rpc('tools/list', {}, { headers: { 'mcp-method': 'prompts/list' } });
    expect([mismatch.status, mismatch.body['error']?.code]).toEqual([400, -32020]);
    const missing = await rpc('tools/list', {}, { headers: { 'mcp-method': undefined } });
    expect([missing.status, missing.body['error']?.code]).toEqual([400, -32020]);
    const noName = await rpc(
      'tools/call',
      { name: 'sleepy', arguments: { ms: 1 } },
      { headers: { 'mcp-name': undefined } },
    );
    expect([noName.status, noName.body['error']?.code]).toEqual([400, -32020]);
    const wrongName = await rpc(
      'tools/call',
      { name: 'sleepy', arguments: { ms: 1 } },
      { headers: { 'mcp-name': 'echo' } },
    );
    expect([wrongName.status, wrongName.body['error']?.code]).toEqual([400, -32020]);
    const padded = await rpc(
      'tools/call',
      { name: 'sleepy', arguments: { ms: 1 } },
      { headers: { 'mcp-name': '  sleepy  ' } },
    );
    expect(padded.body['result']).toMatchObject({ resultType: 'complete' });
  });

  it('refuses a request without the per-request _meta, or for a version it does not speak', async () => {
    const noMeta = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'mcp-protocol-version': V, 'mcp-method': 'tools/list' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    });
    expect(noMeta.status).toBe(400);
    expect(((await noMeta.json()) as Json)['error']).toMatchObject({ code: -32602, message: /missing _meta keys/ });
    const future = await rpc('tools/list', {}, { headers: { 'mcp-protocol-version': '2099-01-01' } });
    expect([future.status, future.body['error']?.code]).toEqual([400, -32022]);
    // The versions it lists are the ones server/discover lists, and the requested one is echoed.
    const { supportedVersions } = await result('server/discover');
    expect(future.body['error']?.data).toEqual({ supported: supportedVersions, requested: '2099-01-01' });
  });

  it('answers GET and DELETE with 405 on this transport, and a GET before initialize too', async () => {
    for (const method of ['GET', 'DELETE']) {
      const res = await fetch(stack.gateway.url, { method, headers: { 'mcp-protocol-version': V } });
      expect(res.status).toBe(405);
      expect(res.headers.get('allow')).toBe('POST');
      await res.body?.cancel();
    }
    const early = await fetch(stack.gateway.url, { method: 'GET', headers: { accept: 'text/event-stream' } });
    expect(early.status).toBe(405);
    await early.body?.cancel();
  });

  it('cancels a plain call whose response stream the client closes (MUST on this transport)', async () => {
    const before = await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', { trigger: 'stream-closed' });
    const controller = new AbortController();
    const res = await post(
      'tools/call',
      { name: 'sleepy', arguments: { ms: 30_000, stepMs: 50 } },
      { meta: { progressToken: 'p' }, signal: controller.signal },
    );
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    for await (const event of readSse(res)) {
      if ((event.data as Json)['method'] === 'notifications/progress') break;
    }
    controller.abort();
    await waitFor(
      async () =>
        (await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', { trigger: 'stream-closed' })) ===
        before + 1,
      { message: 'closing the stream did not cancel the call' },
    );
  });

  it('does not cancel a task when the stream of the tools/call that made it closes', async () => {
    const key = `k-${Date.now()}`;
    const call = { name: 'sleepy', arguments: { ms: 300, stepMs: 50 } };
    const meta = { 'dev.taskrelay/idempotency-key': key };
    const created = () =>
      readMetric(stack.gateway.url, 'taskrelay_tasks_created_total', { tool: 'sleepy', mode: 'task' });
    const before = await created();
    await sendAndHangUp('tools/call', call, { ext: true, meta });
    // The call must have reached the gateway and made its task, or this test proves nothing.
    await waitFor(async () => (await created()) === before + 1, { message: 'the hung-up tools/call made no task' });
    // The same idempotency key names that task: no second one is made.
    const again = await result('tools/call', call, { ext: true, meta });
    expect(await created()).toBe(before + 1);
    await until(String(again['taskId']), 'completed');
  });

  it('streams notifications/tasks on subscriptions/listen until the tasks end, acknowledging only known ones', async () => {
    const caps = { 'io.modelcontextprotocol/clientCapabilities': { elicitation: {}, extensions: { [EXT]: {} } } };
    const created = await result(
      'tools/call',
      { name: 'wait_for_approval', arguments: { question: 'Go?' } },
      {
        ext: true,
        meta: caps,
      },
    );
    const taskId = String(created['taskId']);
    const res = await post(
      'subscriptions/listen',
      { notifications: { taskIds: [taskId, '0'.repeat(32)] } },
      { ext: true },
    );
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const messages: Json[] = [];
    let answered = false;
    for await (const event of readSse(res)) {
      const message = event.data as Json;
      messages.push(message);
      const params = message['params'] as Json | undefined;
      // The task waits for its answer until we give it: the stream must report that, then the end.
      if (!answered && message['method'] === 'notifications/tasks' && params?.['status'] === 'input_required') {
        answered = true;
        await result(
          'tasks/update',
          { taskId, inputResponses: { '1': { action: 'accept', content: { approved: true } } } },
          {
            ext: true,
          },
        );
      }
    }
    const [ack, ...rest] = messages;
    expect(ack).toMatchObject({
      method: 'notifications/subscriptions/acknowledged',
      params: { notifications: { taskIds: [taskId] } },
    });
    const statuses = rest
      .filter((m) => m['method'] === 'notifications/tasks')
      .map((m) => (m['params'] as Json)['status'] as string);
    expect(answered).toBe(true);
    expect(statuses).toContain('input_required');
    expect(statuses.at(-1)).toBe('completed');
    const last = rest.filter((m) => m['method'] === 'notifications/tasks').at(-1)?.['params'] as Json;
    expect(last).toMatchObject({ taskId, result: { structuredContent: { approved: true } } });
    // The stream ends with the listen request's own result.
    expect(rest.at(-1)).toMatchObject({ result: { resultType: 'complete' } });
  });

  it('acknowledges toolsListChanged first, tags every frame, and pushes tools/list_changed when the tools change (§18)', async () => {
    const res = await post('subscriptions/listen', { notifications: { toolsListChanged: true } });
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const id = lastId;
    const frames: Json[] = [];
    let extraWorker = false;
    for await (const event of readSse(res)) {
      const message = event.data as Json;
      frames.push(message);
      if (message['method'] === 'notifications/subscriptions/acknowledged' && !extraWorker) {
        extraWorker = true;
        // A worker with other tools joins: the catalog changes.
        await stack.addWorker({ TASKRELAY_TOOLS: CONFORMANCE_TOOLS, TASKRELAY_QUEUE: 'conformance' });
      }
      if (message['method'] === 'notifications/tools/list_changed') break;
    }
    expect(frames[0]).toMatchObject({
      method: 'notifications/subscriptions/acknowledged',
      params: { notifications: { toolsListChanged: true } },
    });
    expect(frames.at(-1)?.['method']).toBe('notifications/tools/list_changed');
    for (const frame of frames) expect(frame['params']?._meta?.['io.modelcontextprotocol/subscriptionId']).toBe(id);
    const listed = await result('tools/list');
    expect((listed['tools'] as Json[]).map((t) => t['name'])).toContain('test_simple_text');
  });

  it('refuses a subscriptions/listen with nothing it can notify (-32602)', async () => {
    const nothing = await rpc('subscriptions/listen', { notifications: { promptsListChanged: true } });
    expect(nothing.body['error']?.code).toBe(-32602);
  });

  it('shows the same task to a 2025-11-25 session of the same principal', async () => {
    const created = await result('tools/call', { name: 'sleepy', arguments: { ms: 20 } }, { ext: true });
    const taskId = String(created['taskId']);
    await until(taskId, 'completed');
    const session = await RawSession.open(stack.gateway.url);
    const v1 = await session.request('tasks/get', { taskId });
    expect(v1.result).toMatchObject({ taskId, status: 'completed' });
    await session.close();
  });
});

describe('§14 2025-11-25 semantics kept', () => {
  it('does not cancel a plain call whose stream closes; Last-Event-ID resumption still delivers the result', async () => {
    const before = await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', { trigger: 'stream-closed' });
    const session = await RawSession.open(stack.gateway.url);
    const controller = new AbortController();
    const res = await session.post(
      {
        jsonrpc: '2.0',
        id: 41,
        method: 'tools/call',
        params: { name: 'sleepy', arguments: { ms: 800, stepMs: 50 }, _meta: { progressToken: 'p41' } },
      },
      controller.signal,
    );
    let lastEventId: string | undefined;
    for await (const event of readSse(res)) {
      if (event.id !== undefined) lastEventId = event.id;
      if ((event.data as Json)['method'] === 'notifications/progress') break;
    }
    controller.abort();
    expect(lastEventId).toBeDefined();
    // Resume once the gateway has seen the POST stream close (before that, the SDK answers 409 to a resumption).
    await waitFor(async () => (await readMetric(stack.gateway.url, 'taskrelay_requests_in_flight')) === 0, {
      message: 'the gateway did not see the stream close',
    });
    const resumed = session.openGetStream(lastEventId);
    const response = await waitFor(() => resumed.events.map((e) => e.data as Json).find((m) => m['id'] === 41), {
      timeoutMs: 10_000,
      message: 'no result on the resumed stream',
    });
    resumed.close();
    expect(response['result']).toMatchObject({ structuredContent: { ms: 800 } });
    expect(await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', { trigger: 'stream-closed' })).toBe(
      before,
    );
    await session.close();
  });
});

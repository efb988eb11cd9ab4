/**
 * docs/CONFIGURATION.md, docs/HTTP.md, docs/MCP.md and the MCP tasks specification, security considerations against live gateways, as an attacker would try them: transport checks (Host,
 * Content-Type, Accept, MCP-Protocol-Version, sessions, Last-Event-ID), errors that reveal nothing, the body limits,
 * the per-principal limits, ops endpoints behind auth and task ownership on every route.
 */
import { request as httpRequest } from 'node:http';
import { beforeAll, describe, expect, it } from 'vitest';
import { uniquePrefix } from './helpers/redis.js';
import { RawSession, initSession, readSse } from './helpers/raw-mcp.js';
import { spawnNode, GATEWAY_MAIN, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';

let open: GatewayProcess;
let authed: GatewayProcess;

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
const TOKENS = Object.fromEntries(
  ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'gina', 'hank', 'ivy', 'olga', 'sam', 'mallory'].map((p) => [
    p,
    `${p}-token`,
  ]),
);
const bearer = (principal: string) => ({ authorization: `Bearer ${principal}-token` });
const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'sec', version: '0' } },
};

/** Two deployments on one Redis: one with authentication and tight limits (the stack's prefix), one open. */
const OPEN = { TASKRELAY_PREFIX: uniquePrefix('sec-open') };
const stack = useStack({
  name: 'sec-auth',
  tokens: TOKENS,
  gateways: [
    {
      TASKRELAY_OPERATORS: 'olga',
      TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL: '3',
      TASKRELAY_MAX_OPEN_TASKS: '2',
      TASKRELAY_RATE_LIMIT_TASK_OPS: '20',
      TASKRELAY_MAX_ARGUMENT_BYTES: '1024',
      TASKRELAY_MAX_PROGRESS_TOKEN_BYTES: '64',
      TASKRELAY_MAX_RESULT_BYTES: '1500',
    },
    {
      ...OPEN,
      // The open deployment: without the stack's tokens.
      TASKRELAY_AUTH_TOKENS: undefined,
      TASKRELAY_MAX_BODY_BYTES: '65536',
      TASKRELAY_MAX_JSON_DEPTH: '32',
      TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL: '1000',
    },
  ],
  workers: [{}, OPEN],
});

beforeAll(() => {
  [authed, open] = stack.gateways as [GatewayProcess, GatewayProcess];
});

/** An MCP session over raw HTTP, for a principal (or none), with the headers each request carries. */
async function session(gw: GatewayProcess, principal?: string) {
  const auth = principal ? bearer(principal) : {};
  const { sessionId, headers } = await initSession(gw.url, auth, 'sec');
  let nextId = 1;
  return {
    sessionId,
    headers,
    /** One JSON-RPC request; the answer whether it came as JSON or SSE, with the HTTP status. */
    async call(method: string, params: unknown, extra: Record<string, string> = {}) {
      const id = nextId++;
      const r = await fetch(gw.url, {
        method: 'POST',
        headers: { ...headers, ...extra },
        body: JSON.stringify({ jsonrpc: '2.0', id, method, params }),
      });
      return { status: r.status, headers: r.headers, body: await jsonRpcBody(r, id) };
    },
  };
}

type RpcBody = { result?: any; error?: { code: number; message: string; data?: unknown } };

async function jsonRpcBody(res: Response, id: number): Promise<RpcBody> {
  const text = await res.text();
  if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
    for (const block of text.split('\n\n')) {
      const data = block
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trim())
        .join('');
      if (!data) continue;
      const msg = JSON.parse(data) as RpcBody & { id?: unknown };
      if (msg.id === id) return msg;
    }
    throw new Error(`no answer to request ${id} in ${text}`);
  }
  return JSON.parse(text) as RpcBody;
}

const startTask = (s: Awaited<ReturnType<typeof session>>, args: Record<string, unknown>) =>
  s.call('tools/call', { name: 'build_report', arguments: { report: 'r', ...args }, task: { ttl: 60_000 } });

/** A raw HTTP request, so Host and Transfer-Encoding are ours to choose (fetch sets Host itself). */
function rawRequest(
  port: number,
  options: { method: string; path: string; headers: Record<string, string>; chunks?: string[] },
): Promise<{ status: number; body: string; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: '127.0.0.1', port, method: options.method, path: options.path, headers: options.headers },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
      },
    );
    req.on('error', reject);
    for (const chunk of options.chunks ?? []) req.write(chunk);
    req.end();
  });
}

describe('transport checks (docs/HTTP.md)', () => {
  it('answers a POST with a non-JSON Content-Type 415 with a JSON-RPC error, with or without a session', async () => {
    const s = await session(open);
    for (const headers of [
      { ...s.headers, 'content-type': 'text/plain' },
      { ...JSON_HEADERS, 'content-type': 'application/x-www-form-urlencoded' },
      { accept: JSON_HEADERS.accept },
    ] as Array<Record<string, string>>) {
      const res = await fetch(open.url, { method: 'POST', headers, body: JSON.stringify(INIT) });
      expect(res.status).toBe(415);
      const body = (await res.json()) as RpcBody;
      expect(body.error?.message).toMatch(/Content-Type must be application\/json/);
    }
  });

  it('answers a POST that does not accept SSE and JSON 406 with a JSON-RPC error', async () => {
    const s = await session(open);
    const res = await fetch(open.url, {
      method: 'POST',
      headers: { ...s.headers, accept: 'text/html' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(res.status).toBe(406);
    expect(((await res.json()) as RpcBody).error?.message).toMatch(/Not Acceptable/);
  });

  it('refuses a foreign Host (DNS rebinding) with 403 on /mcp and /metrics, but keeps the probes open', async () => {
    const body = JSON.stringify(INIT);
    const foreign = await rawRequest(open.port, {
      method: 'POST',
      path: '/mcp',
      headers: { ...JSON_HEADERS, host: `evil.example:${open.port}`, 'content-length': String(body.length) },
      chunks: [body],
    });
    expect(foreign.status).toBe(403);
    expect(JSON.parse(foreign.body).error.message).toMatch(/Host/);
    expect(
      (await rawRequest(open.port, { method: 'GET', path: '/metrics', headers: { host: 'evil.example' } })).status,
    ).toBe(403);
    for (const host of [`localhost:${open.port}`, `127.0.0.1:${open.port}`]) {
      const ok = await rawRequest(open.port, {
        method: 'POST',
        path: '/mcp',
        headers: { ...JSON_HEADERS, host, 'content-length': String(body.length) },
        chunks: [body],
      });
      expect(ok.status).toBe(200);
    }
    for (const path of ['/healthz', '/readyz']) {
      expect((await rawRequest(open.port, { method: 'GET', path, headers: { host: '10.1.2.3:8080' } })).status).toBe(
        200,
      );
    }
  });

  it('answers an unsupported MCP-Protocol-Version 400 and an unknown session 404', async () => {
    const s = await session(open);
    const bad = await s.call('tools/list', {}, { 'mcp-protocol-version': '1999-01-01' });
    expect(bad.status).toBe(400);
    expect(bad.body.error?.message).toMatch(/Unsupported protocol version/);
    const unknown = await fetch(open.url, {
      method: 'POST',
      headers: { ...s.headers, 'mcp-session-id': 'b5c0a8e2-0000-4000-8000-000000000000' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(unknown.status).toBe(404);
  });

  it('answers a malformed Last-Event-ID with a 4xx, never a 500', async () => {
    const s = await session(open);
    for (const lastEventId of ['garbage', '_GET_stream ffff.1', 'x'.repeat(4000), '1.1', '__proto__']) {
      const res = await fetch(open.url, {
        method: 'GET',
        headers: { ...s.headers, accept: 'text/event-stream', 'last-event-id': lastEventId },
      });
      await res.body?.cancel();
      expect(res.status, lastEventId).toBeGreaterThanOrEqual(400);
      expect(res.status, lastEventId).toBeLessThan(500);
    }
  });

  it('answers a batch containing null, or an empty batch, with a JSON-RPC error, never a 500', async () => {
    const s = await session(open);
    for (const body of [[null], [{ jsonrpc: '2.0', id: 1, method: 'tools/list' }, null], [], null, 7, 'x']) {
      const res = await fetch(open.url, { method: 'POST', headers: s.headers, body: JSON.stringify(body) });
      expect(res.status, JSON.stringify(body)).toBeGreaterThanOrEqual(400);
      expect(res.status, JSON.stringify(body)).toBeLessThan(500);
      expect(((await res.json()) as RpcBody).error?.code).toBeTypeOf('number');
    }
  });
});

describe('errors that reveal nothing', () => {
  it('answers params of the wrong type with -32602 naming the field, not zod’s issue list', async () => {
    const s = await session(open);
    const { body } = await s.call('tasks/get', { taskId: 5 });
    expect(body.error?.code).toBe(-32602);
    expect(body.error?.message).toMatch(/^Invalid params: taskId: /);
    expect(body.error?.message).not.toMatch(/"code"|\[|invalid_type/);
  });

  it('answers a Redis failure with a stable message and keeps the Redis reply out of it', async () => {
    // The principal's task index is now a string: every list of it fails inside Redis with WRONGTYPE.
    await stack.r.set(`${stack.prefix}:principal:frank:tasks`, 'not a sorted set');
    const s = await session(authed, 'frank');
    const { body } = await s.call('tasks/list', {});
    expect(body.error?.code).toBe(-32603);
    expect(body.error?.message).toBe('Internal error');
    expect(JSON.stringify(body)).not.toMatch(/WRONGTYPE|ioredis|redis/i);
  });
});

describe('body limits', () => {
  it('answers a body over TASKRELAY_MAX_BODY_BYTES 413, chunked or not', async () => {
    const s = await session(open);
    const big = JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'tools/call',
      params: { name: 'build_report', arguments: { report: 'x'.repeat(70_000), items: 1 } },
    });
    const plain = await fetch(open.url, { method: 'POST', headers: s.headers, body: big });
    expect(plain.status).toBe(413);
    expect(((await plain.json()) as RpcBody).error?.message).toMatch(/larger than 65536 bytes/);
    const chunks = Array.from({ length: 20 }, () => 'x'.repeat(4096));
    const chunked = await rawRequest(open.port, {
      method: 'POST',
      path: '/mcp',
      headers: { ...s.headers, host: `127.0.0.1:${open.port}`, 'transfer-encoding': 'chunked' },
      chunks: ['{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"', ...chunks, '"}}'],
    });
    expect(chunked.status).toBe(413);
  });

  it('answers JSON nested deeper than TASKRELAY_MAX_JSON_DEPTH 400 before parsing it', async () => {
    const s = await session(open);
    const deep = `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":${'['.repeat(40)}${']'.repeat(40)}}}`;
    const res = await fetch(open.url, { method: 'POST', headers: s.headers, body: deep });
    expect(res.status).toBe(400);
    expect(((await res.json()) as RpcBody).error?.message).toMatch(/nested deeper than 32/);
    // Brackets inside strings are text, not nesting.
    const inString = JSON.stringify({
      jsonrpc: '2.0',
      id: 2,
      method: 'ping',
      params: { _meta: { s: '['.repeat(100) } },
    });
    expect((await fetch(open.url, { method: 'POST', headers: s.headers, body: inString })).status).toBe(200);
  });
});

describe('per-principal limits', () => {
  it('caps the sessions one principal holds, and frees a place when one closes', async () => {
    const sessions = [await session(authed, 'erin'), await session(authed, 'erin'), await session(authed, 'erin')];
    const fourth = await fetch(authed.url, {
      method: 'POST',
      headers: { ...JSON_HEADERS, ...bearer('erin') },
      body: JSON.stringify(INIT),
    });
    expect(fourth.status).toBe(429);
    expect(((await fourth.json()) as RpcBody).error?.message).toMatch(/Too many open sessions/);
    // Another principal is not affected.
    await session(authed, 'bob');
    const closed = await fetch(authed.url, { method: 'DELETE', headers: sessions[0]!.headers });
    expect(closed.status).toBe(200);
    await session(authed, 'erin');
  });

  it('rate-limits task operations per principal with 429 and Retry-After', async () => {
    const s = await session(authed, 'carol');
    const other = await session(authed, 'alice');
    const statuses: number[] = [];
    let limited: Awaited<ReturnType<typeof s.call>> | undefined;
    for (let i = 0; i < 25 && !limited; i++) {
      const r = await s.call('tasks/get', { taskId: `nope-${i}` });
      statuses.push(r.status);
      if (r.status === 429) limited = r;
    }
    expect(limited, statuses.join(',')).toBeDefined();
    expect(Number(limited?.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(limited?.body.error?.message).toMatch(/rate limit/);
    // Only carol is limited.
    expect((await other.call('tasks/get', { taskId: 'nope' })).body.error?.code).toBe(-32602);
  });

  it('caps a principal’s unfinished tasks, and takes new ones once one ends', async () => {
    const s = await session(authed, 'dave');
    const a = await startTask(s, { items: 1000, delayMs: 100 });
    const b = await startTask(s, { items: 1000, delayMs: 100 });
    expect(a.body.result?.task.status).toBe('working');
    expect(b.body.result?.task.status).toBe('working');
    const third = await startTask(s, { items: 1 });
    expect(third.body.error?.message).toMatch(/Too many open tasks/);
    expect((await s.call('tasks/cancel', { taskId: a.body.result.task.taskId })).body.result?.status).toBe('cancelled');
    const fourth = await startTask(s, { items: 1 });
    expect(fourth.body.result?.task.taskId).toBeTypeOf('string');
    await s.call('tasks/cancel', { taskId: b.body.result.task.taskId });
  });

  it('refuses arguments over TASKRELAY_MAX_ARGUMENT_BYTES and progress tokens over their cap', async () => {
    const s = await session(authed, 'alice');
    const big = await s.call('tools/call', { name: 'build_report', arguments: { report: 'x'.repeat(2000), items: 1 } });
    expect(big.status).toBe(413);
    expect(big.body.error?.message).toMatch(/arguments are larger than 1024 bytes/);
    const token = await s.call('tools/call', {
      name: 'build_report',
      arguments: { report: 'r', items: 1 },
      _meta: { progressToken: 't'.repeat(100) },
    });
    expect(token.status).toBe(400);
    expect(token.body.error?.message).toMatch(/progressToken is longer than 64 bytes/);
  });

  it('answers a result over TASKRELAY_MAX_RESULT_BYTES with an error result, for plain calls and tasks/result', async () => {
    const s = await session(authed, 'gina');
    const small = await s.call('tools/call', {
      name: 'build_report',
      arguments: { report: 'r', items: 1, delayMs: 0 },
    });
    expect(small.body.result?.structuredContent).toEqual({ report: 'r', items: 1 });
    const args = { report: 'y'.repeat(900), items: 1, delayMs: 0 };
    const plain = await s.call('tools/call', { name: 'build_report', arguments: args });
    expect(plain.body.result?.isError).toBe(true);
    expect(plain.body.result?.content[0].text).toMatch(/larger than this gateway delivers \(1500 bytes\)/);
    const task = await startTask(s, args);
    const result = await s.call('tasks/result', { taskId: task.body.result.task.taskId });
    expect(result.body.result?.isError).toBe(true);
    expect(JSON.stringify(result.body)).not.toContain('y'.repeat(900));
  });
});

describe('ops endpoints and ownership with auth on', () => {
  it('needs a token for /metrics, not for /healthz and /readyz', async () => {
    const base = authed.url.replace(/\/mcp$/, '');
    const anonymous = await fetch(`${base}/metrics`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Bearer/);
    expect((await fetch(`${base}/metrics`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
    const withToken = await fetch(`${base}/metrics`, { headers: bearer('olga') });
    expect(withToken.status).toBe(200);
    expect(await withToken.text()).toMatch(/^# HELP taskrelay_/m);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect((await fetch(`${base}/readyz`)).status).toBe(200);
  });

  it('answers another principal’s running task exactly like an unknown one, on every route, without waiting on it', async () => {
    const owner = await session(authed, 'alice');
    const created = await startTask(owner, { items: 1000, delayMs: 50 });
    const taskId: string = created.body.result.task.taskId;
    const mallory = await session(authed, 'bob');
    const unknownId = `${taskId.slice(0, -4)}zzzz`;
    for (const method of ['tasks/get', 'tasks/result', 'tasks/cancel']) {
      const foreign = await mallory.call(method, { taskId });
      const unknown = await mallory.call(method, { taskId: unknownId });
      expect(foreign.body.error?.code, method).toBe(-32602);
      expect(foreign.body.error?.message.replace(taskId, 'ID'), method).toBe(
        unknown.body.error?.message.replace(unknownId, 'ID'),
      );
    }
    // tasks/result answered at once: the task is still running, untouched by anyone but its owner.
    expect((await owner.call('tasks/get', { taskId })).body.result?.status).toBe('working');
    const listed = await mallory.call('tasks/list', {});
    expect(listed.body.result.tasks.map((t: { taskId: string }) => t.taskId)).not.toContain(taskId);
    // The owner's session, and resuming its streams, is not reachable with another principal's token.
    const resumed = await fetch(authed.url, {
      method: 'GET',
      headers: { ...owner.headers, ...bearer('bob'), accept: 'text/event-stream', 'last-event-id': 'x' },
    });
    expect(resumed.status).toBe(404);
    await resumed.body?.cancel();
    await owner.call('tasks/cancel', { taskId });
  });
});

describe('ownership on the extension routes and the 2026-07-28 transport', () => {
  const EXT = 'io.modelcontextprotocol/tasks';
  const extMeta = { 'io.modelcontextprotocol/clientCapabilities': { elicitation: {}, extensions: { [EXT]: {} } } };

  /** One sessionless 2026-07-28 request as `principal`. */
  async function modern(principal: string, method: string, params: Record<string, unknown>): Promise<RpcBody> {
    const res = await fetch(authed.url, {
      method: 'POST',
      headers: {
        ...JSON_HEADERS,
        ...bearer(principal),
        'mcp-protocol-version': '2026-07-28',
        'mcp-method': method,
        'mcp-name': String(params['taskId'] ?? params['name'] ?? ''),
      },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method,
        params: {
          ...params,
          _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', ...extMeta },
        },
      }),
    });
    return (await res.json()) as RpcBody;
  }

  it('answers another principal exactly like an unknown task on tasks/get, tasks/update and tasks/cancel', async () => {
    const owner = await session(authed, 'ivy');
    const created = await owner.call('tools/call', {
      name: 'wait_for_approval',
      arguments: { question: 'Mine?' },
      _meta: extMeta,
    });
    const taskId: string = created.body.result.taskId;
    await waitFor(
      async () => (await owner.call('tasks/get', { taskId, _meta: extMeta })).body.result?.status === 'input_required',
      { message: 'the task never asked its question' },
    );
    const unknownId = `${taskId.slice(0, -4)}zzzz`;
    const hank = await session(authed, 'hank');
    const calls: Array<[string, Record<string, unknown>]> = [
      ['tasks/get', {}],
      ['tasks/update', { inputResponses: { '1': { action: 'accept', content: { approved: true } } } }],
      ['tasks/cancel', {}],
    ];
    for (const [method, extra] of calls) {
      const viaSession = await hank.call(method, { taskId, ...extra, _meta: extMeta });
      const unknownSession = await hank.call(method, { taskId: unknownId, ...extra, _meta: extMeta });
      const viaModern = await modern('hank', method, { taskId, ...extra });
      const unknownModern = await modern('hank', method, { taskId: unknownId, ...extra });
      for (const [foreign, unknown] of [
        [viaSession.body, unknownSession.body],
        [viaModern, unknownModern],
      ] as const) {
        expect(foreign.error?.code, method).toBe(-32602);
        expect(foreign.error?.message.replace(taskId, 'ID'), method).toBe(
          unknown.error?.message.replace(unknownId, 'ID'),
        );
      }
    }
    // Nothing reached the task: still waiting, no answer stored, not cancelled.
    const still = (await owner.call('tasks/get', { taskId, _meta: extMeta })).body.result;
    expect(still.status).toBe('input_required');
    expect(Object.keys(still.inputRequests)).toEqual(['1']);
    await owner.call('tasks/cancel', { taskId, _meta: extMeta });
  });
});

describe('operator pages (/admin, /metrics) with auth on: operators only', () => {
  it('answers every principal but an operator 403 on /metrics and every /admin route, bull-board API included', async () => {
    const base = authed.url.replace(/\/mcp$/, '');
    const owner = await session(authed, 'sam');
    const secret = 'sams-quarterly-numbers';
    const created = await startTask(owner, { report: secret, items: 1000, delayMs: 50 });
    const taskId: string = created.body.result.task.taskId;
    const paths = [
      '/metrics',
      '/admin/tasks',
      `/admin/tasks/${taskId}`,
      '/admin/api/overview',
      `/admin/api/tasks/${taskId}`,
      '/admin/queues',
      '/admin/queues/api/queues',
      '/admin/queues/api/redis/stats',
    ];
    for (const principal of ['mallory', 'alice']) {
      for (const path of paths) {
        const res = await fetch(`${base}${path}`, { headers: bearer(principal) });
        const body = await res.text();
        expect(res.status, `${principal} ${path}`).toBe(403);
        expect(JSON.parse(body), path).toMatchObject({ error: 'forbidden' });
        expect(body).not.toContain(secret);
        expect(body).not.toContain(owner.sessionId);
      }
    }
    // The operator sees it all, sam's task and its session included.
    const detail = await fetch(`${base}/admin/api/tasks/${taskId}`, { headers: bearer('olga') });
    expect(detail.status).toBe(200);
    expect(await detail.text()).toContain(owner.sessionId);
    for (const path of paths) {
      const res = await fetch(`${base}${path}`, { headers: bearer('olga') });
      await res.body?.cancel();
      expect(res.status, `olga ${path}`).toBe(200);
    }
    await owner.call('tasks/cancel', { taskId });
  });
});

describe('operator pages with auth off: the loopback rules of /mcp, a CSP, nothing from outside hosts', () => {
  it('refuses a foreign Origin on /metrics and /admin as on /mcp', async () => {
    const base = open.url.replace(/\/mcp$/, '');
    for (const path of ['/metrics', '/admin/tasks', '/admin/queues', '/admin/queues/api/redis/stats']) {
      const res = await fetch(`${base}${path}`, { headers: { origin: 'https://evil.example' } });
      await res.body?.cancel();
      expect(res.status, path).toBe(403);
    }
  });

  it('serves bull-board and the tasks page with a CSP that allows only this gateway, and links nothing outside', async () => {
    const base = open.url.replace(/\/mcp$/, '');
    for (const path of ['/admin/queues', '/admin/tasks']) {
      const res = await fetch(`${base}${path}`);
      expect(res.status, path).toBe(200);
      const csp = res.headers.get('content-security-policy') ?? '';
      expect(csp, path).toMatch(/default-src 'self'/);
      expect(csp, path).toMatch(/frame-ancestors 'none'/);
      expect(csp, path).not.toMatch(/https?:/);
      const html = await res.text();
      // No stylesheet, font, script or image from another host (bull-board's template links Google Fonts).
      expect(html, path).not.toMatch(/(?:href|src)="(?:https?:)?\/\//i);
    }
  });
});

describe('texts a caller passes through progress (PROTOCOL.md §22.4)', () => {
  it('delivers every progress update of a report whose name holds lone surrogates, with U+FFFD in their place', async () => {
    const s = await RawSession.open(open.url);
    const items = 3;
    const res = await s.post({
      jsonrpc: '2.0',
      id: 9,
      method: 'tools/call',
      params: {
        name: 'build_report',
        arguments: { report: 'half \uD800 pair \uDC00!', items, delayMs: 120 },
        _meta: { progressToken: 'lone' },
      },
    });
    const progress: Array<{ progress: number; message?: string }> = [];
    for await (const event of readSse(res)) {
      const msg = event.data as { id?: number; method?: string; params?: { progress: number; message?: string } };
      if (msg.method === 'notifications/progress' && msg.params) progress.push(msg.params);
      if (msg.id === 9) break;
    }
    expect(progress.map((p) => p.progress)).toEqual([1, 2, 3]);
    for (const p of progress) expect(p.message).toContain('half \uFFFD pair \uFFFD!');
  });
});

describe('the same JSON-RPC id twice on one session', () => {
  it('refuses a second request whose id is still in flight, and still answers the first', async () => {
    const s = await RawSession.open(open.url);
    const call = (id: number) =>
      s.post({
        jsonrpc: '2.0',
        id,
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: `dup-${id}`, items: 4, delayMs: 100 } },
      });
    const first = await call(5);
    expect(first.status).toBe(200);
    const second = await call(5);
    expect(second.status).toBe(400);
    const refused = (await second.json()) as { id?: number; error?: { code: number; message: string } };
    expect(refused.id).toBe(5);
    expect(refused.error?.message).toMatch(/already in flight/);
    let answer: { id?: number; result?: { structuredContent?: { report: string } } } | undefined;
    for await (const event of readSse(first)) {
      const msg = event.data as typeof answer;
      if (msg?.id === 5) {
        answer = msg;
        break;
      }
    }
    expect(answer?.result?.structuredContent?.report).toBe('dup-5');
    // Once answered, the id may be used again.
    const again = await s.post({ jsonrpc: '2.0', id: 5, method: 'ping' });
    expect(again.status).toBe(200);
    expect(await again.json()).toMatchObject({ id: 5, result: {} });
  });
});

describe('a resume right after a drop', () => {
  it('takes over a stream whose old connection the gateway still holds, at once (no 409), and the result comes there', async () => {
    const s = await RawSession.open(open.url);
    const first = await s.post({
      jsonrpc: '2.0',
      id: 21,
      method: 'tools/call',
      params: {
        name: 'build_report',
        arguments: { report: 'resume', items: 4, delayMs: 150 },
        _meta: { progressToken: 'resume' },
      },
    });
    // Read up to the first progress event's id, and keep the connection open (no cancel of the body).
    const reader = first.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    let lastEventId: string | undefined;
    while (lastEventId === undefined) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      lastEventId = /event: message\nid: ([^\n]+)\n/.exec(text)?.[1];
    }
    expect(lastEventId).toBeDefined();
    // The first connection is still open: to this gateway the stream has not dropped yet.
    const resumed = s.openGetStream(lastEventId);
    const answer = await waitFor(() => resumed.events.find((e) => (e.data as { id?: number }).id === 21), {
      timeoutMs: 15_000,
      message: 'no result on the resumed stream',
    });
    expect((answer.data as { result?: { structuredContent?: unknown } }).result?.structuredContent).toEqual({
      report: 'resume',
      items: 4,
    });
    resumed.close();
    await reader.cancel();
  });
});

describe('every method and path under /mcp answers JSON', () => {
  it('answers PUT, PATCH, OPTIONS and unknown paths under /mcp with a JSON-RPC error, never HTML or text/plain', async () => {
    for (const [method, path] of [
      ['PUT', '/mcp'],
      ['PATCH', '/mcp'],
      ['OPTIONS', '/mcp'],
      ['HEAD', '/mcp/x'],
      ['GET', '/mcp/x'],
      ['POST', '/mcp/x/y'],
      ['DELETE', '/mcp/..%2f'],
    ] as const) {
      const res = await rawRequest(open.port, {
        method,
        path,
        headers: { host: `127.0.0.1:${open.port}`, ...JSON_HEADERS, 'content-length': '2' },
        chunks: ['{}'],
      });
      expect(res.status, `${method} ${path}`).toBeGreaterThanOrEqual(400);
      expect(res.status, `${method} ${path}`).toBeLessThan(500);
      expect(String(res.headers['content-type']), `${method} ${path}`).toMatch(/^application\/json/);
      if (method !== 'HEAD') {
        expect(JSON.parse(res.body), `${method} ${path}`).toMatchObject({ jsonrpc: '2.0', error: { code: -32000 } });
      }
    }
  });
});

describe('unauthenticated mode', () => {
  it('refuses to serve a non-loopback address without authentication unless told to', async () => {
    const proc = spawnNode(GATEWAY_MAIN, { REDIS_URL: stack.redis.url, HOST: '0.0.0.0', PORT: '0' });
    const code = await proc.exited;
    expect(code).toBe(1);
    expect(proc.output().trim()).toMatch(
      /^taskrelay-gateway: Invalid configuration: HOST 0\.0\.0\.0 is not a loopback/,
    );
    expect(proc.output().trim().split('\n')).toHaveLength(1);
  });

  it('keeps working for a raw client on loopback (the default)', async () => {
    const s = await RawSession.open(open.url);
    const answer = await s.request('tools/list', {});
    expect(answer.result?.tools.length).toBeGreaterThan(0);
    await waitFor(async () => (await s.close()) === 200, { timeoutMs: 5_000 });
  });
});

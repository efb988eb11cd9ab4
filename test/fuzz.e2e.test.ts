/**
 * Hostile input against live gateways (one with static-token auth, one without): fast-check generates thousands of
 * mutated JSON-RPC requests, headers and bodies. Nothing may answer 5xx, hang, or crash the process, and afterwards
 * every task the run created is still consistent: readable by its owner with a valid status, unknown to anyone else.
 *
 * Both transports (2025-11-25 sessions and the sessionless 2026-07-28 endpoint) and bodies in any declared charset
 * (PROTOCOL.md §22.3: only UTF-8 is read; a body whose bytes would hide its depth from the raw-byte check is refused).
 *
 * CI mode: TASKRELAY_FUZZ_RUNS requests (default 3000, about 10 s). Long mode for local runs: TASKRELAY_FUZZ_RUNS=50000.
 */
import { request as httpRequest } from 'node:http';
import { beforeAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { uniquePrefix } from './helpers/redis.js';
import type { GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';

const RUNS = Number(process.env['TASKRELAY_FUZZ_RUNS'] ?? 3000);
/** Longer than any request the generators can make legitimately slow (plain calls are bounded to a few ms of work). */
const REQUEST_TIMEOUT_MS = 15_000;

/** Two deployments on one Redis: one with authentication (the stack's prefix), one open (a prefix of its own). */
const OPEN = { TASKRELAY_PREFIX: uniquePrefix('fuzz-open') };
const stack = useStack({
  name: 'fuzz-auth',
  tokens: { alice: 'alice-token', bob: 'bob-token' },
  gateways: [{ LOG_LEVEL: 'warn' }],
  workers: [{}, OPEN],
});
let authed: GatewayProcess;
let open: GatewayProcess;
const sessions: Record<string, string> = {};
const created: Array<{ taskId: string; principal: 'alice' | 'bob'; expiresAt: number }> = [];

const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'fuzz', version: '0' } },
};

interface Answer {
  status: number;
  contentType: string;
  body: string;
}

/** One raw HTTP exchange (Host, Transfer-Encoding and bytes are ours); GET streams are closed once headers arrive. */
function exchange(
  port: number,
  method: string,
  headers: Record<string, string>,
  body: string | Buffer | undefined,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, method, path: '/mcp', headers }, (res) => {
      const contentType = String(res.headers['content-type'] ?? '');
      const status = res.statusCode ?? 0;
      if (method === 'GET' && contentType.includes('text/event-stream')) {
        res.destroy();
        resolve({ status, contentType, body: '' });
        return;
      }
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status, contentType, body: text }));
      res.on('error', reject);
    });
    req.setTimeout(REQUEST_TIMEOUT_MS, () => req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)));
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

async function openSession(gw: GatewayProcess, token?: string): Promise<string> {
  const res = await fetch(gw.url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: JSON.stringify(INIT),
  });
  await res.text();
  const id = res.headers.get('mcp-session-id');
  if (!id) throw new Error(`initialize answered ${res.status}`);
  return id;
}

async function reopenSessions(): Promise<void> {
  sessions['alice'] = await openSession(authed, 'alice-token');
  sessions['bob'] = await openSession(authed, 'bob-token');
  sessions['anon'] = await openSession(open);
}

beforeAll(async () => {
  authed = stack.gateway;
  // Without the stack's tokens: the open deployment.
  open = await stack.addGateway({ ...OPEN, TASKRELAY_AUTH_TOKENS: undefined, LOG_LEVEL: 'warn' });
  await reopenSessions();
});

const METHODS = [
  'initialize',
  'ping',
  'tools/list',
  'tools/call',
  'tasks/get',
  'tasks/result',
  'tasks/list',
  'tasks/cancel',
  'tasks/update',
  'notifications/initialized',
  'notifications/cancelled',
  'notifications/progress',
  'resources/list',
  'resources/read',
  'resources/subscribe',
  'resources/templates/list',
  'prompts/get',
  'completion/complete',
  'logging/setLevel',
  '',
  '__proto__',
  'constructor',
];

/** `KNOWN` becomes the newest task the run created (either principal's): owners and strangers both ask for it. */
const taskIds = fc.oneof(fc.constantFrom(...['nope', '', '../../etc', '*', '\u0000']), fc.string(), {
  weight: 3,
  arbitrary: fc.constant('KNOWN'),
});

/** tools/call arguments that either fail validation or finish within milliseconds (no legitimately slow call). */
const toolCall = fc.oneof(
  fc.record({
    name: fc.constantFrom('build_report', 'fail_after', 'wait_for_approval', 'nope', ''),
    arguments: fc.oneof(fc.jsonValue(), fc.object()),
  }),
  fc.record({
    name: fc.constant('build_report'),
    arguments: fc.record({
      report: fc.string({ maxLength: 20 }),
      items: fc.integer({ min: 1, max: 3 }),
      delayMs: fc.integer({ min: 0, max: 5 }),
    }),
  }),
  fc.record({
    name: fc.constant('fail_after'),
    arguments: fc.record({ delayMs: fc.integer({ min: 0, max: 5 }), message: fc.string({ maxLength: 20 }) }),
  }),
);

/** A task call that should succeed (sometimes with an odd ttl, token or idempotency key). */
const taskCall = fc.record(
  {
    name: fc.constant('build_report'),
    arguments: fc.record({
      report: fc.string({ maxLength: 20 }),
      items: fc.integer({ min: 1, max: 3 }),
      delayMs: fc.integer({ min: 0, max: 5 }),
    }),
    task: fc.oneof(fc.constant({}), fc.record({ ttl: fc.oneof(fc.integer(), fc.double(), fc.jsonValue()) })),
    _meta: fc.record(
      {
        progressToken: fc.oneof(fc.string({ maxLength: 30 }), fc.integer()),
        'dev.taskrelay/idempotency-key': fc.string({ minLength: 1, maxLength: 10 }),
      },
      { requiredKeys: [] },
    ),
  },
  { requiredKeys: ['name', 'arguments', 'task'] },
);

const params = fc.oneof(
  fc.jsonValue(),
  toolCall,
  taskCall,
  taskCall,
  fc.record({ taskId: taskIds }),
  fc.record(
    {
      // Not wait_for_approval: its task waits for an answer forever, and a tasks/result on it rightly blocks.
      name: fc.constantFrom('build_report', 'fail_after'),
      arguments: fc.record({ report: fc.string(), items: fc.integer({ min: 1, max: 3 }) }),
      task: fc.oneof(fc.constant({}), fc.record({ ttl: fc.oneof(fc.integer(), fc.double(), fc.jsonValue()) })),
      _meta: fc.record(
        {
          progressToken: fc.oneof(fc.string(), fc.integer(), fc.jsonValue()),
          'dev.taskrelay/idempotency-key': fc.oneof(fc.string(), fc.jsonValue()),
        },
        { requiredKeys: [] },
      ),
    },
    { requiredKeys: ['name'] },
  ),
  fc.record({ cursor: fc.oneof(fc.string(), fc.jsonValue()) }),
);

const message = fc.oneof(
  {
    weight: 1,
    arbitrary: fc.record({
      jsonrpc: fc.constant('2.0'),
      id: fc.integer({ min: 1, max: 1_000_000 }),
      method: fc.constant('tools/call'),
      params: taskCall,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      jsonrpc: fc.constant('2.0'),
      id: fc.integer({ min: 1, max: 1_000_000 }),
      method: fc.constantFrom('tasks/get', 'tasks/result', 'tasks/cancel', 'tasks/list'),
      params: fc.record({ taskId: taskIds }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      jsonrpc: fc.constant('2.0'),
      id: fc.integer({ min: 1, max: 1_000_000 }),
      method: fc.constantFrom(...METHODS),
      params,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record(
      {
        jsonrpc: fc.oneof(fc.constant('2.0'), fc.jsonValue()),
        id: fc.oneof(fc.integer(), fc.string(), fc.constant(null), fc.jsonValue()),
        method: fc.oneof(fc.constantFrom(...METHODS), fc.string(), fc.jsonValue()),
        params,
      },
      { requiredKeys: [] },
    ),
  },
);

/** A 2026-07-28 request: the `_meta` every request of that revision carries, sometimes the tasks extension too. */
const sessionlessMessage = fc
  .record({
    method: fc.constantFrom('server/discover', 'tools/list', 'tools/call', 'tasks/get', 'tasks/cancel', 'ping', 'x'),
    params: fc.oneof(toolCall, fc.record({ taskId: taskIds }), fc.jsonValue()),
    ext: fc.boolean(),
  })
  .map(({ method, params: p, ext }) => ({
    jsonrpc: '2.0',
    id: 1,
    method,
    params: {
      ...(typeof p === 'object' && p !== null && !Array.isArray(p) ? p : {}),
      _meta: {
        'io.modelcontextprotocol/protocolVersion': '2026-07-28',
        'io.modelcontextprotocol/clientCapabilities': ext
          ? { extensions: { 'io.modelcontextprotocol/tasks': {} } }
          : {},
      },
    },
  }));

/** The JSON text of a body, or hostile bytes that are not JSON-RPC at all. */
const body = fc.oneof(
  { weight: 6, arbitrary: message.map((m) => JSON.stringify(m)) },
  { weight: 2, arbitrary: fc.array(fc.oneof(message, fc.jsonValue()), { maxLength: 4 }).map((b) => JSON.stringify(b)) },
  { weight: 1, arbitrary: fc.string() },
  { weight: 1, arbitrary: message.map((m) => JSON.stringify(m).slice(0, -3)) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 5000 }).map((n) => `${'['.repeat(n)}${']'.repeat(n)}`) },
  { weight: 1, arbitrary: fc.constantFrom('', 'null', '[null]', '[]', '{}', '"x"', '1e999', '{"__proto__":{"a":1}}') },
  { weight: 1, arbitrary: fc.integer({ min: 100, max: 100_000 }).map((n) => hiddenDepthBody(n)) },
  { weight: 2, arbitrary: sessionlessMessage.map((m) => JSON.stringify(m)) },
);

/**
 * A `tools/call` whose arguments nest `depth` arrays, after a string holding `∀`: in UTF-16 that character is the
 * bytes `00 22`, a quote to a scan of the raw bytes, so every bracket after it looks like string content.
 */
function hiddenDepthBody(depth: number, method = 'tools/call'): string {
  return JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method,
    params: { name: 'build_report', arguments: { report: '\u2200', items: 1, deep: 'DEEP' } },
  }).replace('"DEEP"', `${'['.repeat(depth)}${']'.repeat(depth)}`);
}

/** The bytes of `text` in `charset` (what a client declaring it would send). */
function encode(text: string, charset: string): Buffer {
  const name = charset.toLowerCase();
  if (name === 'utf-16le' || name === 'utf-16') return Buffer.from(text, 'utf16le');
  if (name === 'utf-16be') return Buffer.from(text, 'utf16le').swap16();
  if (name === 'latin1' || name === 'iso-8859-1') return Buffer.from(text, 'latin1');
  return Buffer.from(text, 'utf8');
}

/** The headers of the sessionless 2026-07-28 transport for `text` (its method and name mirrored, when it has them). */
function sessionlessHeaders(text: string): Record<string, string> {
  const headers: Record<string, string> = { 'mcp-protocol-version': '2026-07-28' };
  try {
    const parsed = JSON.parse(text) as { method?: unknown; params?: { name?: unknown; taskId?: unknown } };
    if (typeof parsed.method === 'string') headers['mcp-method'] = parsed.method.replace(/[^\x20-\x7e]/g, '');
    const name = parsed.params?.name ?? parsed.params?.taskId;
    if (typeof name === 'string') headers['mcp-name'] = name.replace(/[^\x20-\x7e]/g, '');
  } catch {
    // not JSON: no routing headers
  }
  return headers;
}

/** Mostly the valid value, so most requests get past the HTTP checks into the JSON-RPC layer; sometimes a bad one. */
const mostly = <T>(valid: T, ...bad: T[]) =>
  fc.oneof({ weight: 8, arbitrary: fc.constant(valid) }, { weight: 1, arbitrary: fc.constantFrom(...bad) });

const request = fc.record({
  target: fc.constantFrom('alice', 'alice', 'bob', 'anon', 'anon', 'none', 'wrong'),
  httpMethod: mostly('POST', 'GET', 'DELETE', 'PUT', 'PATCH'),
  session: mostly('own', 'other', 'garbage', 'none'),
  contentType: mostly(
    'application/json',
    'application/json; charset=utf-8',
    'application/json; charset=latin-9',
    'text/plain',
    'multipart/form-data',
    '',
  ),
  accept: mostly('application/json, text/event-stream', 'application/json', 'text/event-stream', '*/*', ''),
  protocolVersion: mostly('2025-11-25', '2025-06-18', '1999-01-01', '', 'x'.repeat(300)),
  host: mostly('127.0.0.1', 'localhost', 'evil.example', '127.0.0.1:1', ''),
  lastEventId: fc.option(fc.oneof(fc.string(), fc.constant('_GET_stream abc.1')), { nil: undefined, freq: 1 }),
  origin: fc.option(fc.constantFrom('http://localhost', 'https://evil.example', 'null'), { nil: undefined, freq: 1 }),
  /** The transport: a 2025-11-25 session, or the sessionless 2026-07-28 endpoint (its version and routing headers). */
  era: fc.constantFrom('session', 'session', 'sessionless'),
  /** The body's bytes and the charset declared for them (none: the content type as generated). */
  charset: fc.option(
    fc.constantFrom('utf-8', 'UTF-8', 'utf8', 'utf-16le', 'utf-16be', 'UTF-16', 'latin1', 'iso-8859-1', 'koi8-r', ''),
    { nil: undefined, freq: 2 },
  ),
  body,
});

type FuzzRequest = typeof request extends fc.Arbitrary<infer T> ? T : never;

function headersFor(r: FuzzRequest, port: number, knownTask: string | undefined): Record<string, string> {
  const headers: Record<string, string> = {};
  const token = { alice: 'alice-token', bob: 'bob-token', wrong: 'mallory-token' }[r.target as string];
  if (token) headers['authorization'] = `Bearer ${token}`;
  const own = r.target === 'anon' ? sessions['anon'] : sessions[r.target === 'bob' ? 'bob' : 'alice'];
  const other = r.target === 'bob' ? sessions['alice'] : sessions['bob'];
  const session = { own, other, garbage: 'b5c0a8e2-0000-4000-8000-000000000000', none: undefined }[r.session];
  if (session) headers['mcp-session-id'] = session;
  if (r.contentType) headers['content-type'] = r.contentType;
  if (r.accept) headers['accept'] = r.accept;
  if (r.protocolVersion) headers['mcp-protocol-version'] = r.protocolVersion;
  headers['host'] = r.host === '127.0.0.1' || r.host === 'localhost' ? `${r.host}:${port}` : r.host;
  if (r.lastEventId !== undefined) headers['last-event-id'] = r.lastEventId.replace(/[^\x20-\x7e]/g, '');
  if (r.origin) headers['origin'] = r.origin;
  if (r.charset !== undefined) headers['content-type'] = `application/json; charset=${r.charset}`;
  void knownTask;
  return headers;
}

describe('hostile input against live gateways', () => {
  it(`answers ${RUNS} mutated requests without a 5xx, a hang or a crash, and leaves tasks consistent`, async () => {
    const statuses = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const gw = r.target === 'anon' ? open : authed;
        const known = created.at(-1)?.taskId;
        const text = known ? r.body.replaceAll('KNOWN', known) : r.body;
        const headers = {
          ...headersFor(r, gw.port, known),
          ...(r.era === 'sessionless' ? sessionlessHeaders(text) : {}),
        };
        const withBody = r.httpMethod === 'POST' || r.httpMethod === 'PUT' || r.httpMethod === 'PATCH';
        const bytes = encode(text, r.charset ?? 'utf-8');
        const answer = await exchange(gw.port, r.httpMethod, headers, withBody ? bytes : undefined);
        statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
        // A DELETE of a shared session ended it: open a fresh one for the requests that follow.
        if (r.httpMethod === 'DELETE' && answer.status === 200) await reopenSessions();
        expect(answer.status, `${r.httpMethod} ${JSON.stringify(headers)} ${text.slice(0, 300)}`).toBeLessThan(500);
        // Every answer under /mcp is JSON (or an SSE stream), never HTML or plain text.
        if (answer.body !== '')
          expect(answer.contentType, `${r.httpMethod} ${text.slice(0, 100)}`).toMatch(/json|event-stream/);
        // Record the tasks the run created, to check them afterwards.
        for (const match of answer.body.matchAll(/\{"taskId":"[^"]+","status":"working"[^}]*\}/g)) {
          const task = JSON.parse(match[0]) as { taskId: string; ttl: number };
          if (r.target === 'alice' || r.target === 'bob') {
            created.push({ taskId: task.taskId, principal: r.target, expiresAt: Date.now() + task.ttl });
          }
        }
      }),
      { numRuns: RUNS, endOnFailure: true },
    );
    expect(authed.child.exitCode).toBeNull();
    expect(open.child.exitCode).toBeNull();
    for (const gw of [authed, open]) {
      expect((await fetch(gw.url.replace(/\/mcp$/, '/readyz'))).status).toBe(200);
    }
    // Every task is its owner's, with a valid status, and unknown to the other principal.
    const owners = { alice: await openSession(authed, 'alice-token'), bob: await openSession(authed, 'bob-token') };
    const get = async (principal: 'alice' | 'bob', taskId: string) => {
      const res = await fetch(authed.url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          authorization: `Bearer ${principal}-token`,
          'mcp-session-id': owners[principal],
          'mcp-protocol-version': '2025-11-25',
        },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { taskId } }),
      });
      const raw = await res.text();
      const data = raw.includes('data:') ? (/data: (\{.*\})/.exec(raw)?.[1] ?? raw) : raw;
      return JSON.parse(data) as { result?: { status: string }; error?: { code: number } };
    };
    // Tasks whose granted ttl (the fuzz asks for any) may have run out are rightly gone.
    const alive = created.filter((t) => t.expiresAt > Date.now() + 30_000);
    expect(alive.length).toBeGreaterThan(0);
    for (const { taskId, principal } of alive.slice(-50)) {
      const mine = await get(principal, taskId);
      expect(['working', 'input_required', 'completed', 'failed', 'cancelled']).toContain(mine.result?.status);
      const theirs = await get(principal === 'alice' ? 'bob' : 'alice', taskId);
      expect(theirs.error?.code).toBe(-32602);
    }
    console.info(
      `fuzz: ${RUNS} requests, ${created.length} tasks (${alive.length} checked), statuses ${JSON.stringify([...statuses])}`,
    );
  });
});

describe('§22.3 bodies in other charsets, on both transports', () => {
  const transports = {
    session: () => ({
      'mcp-session-id': sessions['anon'] ?? '',
      'mcp-protocol-version': '2025-11-25',
    }),
    sessionless: () => sessionlessHeaders(hiddenDepthBody(1)),
  };
  /** A body nested 100,000 deep (hidden from a naive check), declared in `charset`, with the era's headers. */
  const postDeepBody = (charset: string, headers: Record<string, string>) =>
    exchange(
      open.port,
      'POST',
      {
        host: `127.0.0.1:${open.port}`,
        'content-type': `application/json; charset=${charset}`,
        accept: 'application/json, text/event-stream',
        ...headers,
      },
      encode(hiddenDepthBody(100_000), charset),
    );
  for (const [era, eraHeaders] of Object.entries(transports)) {
    for (const charset of ['utf-16le', 'utf-16be', 'UTF-16', 'utf8', 'latin1', 'koi8-r']) {
      it(`refuses a ${charset} body with 415 on the ${era} transport, however deep it hides its nesting`, async () => {
        const answer = await postDeepBody(charset, eraHeaders());
        expect(answer.status).toBe(415);
        expect(answer.contentType).toMatch(/application\/json/);
        const error = (JSON.parse(answer.body) as { error?: { message: string } }).error;
        expect(error?.message).toMatch(/charset/i);
      });
    }

    it(`reads a body declared as UTF-8 (any spelling) on the ${era} transport, and refuses its depth with 400`, async () => {
      for (const charset of ['utf-8', 'UTF-8', 'Utf-8']) {
        const answer = await postDeepBody(charset, eraHeaders());
        expect(answer.status, charset).toBe(400);
        expect(answer.body).toMatch(/nested deeper/);
      }
    });
  }
});

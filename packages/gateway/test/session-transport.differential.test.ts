/**
 * The session transport against the SDK's (PROTOCOL.md §9): `SessionTransport` is written to behave as the SDK 1.32.2
 * `StreamableHTTPServerTransport` does, because the SDK's `Server` and every SDK client rely on that behaviour. This
 * file sends the same exchanges to both, each behind its own HTTP server with the same scripted server on the other
 * side, and compares what comes back: statuses, error bodies (code and message), headers a client reads, and the
 * JSON-RPC messages each request gets, however they are framed. So an SDK upgrade that changes the SDK's behaviour, or
 * a change of ours that drifts from it, turns this red.
 *
 * The differences that are on purpose (session-transport.ts's header) are written down here as such, one each:
 * - a request that answers at once is answered as one JSON body, where the SDK streams it;
 * - a second GET stream of a session takes the first one over with Last-Event-ID (the SDK answers 409 to a resume
 *   while the stream is registered); without Last-Event-ID, both answer 409;
 * - the content type is checked before the transport, by the gateway's guards (`requireJsonContent`, 415 as the SDK),
 *   so this transport does not check it again.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import type { JSONRPCMessage, JSONRPCRequest } from '@modelcontextprotocol/sdk/types.js';
import { SessionEventStore } from '../src/transports/session/event-store.js';
import { SessionTransport } from '../src/transports/session/session-transport.js';

const SESSION = 'diff-session';
const ACCEPT = 'application/json, text/event-stream';

interface Side {
  name: 'ours' | 'sdk';
  url: string;
  http: Server;
  transport: Transport & { handleRequest(req: IncomingMessage, res: ServerResponse, body?: unknown): Promise<void> };
}

/** The same scripted server behind either transport: `echo` answers with its method, `noisy` logs first. */
function script(transport: Transport): void {
  transport.onmessage = (message: JSONRPCMessage) => {
    if (!('method' in message) || !('id' in message)) return;
    const { id, method } = message;
    if (method === 'initialize') {
      void transport.send({
        jsonrpc: '2.0',
        id,
        result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'diff', version: '0' } },
      });
      return;
    }
    const answer = () => void transport.send({ jsonrpc: '2.0', id, result: { method } });
    if (method === 'noisy') {
      void transport
        .send(
          { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'x' } },
          { relatedRequestId: id },
        )
        .then(answer);
    } else setImmediate(answer);
  };
}

async function serve(name: Side['name']): Promise<Side> {
  const transport =
    name === 'ours'
      ? new SessionTransport({
          sessionId: SESSION,
          events: new SessionEventStore({ ttlMs: 60_000 }),
          answersAtOnce: (request: JSONRPCRequest) => request.method !== 'noisy',
        })
      : new StreamableHTTPServerTransport({
          sessionIdGenerator: () => SESSION,
          eventStore: new SessionEventStore({ ttlMs: 60_000 }),
        });
  script(transport);
  await transport.start();
  const http = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      let parsed: unknown;
      try {
        parsed = body === '' ? undefined : JSON.parse(body);
      } catch {
        parsed = body; // not JSON: both transports get the raw text and must refuse it
      }
      void transport.handleRequest(req, res, parsed);
    });
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`;
  return { name, url, http, transport };
}

interface Exchange {
  method?: 'POST' | 'GET' | 'DELETE' | 'PUT';
  headers?: Record<string, string | undefined>;
  body?: unknown;
}

interface Seen {
  status: number;
  /** `json`, `sse`, or `none`. */
  kind: string;
  /** The JSON-RPC messages of the answer (one JSON body, or every SSE `data:` that is JSON-RPC). */
  messages: unknown[];
  sessionHeader: string | null;
  allow: string | null;
}

function baseHeaders(extra: Record<string, string | undefined> = {}): Record<string, string> {
  const all: Record<string, string | undefined> = {
    'content-type': 'application/json',
    accept: ACCEPT,
    'mcp-protocol-version': '2025-11-25',
    'mcp-session-id': SESSION,
    ...extra,
  };
  return Object.fromEntries(Object.entries(all).filter((e): e is [string, string] => e[1] !== undefined));
}

async function exchange(side: Side, ex: Exchange): Promise<Seen> {
  const method = ex.method ?? 'POST';
  const controller = new AbortController();
  const res = await fetch(side.url, {
    method,
    headers: baseHeaders(ex.headers),
    signal: controller.signal,
    ...(ex.body === undefined ? {} : { body: typeof ex.body === 'string' ? ex.body : JSON.stringify(ex.body) }),
  });
  const type = res.headers.get('content-type') ?? '';
  const seen: Seen = {
    status: res.status,
    kind: type.startsWith('text/event-stream') ? 'sse' : type.startsWith('application/json') ? 'json' : 'none',
    messages: [],
    sessionHeader: res.headers.get('mcp-session-id'),
    allow: res.headers.get('allow'),
  };
  if (seen.kind === 'sse' && method === 'GET') {
    controller.abort(); // a GET stream stays open: its status and headers are what is compared
    return seen;
  }
  const text = await res.text();
  if (seen.kind === 'json' && text !== '') {
    const body = JSON.parse(text) as unknown;
    seen.messages = Array.isArray(body) ? body : [body];
  } else if (seen.kind === 'sse') {
    for (const line of text.split('\n')) {
      if (!line.startsWith('data: ')) continue;
      const data = line.slice('data: '.length);
      if (data === '') continue; // a priming event carries no message
      seen.messages.push(JSON.parse(data));
    }
  }
  return seen;
}

/** What both must agree on: everything but the framing of a successful answer (JSON vs SSE, on purpose). */
function comparable(seen: Seen): Omit<Seen, 'kind'> & { kind?: string } {
  const { kind, ...rest } = seen;
  return seen.status >= 400 ? seen : { ...rest, kind: kind === 'none' ? 'none' : 'answer' };
}

let ours: Side;
let sdk: Side;

async function both(ex: Exchange): Promise<{ ours: Seen; sdk: Seen }> {
  // In turn, not at once: each side's session state moves the same way.
  const a = await exchange(ours, ex);
  const b = await exchange(sdk, ex);
  return { ours: a, sdk: b };
}

async function expectSame(ex: Exchange): Promise<Seen> {
  const seen = await both(ex);
  expect(comparable(seen.ours), JSON.stringify(ex)).toEqual(comparable(seen.sdk));
  return seen.ours;
}

const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'diff', version: '0' } },
};

beforeAll(async () => {
  ours = await serve('ours');
  sdk = await serve('sdk');
});

afterAll(async () => {
  for (const side of [ours, sdk]) {
    await side?.transport.close();
    side?.http.closeAllConnections();
    await new Promise<void>((resolve) => side?.http.close(() => resolve()));
  }
});

describe('SessionTransport and the SDK 1.32.2 StreamableHTTPServerTransport, side by side', () => {
  it('refuse the same requests before initialize, with the same status and error', async () => {
    await expectSame({ body: { jsonrpc: '2.0', id: 1, method: 'echo' } });
    await expectSame({ method: 'GET', headers: { accept: 'text/event-stream' } });
  });

  it('initialize alike: the session id, and the one answer', async () => {
    const seen = await both({ body: INIT, headers: { 'mcp-session-id': undefined } });
    expect(seen.ours.status).toBe(200);
    expect(seen.ours.sessionHeader).toBe(SESSION);
    expect(comparable(seen.ours)).toEqual(comparable(seen.sdk));
  });

  it('refuse a second initialize alike', async () => {
    await expectSame({ body: { ...INIT, id: 2 }, headers: { 'mcp-session-id': undefined } });
  });

  it('refuse bad requests with the same statuses and errors', async () => {
    const refusals: Array<[string, Exchange]> = [
      [
        'Accept without text/event-stream',
        { headers: { accept: 'application/json' }, body: { jsonrpc: '2.0', id: 3, method: 'echo' } },
      ],
      [
        'Accept without application/json',
        { headers: { accept: 'text/event-stream' }, body: { jsonrpc: '2.0', id: 3, method: 'echo' } },
      ],
      ['a body that is not JSON-RPC', { body: { hello: 'world' } }],
      ['a body that is not JSON', { body: 'not json' }],
      [
        'another session id',
        { headers: { 'mcp-session-id': 'other' }, body: { jsonrpc: '2.0', id: 4, method: 'echo' } },
      ],
      [
        'no session id',
        {
          headers: { 'mcp-session-id': undefined },
          body: { jsonrpc: '2.0', id: 5, method: 'echo' },
        },
      ],
      [
        'an unsupported protocol version',
        { headers: { 'mcp-protocol-version': '1999-01-01' }, body: { jsonrpc: '2.0', id: 6, method: 'echo' } },
      ],
      ['a method HTTP does not serve here', { method: 'PUT', body: { jsonrpc: '2.0', id: 8, method: 'echo' } }],
      ['a GET that does not accept SSE', { method: 'GET', headers: { accept: 'application/json' } }],
      [
        'a GET with a Last-Event-ID nobody issued',
        { method: 'GET', headers: { accept: 'text/event-stream', 'last-event-id': 'nope' } },
      ],
    ];
    for (const [what, ex] of refusals) {
      const seen = await both(ex);
      expect(seen.ours.status, what).toBeGreaterThanOrEqual(400);
      expect(comparable(seen.ours), what).toEqual(comparable(seen.sdk));
    }
  });

  it('answer notifications with 202 and no body, alike', async () => {
    const seen = await expectSame({ body: { jsonrpc: '2.0', method: 'notifications/initialized' } });
    expect(seen.status).toBe(202);
  });

  it('give each request the same messages, the related notification before the answer', async () => {
    const plain = await expectSame({ body: { jsonrpc: '2.0', id: 10, method: 'echo' } });
    expect(plain.messages).toEqual([{ jsonrpc: '2.0', id: 10, result: { method: 'echo' } }]);
    const noisy = await expectSame({ body: { jsonrpc: '2.0', id: 11, method: 'noisy' } });
    expect(noisy.messages).toEqual([
      { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'x' } },
      { jsonrpc: '2.0', id: 11, result: { method: 'noisy' } },
    ]);
  });

  it('answer a batch with every answer, alike', async () => {
    const batch = await both({
      body: [
        { jsonrpc: '2.0', id: 20, method: 'echo' },
        { jsonrpc: '2.0', id: 21, method: 'echo' },
      ],
    });
    expect(batch.ours.status).toBe(batch.sdk.status);
    const ids = (seen: Seen) => seen.messages.map((m) => (m as { id: number }).id).sort();
    expect(ids(batch.ours)).toEqual(ids(batch.sdk));
    expect(ids(batch.ours)).toEqual([20, 21]);
  });

  it('open one GET stream per session and refuse a second without Last-Event-ID, alike', async () => {
    const held = new AbortController();
    const firsts = await Promise.all(
      [ours, sdk].map((side) =>
        fetch(side.url, { headers: baseHeaders({ accept: 'text/event-stream' }), signal: held.signal }),
      ),
    );
    expect(firsts.map((r) => r.status)).toEqual([200, 200]);
    const second = await expectSame({ method: 'GET', headers: { accept: 'text/event-stream' } });
    expect(second.status).toBe(409);
    held.abort();
  });

  it('end the session on DELETE, then refuse it, alike', async () => {
    const deleted = await expectSame({ method: 'DELETE' });
    expect(deleted.status).toBe(200);
    const after = await expectSame({ body: { jsonrpc: '2.0', id: 30, method: 'echo' } });
    expect(after.status).toBe(404);
  });
});

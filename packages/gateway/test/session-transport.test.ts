/**
 * The node-native session transport (PROTOCOL.md §9): which POSTs are answered as one JSON body, which stream, how a
 * JSON answer turns into a stream when something else is sent first, and that a stream dropped before its answer
 * is resumed with Last-Event-ID. A real HTTP server, a scripted "server" on the other side of the transport.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { JSONRPCMessage, JSONRPCRequest } from '@modelcontextprotocol/sdk/types.js';
import { SessionEventStore } from '../src/transports/session/event-store.js';
import { SessionTransport } from '../src/transports/session/session-transport.js';

const SESSION = 'session-1';
const ACCEPT = 'application/json, text/event-stream';

let http: Server;
let url: string;
let transport: SessionTransport;
/** Answers held back by the scripted server, by request id: the test releases them. */
let held: Map<string | number, () => void>;

function headers(extra: Record<string, string> = {}): Record<string, string> {
  return { 'content-type': 'application/json', accept: ACCEPT, 'mcp-protocol-version': '2025-11-25', ...extra };
}

function post(body: unknown, extra: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: headers({ 'mcp-session-id': SESSION, ...extra }),
    body: JSON.stringify(body),
    signal: signal ?? null,
  });
}

function events(text: string): Array<{ event?: string; id?: string; data: string }> {
  return text
    .split('\n\n')
    .filter((block) => block.trim() !== '')
    .map((block) => {
      const fields: { event?: string; id?: string; data: string } = { data: '' };
      for (const line of block.split('\n')) {
        const at = line.indexOf(': ');
        const [key, value] = at < 0 ? [line.replace(/:$/, ''), ''] : [line.slice(0, at), line.slice(at + 2)];
        if (key === 'event') fields.event = value;
        else if (key === 'id') fields.id = value;
        else if (key === 'data') fields.data = value;
      }
      return fields;
    });
}

beforeEach(async () => {
  held = new Map();
  transport = new SessionTransport({
    sessionId: SESSION,
    events: new SessionEventStore({ ttlMs: 60_000 }),
    // "slow" waits and may stream; everything else answers at once.
    answersAtOnce: (request: JSONRPCRequest) => request.method !== 'slow',
  });
  transport.onmessage = (message: JSONRPCMessage) => {
    if (!('method' in message) || !('id' in message)) return;
    const { id, method } = message;
    const answer = () => void transport.send({ jsonrpc: '2.0', id, result: { method } });
    if (method === 'noisy') {
      void transport
        .send(
          { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'x' } },
          {
            relatedRequestId: id,
          },
        )
        .then(answer);
    } else if (method === 'slow') held.set(id, answer);
    else setImmediate(answer);
  };
  await transport.start();
  http = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => void transport.handleRequest(req, res, body === '' ? undefined : JSON.parse(body)));
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`;
  const init = await fetch(url, {
    method: 'POST',
    headers: headers(),
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } },
    }),
  });
  expect(init.headers.get('mcp-session-id')).toBe(SESSION);
  await init.text();
});

afterEach(async () => {
  await transport.close();
  http.closeAllConnections();
  await new Promise<void>((resolve) => http.close(() => resolve()));
});

describe('SessionTransport', () => {
  it('answers a request that answers at once as one JSON body', async () => {
    const res = await post({ jsonrpc: '2.0', id: 1, method: 'tasks/get', params: {} });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(res.headers.get('mcp-session-id')).toBe(SESSION);
    expect(await res.json()).toEqual({ jsonrpc: '2.0', id: 1, result: { method: 'tasks/get' } });
  });

  it('answers a batch of such requests as one JSON array', async () => {
    const res = await post([
      { jsonrpc: '2.0', id: 1, method: 'a' },
      { jsonrpc: '2.0', id: 2, method: 'b' },
    ]);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(await res.json()).toEqual([
      { jsonrpc: '2.0', id: 1, result: { method: 'a' } },
      { jsonrpc: '2.0', id: 2, result: { method: 'b' } },
    ]);
  });

  it('streams a request that may wait: a named priming event first, then the answer, then the end', async () => {
    const response = post({ jsonrpc: '2.0', id: 3, method: 'slow' });
    const res = await response;
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    held.get(3)?.();
    const got = events(await res.text());
    expect(got[0]).toMatchObject({ event: 'priming', data: '' });
    expect(got[0]?.id).toBeTruthy();
    expect(got[1]?.event).toBe('message');
    expect(JSON.parse(got[1]?.data ?? '')).toEqual({ jsonrpc: '2.0', id: 3, result: { method: 'slow' } });
    expect(got).toHaveLength(2);
  });

  it('turns a JSON answer into a stream when something else is sent for the request first', async () => {
    const res = await post({ jsonrpc: '2.0', id: 4, method: 'noisy' });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const got = events(await res.text());
    expect(got.map((e) => e.event)).toEqual(['priming', 'message', 'message']);
    expect(JSON.parse(got[1]?.data ?? '')).toMatchObject({ method: 'notifications/message' });
    expect(JSON.parse(got[2]?.data ?? '')).toEqual({ jsonrpc: '2.0', id: 4, result: { method: 'noisy' } });
  });

  it('replays the answer of a stream dropped before it, on a GET with Last-Event-ID', async () => {
    const controller = new AbortController();
    const res = await post({ jsonrpc: '2.0', id: 5, method: 'slow' }, {}, controller.signal);
    const reader = res.body!.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    const primingId = events(first)[0]?.id ?? '';
    expect(primingId).not.toBe('');
    controller.abort();
    await reader.cancel().catch(() => undefined);
    // The answer is sent while no stream is open: kept for the replay.
    await expect.poll(() => held.has(5)).toBe(true);
    held.get(5)?.();
    const resumed = await fetch(url, {
      headers: headers({ 'mcp-session-id': SESSION, accept: 'text/event-stream', 'last-event-id': primingId }),
    });
    expect(resumed.headers.get('content-type')).toBe('text/event-stream');
    const resumedReader = resumed.body!.getReader();
    const replay = new TextDecoder().decode((await resumedReader.read()).value);
    await resumedReader.cancel();
    expect(JSON.parse(events(replay)[0]?.data ?? '')).toEqual({ jsonrpc: '2.0', id: 5, result: { method: 'slow' } });
  });

  it('with sseAfterMs, answers a waiting request ready in time as JSON, and streams it once the time is up', async () => {
    (transport as unknown as { options: { sseAfterMs?: number } }).options.sseAfterMs = 150;
    const quick = post({ jsonrpc: '2.0', id: 10, method: 'slow' });
    await expect.poll(() => held.has(10)).toBe(true);
    held.get(10)?.();
    const res = await quick;
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(await res.json()).toEqual({ jsonrpc: '2.0', id: 10, result: { method: 'slow' } });
    // Not answered within 150 ms: the response becomes a stream, priming event first, and the answer follows on it.
    const started = Date.now();
    const late = await post({ jsonrpc: '2.0', id: 11, method: 'slow' });
    expect(late.headers.get('content-type')).toBe('text/event-stream');
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
    held.get(11)?.();
    const got = events(await late.text());
    expect(got.map((e) => e.event)).toEqual(['priming', 'message']);
    expect(JSON.parse(got[1]?.data ?? '')).toEqual({ jsonrpc: '2.0', id: 11, result: { method: 'slow' } });
  });

  it('refuses what the SDK transport refuses, with the same statuses', async () => {
    expect((await post({ jsonrpc: '2.0', id: 6, method: 'a' }, { accept: 'application/json' })).status).toBe(406);
    expect((await post({ jsonrpc: '2.0', id: 7, method: 'a' }, { 'mcp-session-id': 'other' })).status).toBe(404);
    expect((await post({ jsonrpc: '2.0', id: 8, method: 'a' }, { 'mcp-protocol-version': '1999-01-01' })).status).toBe(
      400,
    );
    const bad = await post({ hello: 'world' });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { code: -32700 } });
    expect((await post({ jsonrpc: '2.0', method: 'notifications/initialized' })).status).toBe(202);
    const getTwice = [0, 1].map(() =>
      fetch(url, { headers: headers({ 'mcp-session-id': SESSION, accept: 'text/event-stream' }) }),
    );
    const statuses = (await Promise.all(getTwice)).map((r) => r.status).sort();
    expect(statuses).toEqual([200, 409]);
    await transport.close();
    expect((await post({ jsonrpc: '2.0', id: 9, method: 'a' })).status).toBe(404);
  });
});

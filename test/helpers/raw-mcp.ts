/**
 * A raw Streamable HTTP client for the few tests that must control the HTTP streams themselves (dropping a GET
 * stream, resuming with Last-Event-ID, closing a POST response early).
 */
export interface SseEvent {
  id?: string;
  data: unknown;
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

/** The 2026-07-28 protocol version and the tasks extension's id, as a 2026 client sends them. */
export const MODERN_VERSION = '2026-07-28';
export const TASKS_EXT = 'io.modelcontextprotocol/tasks';

export interface ModernRequestOptions {
  /** The client's capabilities, in every request's `_meta`. Default: none. */
  capabilities?: Record<string, unknown>;
  /** More `_meta` fields (clientInfo, a progress token…). */
  meta?: Record<string, unknown>;
  /** Headers over the defaults; `undefined` removes one. */
  headers?: Record<string, string | undefined>;
}

let modernId = 0;

/**
 * Opens a 2025-11-25 session over raw HTTP (initialize, then notifications/initialized) with `extra` headers (a
 * bearer…): its id, and the headers every later request of it carries.
 */
export async function initSession(
  url: string,
  extra: Record<string, string> = {},
  clientName = 'raw',
): Promise<{ sessionId: string; headers: Record<string, string> }> {
  const init = await fetch(url, {
    method: 'POST',
    headers: { ...JSON_HEADERS, ...extra },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: clientName, version: '0' } },
    }),
  });
  const sessionId = init.headers.get('mcp-session-id');
  await init.text();
  if (!sessionId) throw new Error(`initialize answered ${init.status}`);
  const headers = { ...JSON_HEADERS, ...extra, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-11-25' };
  await fetch(url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  }).then((r) => r.text());
  return { sessionId, headers };
}

/**
 * The headers and body of one 2026-07-28 request, as a 2026 client sends it: no session, the routing headers
 * (`mcp-method`, and `mcp-name` for a tool call or a task method) and the per-request `_meta`. Ids are unique in the
 * test file.
 */
export function modernRequest(
  method: string,
  params: Record<string, unknown> = {},
  options: ModernRequestOptions = {},
): { id: number; headers: Record<string, string>; body: string } {
  const id = ++modernId;
  const body = JSON.stringify({
    jsonrpc: '2.0',
    id,
    method,
    params: {
      ...params,
      _meta: {
        'io.modelcontextprotocol/protocolVersion': MODERN_VERSION,
        'io.modelcontextprotocol/clientCapabilities': options.capabilities ?? {},
        ...options.meta,
      },
    },
  });
  const headers: Record<string, string> = {
    ...JSON_HEADERS,
    'mcp-protocol-version': MODERN_VERSION,
    'mcp-method': method,
  };
  const name = method === 'tools/call' ? params['name'] : method.startsWith('tasks/') ? params['taskId'] : undefined;
  if (typeof name === 'string') headers['mcp-name'] = name;
  for (const [k, v] of Object.entries(options.headers ?? {})) {
    if (v === undefined) delete headers[k];
    else headers[k] = v;
  }
  return { id, headers, body };
}

export class RawSession {
  private nextId = 1;
  constructor(
    readonly url: string,
    readonly sessionId: string,
  ) {}

  static async open(url: string): Promise<RawSession> {
    const res = await fetch(url, {
      method: 'POST',
      headers: JSON_HEADERS,
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '0' } },
      }),
    });
    const sessionId = res.headers.get('mcp-session-id');
    if (!sessionId) throw new Error(`initialize failed: ${res.status} ${await res.text()}`);
    await res.text();
    const session = new RawSession(url, sessionId);
    await session.post({ jsonrpc: '2.0', method: 'notifications/initialized' });
    return session;
  }

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...JSON_HEADERS, 'mcp-session-id': this.sessionId, 'mcp-protocol-version': '2025-11-25', ...extra };
  }

  post(body: unknown, signal?: AbortSignal): Promise<Response> {
    return fetch(this.url, {
      method: 'POST',
      headers: this.headers(),
      body: JSON.stringify(body),
      signal: signal ?? null,
    });
  }

  /** Ends the session (DELETE); returns the HTTP status. */
  async close(): Promise<number> {
    const res = await fetch(this.url, { method: 'DELETE', headers: this.headers() });
    await res.body?.cancel();
    return res.status;
  }

  /** Sends a request and returns its JSON-RPC response (read from the SSE or JSON body). */
  async request(method: string, params: unknown): Promise<{ result?: any; error?: { code: number; message: string } }> {
    const id = this.nextId++;
    const res = await this.post({ jsonrpc: '2.0', id, method, params });
    const type = res.headers.get('content-type') ?? '';
    if (type.includes('application/json')) return (await res.json()) as never;
    for await (const event of readSse(res)) {
      const msg = event.data as { id?: unknown };
      if (msg.id === id) return msg as never;
    }
    throw new Error(`no response to ${method}`);
  }

  /** Opens the standalone GET stream (optionally resuming after an event id). */
  openGetStream(lastEventId?: string): { events: SseEvent[]; close: () => void; done: Promise<void> } {
    const controller = new AbortController();
    const events: SseEvent[] = [];
    const headers = this.headers({
      accept: 'text/event-stream',
      ...(lastEventId ? { 'last-event-id': lastEventId } : {}),
    });
    const done = (async () => {
      try {
        const res = await fetch(this.url, { method: 'GET', headers, signal: controller.signal });
        if (res.status !== 200) throw new Error(`GET stream answered ${res.status}: ${await res.text()}`);
        for await (const event of readSse(res)) events.push(event);
      } catch (error) {
        if (!controller.signal.aborted) throw error;
      }
    })();
    return { events, close: () => controller.abort(), done };
  }
}

/**
 * The SSE events of a response, parsed. With `priming`, an event with an id and no data (the priming event) is
 * yielded too, its `data` undefined; keep-alive comments never are.
 */
export async function* readSse(res: Response, options: { priming?: boolean } = {}): AsyncGenerator<SseEvent> {
  if (!res.body) return;
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let at: number;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      let id: string | undefined;
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
      }
      const text = data.join('\n');
      if (text === '' && (options.priming !== true || id === undefined)) continue;
      const event: SseEvent = { data: text === '' ? undefined : (JSON.parse(text) as unknown) };
      if (id !== undefined) event.id = id;
      yield event;
    }
  }
}

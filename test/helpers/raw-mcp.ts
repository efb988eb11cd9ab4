/**
 * A raw Streamable HTTP client for the few tests that must control the HTTP streams themselves (dropping a GET
 * stream, resuming with Last-Event-ID, closing a POST response early).
 */
export interface SseEvent {
  id?: string;
  data: unknown;
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

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

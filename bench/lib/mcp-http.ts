/**
 * The benchmark's load generator: raw JSON-RPC over HTTP/1.1 (node:http, one keep-alive agent), the Streamable HTTP
 * `Accept: application/json, text/event-stream` contract and a minimal SSE parser. No SDK Client: it has per-request
 * costs of its own (schema parsing, one abort listener per request, per-task progress bookkeeping) that would make
 * the client, not the server, the bottleneck. The same code drives the SDK peer and taskrelay.
 */
import http from 'node:http';

export interface JsonRpcError {
  code: number;
  message: string;
  data?: unknown;
}

export interface JsonRpcMessage {
  jsonrpc: '2.0';
  id?: number | string;
  method?: string;
  params?: any;
  result?: any;
  error?: JsonRpcError;
}

export class RpcError extends Error {
  constructor(
    readonly method: string,
    readonly error: JsonRpcError,
  ) {
    super(`${method}: JSON-RPC error ${error.code}: ${error.message}`);
  }
}

export const PROTOCOL_VERSION = '2025-11-25';

/** One agent for the whole run: sockets are reused across requests (keep-alive), never capped. */
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 4096, scheduling: 'lifo' });

/** Incremental SSE parser: feeds `data:` payloads of complete events to `onData`; skips empty (priming) events. */
export class SseParser {
  private buffer = '';
  constructor(private readonly onData: (data: string) => void) {}

  push(chunk: string): void {
    this.buffer += chunk;
    let at: number;
    while ((at = this.buffer.indexOf('\n\n')) >= 0) {
      const block = this.buffer.slice(0, at);
      this.buffer = this.buffer.slice(at + 2);
      let data = '';
      for (const raw of block.split('\n')) {
        const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
        if (line.startsWith('data:')) data += (data ? '\n' : '') + line.slice(line.startsWith('data: ') ? 6 : 5);
      }
      if (data !== '') this.onData(data);
    }
  }
}

interface PostOutcome {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** Body text for a non-SSE, non-2xx or JSON answer. */
  body: string;
}

export interface SessionOptions {
  /** Sent as `Authorization: Bearer <token>` on every request (a gateway with TASKRELAY_AUTH_TOKENS). */
  token?: string;
  /** Open the standalone GET SSE stream (as the SDK client does after `initialize`). Default true. */
  getStream?: boolean;
  /** Notifications that arrive on any stream of this session (GET stream or a POST response stream). */
  onNotification?: (message: JsonRpcMessage) => void;
}

/** One MCP session over Streamable HTTP. */
export class McpSession {
  onNotification: ((message: JsonRpcMessage) => void) | undefined;
  /** Set when the GET stream ended or failed (a server that drops it loses task progress). */
  getStreamError: string | undefined;
  private nextId = 1;
  private readonly inflight = new Set<http.ClientRequest>();
  private getRequest: http.ClientRequest | undefined;
  private closed = false;
  private readonly url: URL;
  private readonly auth: Record<string, string>;
  readonly era = PROTOCOL_VERSION;

  private constructor(
    url: string,
    readonly sessionId: string,
    options: SessionOptions,
  ) {
    this.url = new URL(url);
    this.onNotification = options.onNotification;
    this.auth = authHeader(options.token);
  }

  static async open(url: string, options: SessionOptions = {}): Promise<McpSession> {
    const init = {
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: {
        protocolVersion: PROTOCOL_VERSION,
        capabilities: { tasks: { list: {}, cancel: {}, requests: {} } },
        clientInfo: { name: 'taskrelay-bench', version: '0.0.0' },
      },
    };
    let response: JsonRpcMessage | undefined;
    const outcome = await rawPost(
      new URL(url),
      { ...baseHeaders(), ...authHeader(options.token) },
      JSON.stringify(init),
      (m) => {
        if (m.id === 0) response = m;
      },
    );
    const header = outcome.headers['mcp-session-id'];
    const sessionId = Array.isArray(header) ? header[0] : header;
    if (!sessionId || response?.result === undefined) {
      throw new Error(`initialize failed: HTTP ${outcome.status} ${outcome.body.slice(0, 300)}`);
    }
    const session = new McpSession(url, sessionId, options);
    await session.notify('notifications/initialized');
    if (options.getStream !== false) await session.openGetStream();
    return session;
  }

  private headers(): Record<string, string> {
    return {
      ...baseHeaders(),
      ...this.auth,
      'mcp-session-id': this.sessionId,
      'mcp-protocol-version': PROTOCOL_VERSION,
    };
  }

  /** Sends a request; resolves with its JSON-RPC response (result or error) as soon as it arrives. */
  send(method: string, params?: unknown): Promise<JsonRpcMessage> {
    const id = this.nextId++;
    const body = JSON.stringify(
      params === undefined ? { jsonrpc: '2.0', id, method } : { jsonrpc: '2.0', id, method, params },
    );
    return new Promise<JsonRpcMessage>((resolve, reject) => {
      let answered = false;
      rawPost(
        this.url,
        this.headers(),
        body,
        (m) => {
          if (m.id === id && (m.result !== undefined || m.error !== undefined)) {
            answered = true;
            resolve(m);
          } else if (m.method !== undefined && m.id === undefined) this.onNotification?.(m);
        },
        this.inflight,
      ).then(
        (outcome) => {
          if (answered) return;
          reject(new Error(`${method}: no response (HTTP ${outcome.status} ${outcome.body.slice(0, 300)})`));
        },
        (error: unknown) => {
          if (!answered) reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }

  /** Sends a request and returns its result; a JSON-RPC error rejects with RpcError. */
  async call(method: string, params?: unknown): Promise<any> {
    const m = await this.send(method, params);
    if (m.error) throw new RpcError(method, m.error);
    return m.result;
  }

  async notify(method: string, params?: unknown): Promise<void> {
    const body = JSON.stringify(params === undefined ? { jsonrpc: '2.0', method } : { jsonrpc: '2.0', method, params });
    const outcome = await rawPost(this.url, this.headers(), body, () => undefined, this.inflight);
    if (outcome.status >= 300) throw new Error(`${method}: HTTP ${outcome.status} ${outcome.body.slice(0, 200)}`);
  }

  private openGetStream(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const headers = { ...this.headers(), accept: 'text/event-stream' };
      delete (headers as Record<string, string>)['content-type'];
      const req = http.request(this.url, { method: 'GET', headers, agent }, (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          reject(new Error(`GET stream: HTTP ${res.statusCode}`));
          return;
        }
        resolve();
        res.setEncoding('utf8');
        const parser = new SseParser((data) => this.dispatch(data));
        res.on('data', (chunk: string) => parser.push(chunk));
        res.on('end', () => {
          if (!this.closed) this.getStreamError = 'GET stream ended';
        });
        res.on('error', (error) => {
          if (!this.closed) this.getStreamError = error.message;
        });
      });
      req.on('error', (error) => {
        if (!this.closed) this.getStreamError = error.message;
        reject(error);
      });
      req.end();
      this.getRequest = req;
    });
  }

  private dispatch(data: string): void {
    let message: JsonRpcMessage;
    try {
      message = JSON.parse(data) as JsonRpcMessage;
    } catch {
      return;
    }
    if (message.method !== undefined && message.id === undefined) this.onNotification?.(message);
  }

  /** Destroys every request in flight (a scenario that timed out); the session stays usable. */
  abortInflight(): void {
    for (const req of this.inflight) req.destroy(new Error('aborted by the benchmark'));
    this.inflight.clear();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.abortInflight();
    this.getRequest?.destroy();
    await new Promise<void>((resolve) => {
      const req = http.request(this.url, { method: 'DELETE', headers: this.headers(), agent }, (res) => {
        res.resume();
        res.on('end', resolve);
        res.on('error', () => resolve());
      });
      req.on('error', () => resolve());
      req.setTimeout(2_000, () => req.destroy());
      req.end();
    });
  }
}

function authHeader(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}

export const MODERN_PROTOCOL_VERSION = '2026-07-28';
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';

/**
 * A client of the sessionless 2026-07-28 transport (PROTOCOL.md §14), with the same `send` / `call` as a session:
 * no `initialize`, no GET stream; every request carries `MCP-Protocol-Version`, `Mcp-Method` (and `Mcp-Name` for a
 * `tools/call`) and the client's capabilities in `_meta`. `tasks: true` declares the tasks extension, so a
 * `tools/call` creates a task and `subscriptions/listen` may follow it.
 */
export class ModernClient {
  readonly era = MODERN_PROTOCOL_VERSION;
  readonly sessionId = '';
  private nextId = 1;
  private readonly inflight = new Set<http.ClientRequest>();
  private readonly url: URL;
  private readonly auth: Record<string, string>;
  private readonly meta: Record<string, unknown>;

  constructor(url: string, options: { token?: string; tasks?: boolean } = {}) {
    this.url = new URL(url);
    this.auth = authHeader(options.token);
    this.meta = {
      'io.modelcontextprotocol/protocolVersion': MODERN_PROTOCOL_VERSION,
      'io.modelcontextprotocol/clientCapabilities': options.tasks ? { extensions: { [TASKS_EXTENSION]: {} } } : {},
    };
  }

  /** Sends a request; resolves with its JSON-RPC response once it arrives (after any notifications before it). */
  send(
    method: string,
    params: Record<string, unknown> = {},
    onNotification?: (m: JsonRpcMessage) => void,
  ): Promise<JsonRpcMessage> {
    const id = this.nextId++;
    const body = JSON.stringify({ jsonrpc: '2.0', id, method, params: { ...params, _meta: this.meta } });
    const headers: Record<string, string> = {
      ...baseHeaders(),
      ...this.auth,
      'mcp-protocol-version': MODERN_PROTOCOL_VERSION,
      'mcp-method': method,
    };
    if (method === 'tools/call' && typeof params['name'] === 'string') headers['mcp-name'] = params['name'];
    return new Promise<JsonRpcMessage>((resolve, reject) => {
      let answered = false;
      rawPost(
        this.url,
        headers,
        body,
        (m) => {
          if (m.id === id && (m.result !== undefined || m.error !== undefined)) {
            answered = true;
            resolve(m);
          } else if (m.method !== undefined && m.id === undefined) onNotification?.(m);
        },
        this.inflight,
      ).then(
        (outcome) => {
          if (!answered)
            reject(new Error(`${method}: no response (HTTP ${outcome.status} ${outcome.body.slice(0, 300)})`));
        },
        (error: unknown) => {
          if (!answered) reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }

  async call(
    method: string,
    params?: Record<string, unknown>,
    onNotification?: (m: JsonRpcMessage) => void,
  ): Promise<any> {
    const m = await this.send(method, params, onNotification);
    if (m.error) throw new RpcError(method, m.error);
    return m.result;
  }

  abortInflight(): void {
    for (const req of this.inflight) req.destroy();
    this.inflight.clear();
  }

  close(): Promise<void> {
    this.abortInflight();
    return Promise.resolve();
  }
}

function baseHeaders(): Record<string, string> {
  return { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
}

/** One POST; JSON-RPC messages in the answer (JSON or SSE) go to `onMessage`; resolves at the end of the body. */
function rawPost(
  url: URL,
  headers: Record<string, string>,
  body: string,
  onMessage: (m: JsonRpcMessage) => void,
  inflight?: Set<http.ClientRequest>,
): Promise<PostOutcome> {
  return new Promise<PostOutcome>((resolve, reject) => {
    const req = http.request(
      url,
      { method: 'POST', headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) }, agent },
      (res) => {
        const status = res.statusCode ?? 0;
        const type = String(res.headers['content-type'] ?? '');
        res.setEncoding('utf8');
        let text = '';
        const sse = status < 300 && type.includes('text/event-stream');
        const parser = sse
          ? new SseParser((data) => {
              try {
                onMessage(JSON.parse(data) as JsonRpcMessage);
              } catch {
                // not JSON: ignore, like a lenient client
              }
            })
          : undefined;
        res.on('data', (chunk: string) => (parser ? parser.push(chunk) : (text += chunk)));
        res.on('end', () => {
          inflight?.delete(req);
          if (!sse && text !== '' && status < 300 && type.includes('application/json')) {
            try {
              const parsed = JSON.parse(text) as JsonRpcMessage | JsonRpcMessage[];
              for (const m of Array.isArray(parsed) ? parsed : [parsed]) onMessage(m);
            } catch {
              // fall through: reported by the caller as "no response"
            }
          }
          resolve({ status, headers: res.headers, body: text });
        });
        res.on('error', (error) => {
          inflight?.delete(req);
          reject(error);
        });
      },
    );
    inflight?.add(req);
    req.on('error', (error) => {
      inflight?.delete(req);
      reject(error);
    });
    req.end(body);
  });
}

/** `count` clients of the sessionless 2026-07-28 transport (nothing to open: each request stands alone). */
export function modernClients(url: string, count: number, options: { token?: string; tasks?: boolean } = {}) {
  return Array.from({ length: count }, () => new ModernClient(url, options));
}

/** Opens `count` sessions (a few at a time). */
export async function openSessions(url: string | string[], count: number, options: SessionOptions = {}) {
  const urls = Array.isArray(url) ? url : [url];
  const sessions: McpSession[] = [];
  for (let i = 0; i < count; i += 8) {
    const batch = Array.from({ length: Math.min(8, count - i) }, (_, j) =>
      McpSession.open(urls[(i + j) % urls.length]!, options),
    );
    sessions.push(...(await Promise.all(batch)));
  }
  return sessions;
}

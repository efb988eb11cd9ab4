/**
 * The Streamable HTTP transport of one 2025-era session (PROTOCOL.md §9, §14), written on node's own request and
 * response objects. It behaves as the SDK 1.32.2 `StreamableHTTPServerTransport` does — the same status codes, error
 * bodies, SSE framing, priming events, Last-Event-ID replay and request-to-stream routing, which is what the SDK's
 * `Server` (our handlers, cancellation, server-to-client requests) relies on — without its bridge to web streams:
 * that transport converts every request into a fetch `Request`, answers with a `ReadableStream` and pipes it back
 * through `@hono/node-server`, which cost about a fifth of the gateway's CPU per task cycle (docs/PERFORMANCE.md).
 *
 * Differences from the SDK's, on purpose:
 * - priming events are named (`event: priming`), so clients that JSON-parse every `data:` line skip them
 *   (`@ai-sdk/mcp`), while SDK clients still record their id;
 * - each message is serialised once, for the event store and the wire alike;
 * - what goes out passes `filter` first (safe errors, SECURITY.md);
 * - each SSE stream has a bounded send buffer (PROTOCOL.md §22.1): progress is coalesced while the client is behind,
 *   and a stream that would pass the bound is closed; the client resumes it with Last-Event-ID.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Transport, TransportSendOptions } from '@modelcontextprotocol/sdk/shared/transport.js';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import {
  DEFAULT_NEGOTIATED_PROTOCOL_VERSION,
  SUPPORTED_PROTOCOL_VERSIONS,
  type JSONRPCMessage,
  type JSONRPCRequest,
  type MessageExtraInfo,
  type RequestId,
} from '@modelcontextprotocol/sdk/types.js';
import type { SessionEventStore } from './event-store.js';
import { duplicateAnswer, duplicateRequest, isRequest, readPost } from './post-checks.js';
import type { StreamBuffers } from '../../http/stream-buffers.js';
import { SseWriter } from '../../http/sse-writer.js';
import { JSON_RPC } from '@taskrelay/shared';

/** The standalone (GET) stream's id, as the SDK names it. */
const STANDALONE_STREAM_ID = '_GET_stream';
/** Interval of `: keepalive` comments on open SSE streams (the SDK's default). */
const KEEP_ALIVE_MS = 15_000;

const SSE_HEADERS = {
  'Content-Type': 'text/event-stream',
  'Cache-Control': 'no-cache, no-transform',
  Connection: 'keep-alive',
  'X-Accel-Buffering': 'no',
} as const;

export interface SessionTransportOptions {
  sessionId: string;
  /** Where SSE events are kept for Last-Event-ID resumption. */
  events: SessionEventStore;
  /** Called once, when the `initialize` request of the session arrives. */
  onsessioninitialized?: (sessionId: string) => void;
  /** Called on DELETE, before the transport closes. */
  onsessionclosed?: (sessionId: string) => void;
  /** Rewrites each outgoing message (e.g. safe errors). Default: none. */
  filter?: (message: JSONRPCMessage) => JSONRPCMessage;
  /** Keep-alive comment interval on SSE streams; 0 disables. Default 15 s. */
  keepAliveMs?: number;
  /**
   * Requests whose handler answers at once and sends nothing else on the request's stream (task creation,
   * `tasks/get`, …): a POST made only of these is answered as one `application/json` body, as the spec allows, rather
   * than an SSE stream of a priming event and the answer. Should anything else be sent for it first, the response
   * becomes an SSE stream then. Default: none (every POST with a request is an SSE stream).
   */
  answersAtOnce?: (request: JSONRPCRequest) => boolean;
  /**
   * Every other POST (a plain call, a waiting `tasks/result`) also starts as a JSON answer, and becomes an SSE stream
   * (with its priming event, so a resumable client can resume it) when something else must go out first or when it
   * is still unanswered after this many ms (PROTOCOL.md §9.5). A plain call of a quick tool is then one JSON body:
   * no priming event, no event kept for replay, no keep-alive timer. Default: undefined (such a POST is an SSE stream
   * at once).
   */
  sseAfterMs?: number;
  /** Bytes that may wait to go out on one SSE stream (`TASKRELAY_MAX_STREAM_BUFFER_BYTES`). Default 1 MiB. */
  maxStreamBufferBytes?: number;
  /** A stream passed its bound and was closed. Default: none. */
  onStreamOverflow?: () => void;
  /** A progress notification waiting on a stream that is behind was replaced by a newer one. Default: none. */
  onProgressCoalesced?: () => void;
  /** Where the session's streams report their buffered bytes, for the memory budget (§22.2). Default: none. */
  streamBuffers?: StreamBuffers;
  /** The session's principal, for `streamBuffers`. */
  principal?: string;
  /**
   * A POST of one `resources/read` that is answered as it is read (PROTOCOL.md §34.3): the handler takes the response
   * and answers it itself (never through the event store), or answers undefined to leave it to the server.
   */
  streamedRead?: (
    request: JSONRPCRequest,
    res: ServerResponse,
    headers: Record<string, string>,
  ) => Promise<void> | undefined;
}

/** One open response: an SSE stream, or a POST whose answer may still go out as one JSON body. */
interface Stream {
  res: ServerResponse;
  keepAlive: NodeJS.Timeout | undefined;
  /** `json`: nothing written yet, the answers go out as `application/json` unless another message comes first. */
  state: 'json' | 'sse';
  /** The client can resume streams (protocol 2025-11-25 or later): an SSE stream starts with a priming event. */
  priming: boolean;
  /** The bounded writer, once the response is an SSE stream. */
  writer: SseWriter | undefined;
  /** While a slower POST's answer may still go out as JSON: the timer that makes it an SSE stream (`sseAfterMs`). */
  grace?: NodeJS.Timeout | undefined;
}

type AuthedRequest = IncomingMessage & { auth?: AuthInfo };

export class SessionTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage, extra?: MessageExtraInfo) => void;

  /** Set once the session is initialized; the SDK server reads it for every handler's `extra.sessionId`. */
  sessionId: string | undefined;

  private readonly options: SessionTransportOptions;
  private readonly events: SessionEventStore;
  private readonly keepAliveMs: number;
  private started = false;
  private initialized = false;
  private closed = false;
  /** Open SSE responses by stream id (a POST's own stream, or the GET stream). */
  private readonly streams = new Map<string, Stream>();
  /** Which stream a client request's messages and response go to. */
  private readonly requestStream = new Map<RequestId, string>();
  /** Request streams whose client holds an event id (it can resume them), so a response is kept for replay. */
  private readonly resumable = new Set<string>();
  /** Responses ready for a POST whose other requests are still running. */
  private readonly responses = new Map<RequestId, JSONRPCMessage>();
  /** Told when one of the session's streams ends (PROTOCOL.md §19: a question in flight on it may move). */
  private readonly streamEndListeners = new Set<() => void>();

  constructor(options: SessionTransportOptions) {
    this.options = options;
    this.events = options.events;
    this.keepAliveMs = options.keepAliveMs ?? KEEP_ALIVE_MS;
  }

  start(): Promise<void> {
    if (this.started) throw new Error('Transport already started');
    this.started = true;
    return Promise.resolve();
  }

  /** Serves one request of this session: POST (with its parsed body), GET or DELETE. */
  handleRequest(req: AuthedRequest, res: ServerResponse, parsedBody?: unknown): Promise<void> {
    if (this.closed) jsonError(res, 404, JSON_RPC.SESSION_NOT_FOUND, 'Session not found');
    else if (req.method === 'POST') this.handlePost(req, res, parsedBody);
    else if (req.method === 'GET') this.handleGet(req, res);
    else if (req.method === 'DELETE') this.handleDelete(req, res);
    else {
      res.setHeader('Allow', 'GET, POST, DELETE');
      jsonError(res, 405, JSON_RPC.SERVER_ERROR, 'Method not allowed.');
    }
    return Promise.resolve();
  }

  private handlePost(req: AuthedRequest, res: ServerResponse, body: unknown): void {
    const read = readPost(req.headers.accept, body, this.initialized);
    if ('refused' in read) return this.fail(res, read.refused.status, read.refused.code, read.refused.message);
    const { messages, initialize } = read;
    if (initialize) {
      this.sessionId = this.options.sessionId;
      this.initialized = true;
      this.options.onsessioninitialized?.(this.sessionId);
    } else {
      if (!this.validSession(req, res) || !this.validVersion(req, res)) return;
    }
    const only = messages.length === 1 ? messages[0] : undefined;
    if (only !== undefined && isRequest(only) && only.method === 'resources/read' && this.sessionId !== undefined) {
      const taken = this.options.streamedRead?.(only, res, { 'mcp-session-id': this.sessionId });
      if (taken) {
        taken.catch((error: unknown) => this.onerror?.(error instanceof Error ? error : new Error(String(error))));
        return;
      }
    }
    const extra = this.extraOf(req);
    if (!messages.some(isRequest)) {
      // Only notifications and responses: accepted, nothing to stream.
      res.writeHead(202).end();
      for (const message of messages) this.onmessage?.(message, extra);
      return;
    }
    const requests = messages.filter(isRequest);
    // A second request with an id in flight is refused; the first goes on.
    const duplicate = duplicateRequest(requests, this.requestStream);
    if (duplicate) {
      this.onerror?.(new Error(`duplicate request id ${JSON.stringify(duplicate.id)}`));
      res.writeHead(400, { 'Content-Type': 'application/json' }).end(duplicateAnswer(duplicate.id));
      return;
    }
    const streamId = randomUUID();
    const version = initialize ? initialize.params.protocolVersion : header(req, 'mcp-protocol-version');
    // Clients of 2025-11-25 and later can resume from the priming event's id before any message arrived.
    const resumable = (version ?? DEFAULT_NEGOTIATED_PROTOCOL_VERSION) >= '2025-11-25';
    const { answersAtOnce, sseAfterMs } = this.options;
    const atOnce = answersAtOnce !== undefined && requests.every((r) => answersAtOnce(r));
    const stream: Stream = {
      res,
      keepAlive: undefined,
      state: atOnce || sseAfterMs !== undefined ? 'json' : 'sse',
      priming: resumable,
      writer: undefined,
    };
    this.streams.set(streamId, stream);
    for (const request of requests) this.requestStream.set(request.id, streamId);
    res.on('close', () => this.onStreamClosed(streamId, stream));
    if (stream.state === 'sse') this.startSse(streamId, stream);
    else if (!atOnce && sseAfterMs !== undefined) {
      stream.grace = setTimeout(() => {
        stream.grace = undefined;
        if (stream.state === 'json' && this.streams.get(streamId) === stream && !res.destroyed) {
          this.startSse(streamId, stream);
        }
      }, sseAfterMs);
      stream.grace.unref();
    }
    for (const message of messages) {
      this.onmessage?.(
        message,
        resumable && isRequest(message)
          ? {
              ...extra,
              closeSSEStream: () => this.closeSSEStream(message.id),
              closeStandaloneSSEStream: () => this.closeStandaloneSSEStream(),
            }
          : extra,
      );
    }
  }

  /** Turns a POST's response into an SSE stream: headers, the priming event (resumable clients), keep-alives. */
  private startSse(streamId: string, stream: Stream): void {
    clearTimeout(stream.grace);
    stream.state = 'sse';
    const headers: Record<string, string> = { ...SSE_HEADERS };
    if (this.sessionId !== undefined) headers['mcp-session-id'] = this.sessionId;
    stream.res.writeHead(200, headers);
    stream.writer = this.writerFor(stream.res);
    if (stream.priming) {
      const id = this.events.storeJson(streamId, '{}');
      stream.writer.write(`id: ${id}\nevent: priming\ndata: \n\n`);
      this.resumable.add(streamId);
    } else {
      stream.res.flushHeaders();
    }
    stream.keepAlive = this.keepAlive(stream.writer);
  }

  private handleGet(req: AuthedRequest, res: ServerResponse): void {
    if (!req.headers.accept?.includes('text/event-stream')) {
      return this.fail(res, 406, JSON_RPC.SERVER_ERROR, 'Not Acceptable: Client must accept text/event-stream');
    }
    if (!this.validSession(req, res) || !this.validVersion(req, res)) return;
    const lastEventId = header(req, 'last-event-id');
    if (lastEventId) return this.replay(lastEventId, res);
    if (this.streams.has(STANDALONE_STREAM_ID)) {
      return this.fail(res, 409, JSON_RPC.SERVER_ERROR, 'Conflict: Only one SSE stream is allowed per session');
    }
    this.openSse(res);
    const writer = this.writerFor(res);
    const stream: Stream = { res, keepAlive: this.keepAlive(writer), state: 'sse', priming: true, writer };
    this.streams.set(STANDALONE_STREAM_ID, stream);
    res.on('close', () => this.onStreamClosed(STANDALONE_STREAM_ID, stream));
  }

  /** A GET with Last-Event-ID: the events after it, then the stream goes on live on this response. */
  private replay(lastEventId: string, res: ServerResponse): void {
    const streamId = this.events.streamOf(lastEventId);
    if (streamId === undefined) return this.fail(res, 400, JSON_RPC.SERVER_ERROR, 'Invalid event ID format');
    // A stream still registered is taken over, not refused (the SDK answers 409): a client resumes as soon as its
    // connection drops, often before this process has seen that close.
    this.openSse(res);
    // Synchronous: nothing can be stored for this stream between the replay and its registration below. The replay is
    // written as it is: it is bounded by the event store's cap, and the live stream after it by the writer's.
    this.events.replayJsonAfter(lastEventId, (eventId, json) => writeEvent(res, eventId, json));
    if (this.closed || res.destroyed) {
      res.end();
      return;
    }
    // A reconnect re-registers the stream id: the predecessor's response ends, once its successor is registered (so
    // the stream is never seen closed in between, PROTOCOL.md §19).
    const previous = this.streams.get(streamId);
    const writer = this.writerFor(res);
    const stream: Stream = { res, keepAlive: this.keepAlive(writer), state: 'sse', priming: true, writer };
    this.streams.set(streamId, stream);
    if (previous) this.endStream(streamId, previous);
    this.resumable.add(streamId);
    res.on('close', () => this.onStreamClosed(streamId, stream));
  }

  private handleDelete(req: AuthedRequest, res: ServerResponse): void {
    if (!this.validSession(req, res) || !this.validVersion(req, res)) return;
    try {
      this.options.onsessionclosed?.(this.sessionId ?? this.options.sessionId);
      res.writeHead(200).end();
    } finally {
      void this.close();
    }
  }

  async send(raw: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    const message = this.options.filter ? this.options.filter(raw) : raw;
    const isResponse = 'result' in message || 'error' in message;
    const requestId = isResponse ? message.id : options?.relatedRequestId;
    if (requestId === undefined) {
      if (isResponse) {
        throw new Error('Cannot send a response on a standalone SSE stream unless resuming a previous client request');
      }
      // Kept even while no GET stream is open, for a replay on reconnect.
      const json = JSON.stringify(message);
      const eventId = this.events.storeJson(STANDALONE_STREAM_ID, json);
      const standalone = this.streams.get(STANDALONE_STREAM_ID);
      if (standalone?.writer) writeLive(standalone.writer, eventId, json, message);
      return;
    }
    const streamId = this.requestStream.get(requestId);
    if (streamId === undefined) throw new Error(`No connection established for request ID: ${String(requestId)}`);
    const stream = this.streams.get(streamId);
    if (!isResponse) {
      // Something other than the answer: the response becomes an SSE stream, if it was still to be JSON.
      if (stream?.state === 'json') this.startSse(streamId, stream);
      this.sendEvent(streamId, stream, message, false);
      return;
    }
    this.responses.set(requestId, message);
    const related = [...this.requestStream].filter(([, sid]) => sid === streamId).map(([id]) => id);
    const last = related.every((id) => this.responses.has(id));
    if (stream?.state === 'json') {
      if (!last) return;
      const answers = related.map((id) => this.responses.get(id));
      clearTimeout(stream.grace);
      this.releaseRequests(related);
      this.streams.delete(streamId);
      const headers: Record<string, string> = { 'Content-Type': 'application/json' };
      if (this.sessionId !== undefined) headers['mcp-session-id'] = this.sessionId;
      if (!stream.res.writableEnded && !stream.res.destroyed) {
        stream.res.writeHead(200, headers).end(JSON.stringify(answers.length === 1 ? answers[0] : answers));
      }
      return;
    }
    this.sendEvent(streamId, stream, message, last);
    if (!last) return;
    this.releaseRequests(related);
    const wasResumable = this.resumable.delete(streamId);
    if (stream) {
      // Every response of the POST is out: its stream has ended with the last one.
      clearInterval(stream.keepAlive);
      if (this.streams.get(streamId) === stream) this.streams.delete(streamId);
      return;
    }
    // The stream went away. A client holding an event id gets the response by replay; otherwise it is undeliverable.
    if (this.closed || wasResumable) return;
    throw new Error(`No connection established for request ID: ${String(requestId)}`);
  }

  /** Stores a message for replay and writes it on the stream if it is open; `end` ends the response with it. */
  private sendEvent(streamId: string, stream: Stream | undefined, message: JSONRPCMessage, end: boolean): void {
    // Kept even when the stream is gone (a disconnect, closeSSEStream, an overflow), so a resume replays it.
    const json = JSON.stringify(message);
    const eventId = this.events.storeJson(streamId, json);
    const writer = stream?.writer;
    if (!writer?.open) return;
    if (end) writer.end(eventText(eventId, json));
    else writeLive(writer, eventId, json, message);
    this.resumable.add(streamId);
  }

  private writerFor(res: ServerResponse): SseWriter {
    const { maxStreamBufferBytes, onStreamOverflow, onProgressCoalesced, streamBuffers, principal } = this.options;
    return new SseWriter(res, {
      ...(streamBuffers === undefined ? {} : { buffers: streamBuffers, principal: principal ?? '' }),
      ...(maxStreamBufferBytes === undefined ? {} : { maxBufferedBytes: maxStreamBufferBytes }),
      ...(onStreamOverflow ? { onOverflow: onStreamOverflow } : {}),
      ...(onProgressCoalesced ? { onCoalesced: onProgressCoalesced } : {}),
    });
  }

  private releaseRequests(ids: RequestId[]): void {
    for (const id of ids) {
      this.responses.delete(id);
      this.requestStream.delete(id);
    }
  }

  close(): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.closed = true;
    for (const [streamId, stream] of [...this.streams]) this.endStream(streamId, stream);
    this.streams.clear();
    this.responses.clear();
    this.resumable.clear();
    this.onclose?.();
    return Promise.resolve();
  }

  /**
   * Whether the stream that messages related to `relatedRequestId` (the GET stream when undefined) go to is open on a
   * live connection now; a stream resumed with Last-Event-ID is open again (PROTOCOL.md §19).
   */
  isStreamOpen(relatedRequestId?: RequestId): boolean {
    const streamId = relatedRequestId === undefined ? STANDALONE_STREAM_ID : this.requestStream.get(relatedRequestId);
    const stream = streamId === undefined ? undefined : this.streams.get(streamId);
    return stream !== undefined && !stream.res.destroyed && !stream.res.writableEnded;
  }

  /** Calls `listener` each time a stream of this session ends (closed by the client or ended here); returns the stop. */
  onStreamEnded(listener: () => void): () => void {
    this.streamEndListeners.add(listener);
    return () => this.streamEndListeners.delete(listener);
  }

  private streamEnded(): void {
    // A closing session ends all its streams: nothing is to move then.
    if (this.closed) return;
    for (const listener of this.streamEndListeners) listener();
  }

  /** Ends a request's SSE stream; the client reconnects with Last-Event-ID (polling during long operations). */
  closeSSEStream(requestId: RequestId): void {
    const streamId = this.requestStream.get(requestId);
    const stream = streamId === undefined ? undefined : this.streams.get(streamId);
    if (streamId !== undefined && stream?.state === 'sse') this.endStream(streamId, stream);
  }

  /** Ends the GET stream; the client reconnects. */
  closeStandaloneSSEStream(): void {
    const stream = this.streams.get(STANDALONE_STREAM_ID);
    if (stream) this.endStream(STANDALONE_STREAM_ID, stream);
  }

  private extraOf(req: AuthedRequest): MessageExtraInfo {
    const extra: MessageExtraInfo = {
      requestInfo: {
        headers: req.headers,
        get url() {
          return new URL(req.url ?? '/', `http://${req.headers.host ?? 'localhost'}`);
        },
      },
    };
    if (req.auth) extra.authInfo = req.auth;
    return extra;
  }

  private validSession(req: IncomingMessage, res: ServerResponse): boolean {
    if (!this.initialized) {
      this.fail(res, 400, JSON_RPC.SERVER_ERROR, 'Bad Request: Server not initialized');
      return false;
    }
    const sessionId = header(req, 'mcp-session-id');
    if (!sessionId) {
      this.fail(res, 400, JSON_RPC.SERVER_ERROR, 'Bad Request: Mcp-Session-Id header is required');
      return false;
    }
    if (sessionId !== this.sessionId) {
      this.fail(res, 404, JSON_RPC.SESSION_NOT_FOUND, 'Session not found');
      return false;
    }
    return true;
  }

  private validVersion(req: IncomingMessage, res: ServerResponse): boolean {
    const version = header(req, 'mcp-protocol-version');
    if (version === undefined || SUPPORTED_PROTOCOL_VERSIONS.includes(version)) return true;
    this.fail(
      res,
      400,
      JSON_RPC.SERVER_ERROR,
      `Bad Request: Unsupported protocol version: ${version} (supported versions: ${SUPPORTED_PROTOCOL_VERSIONS.join(', ')})`,
    );
    return false;
  }

  private openSse(res: ServerResponse): void {
    const headers: Record<string, string> = { ...SSE_HEADERS };
    if (this.sessionId !== undefined) headers['mcp-session-id'] = this.sessionId;
    res.writeHead(200, headers);
    res.flushHeaders();
  }

  private keepAlive(writer: SseWriter): NodeJS.Timeout | undefined {
    if (this.closed || !(this.keepAliveMs >= 1)) return undefined;
    const timer = setInterval(() => {
      if (!writer.open) clearInterval(timer);
      // A client that is behind has bytes to read already: a keep-alive would only add to them.
      else if (!writer.behind) writer.write(': keepalive\n\n');
    }, this.keepAliveMs);
    timer.unref();
    return timer;
  }

  private endStream(streamId: string, stream: Stream): void {
    clearInterval(stream.keepAlive);
    clearTimeout(stream.grace);
    if (this.streams.get(streamId) === stream) this.streams.delete(streamId);
    // A response still to be JSON has no stream to end: the session is gone before its answer.
    if (stream.state === 'json') jsonError(stream.res, 404, JSON_RPC.SESSION_NOT_FOUND, 'Session not found');
    else if (stream.writer) stream.writer.end();
    else if (!stream.res.writableEnded) stream.res.end();
    this.streamEnded();
  }

  /** The client closed the response: only this stream's registration goes (a resume may have replaced it). */
  private onStreamClosed(streamId: string, stream: Stream): void {
    clearInterval(stream.keepAlive);
    clearTimeout(stream.grace);
    if (this.streams.get(streamId) === stream) this.streams.delete(streamId);
    this.streamEnded();
  }

  private fail(res: ServerResponse, status: number, code: number, message: string): void {
    this.onerror?.(new Error(message));
    jsonError(res, status, code, message);
  }
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** One SSE `message` event, framed as the SDK frames it. */
function eventText(eventId: string, json: string): string {
  return `event: message\nid: ${eventId}\ndata: ${json}\n\n`;
}

function writeEvent(res: ServerResponse, eventId: string, json: string): void {
  if (!res.writableEnded && !res.destroyed) res.write(eventText(eventId, json));
}

/** A live event on a bounded stream: progress is coalesced per token while the client is behind (§22.1). */
function writeLive(writer: SseWriter, eventId: string, json: string, message: JSONRPCMessage): void {
  const text = eventText(eventId, json);
  if ('method' in message && message.method === 'notifications/progress' && !('id' in message)) {
    writer.writeLatest(`progress:${JSON.stringify(message.params?.['progressToken'])}`, text);
  } else {
    writer.write(text);
  }
}

function jsonError(res: ServerResponse, status: number, code: number, message: string): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const body = JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null });
  res.writeHead(status, { 'Content-Type': 'application/json' }).end(body);
}

/**
 * The 2026-07-28 Streamable HTTP transport on the same `/mcp` endpoint (PROTOCOL.md §14, §16): every request stands
 * alone — no `initialize`, no session, no GET stream — and carries the client's capabilities in its `_meta`. A thin
 * adapter: it checks this era's headers and `_meta` keys, builds the request's context, calls the method layer
 * (`protocol/methods.ts`, the same methods the 2025-11-25 sessions call), and frames the answer as one JSON body or,
 * once a progress notification must go out first, as an SSE stream. Written on express rather than the v2 SDK: v2
 * serves this era but has no task runtime, and taskrelay needs one task store and one set of flows for both eras.
 */
import type { Request, Response } from 'express';
import { z } from 'zod';
import { McpError, type JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC, type Logger, type ProgressToken } from '@taskrelay/shared';
import { WireError, toWireErrorObject } from '../../wire/errors.js';
import { sanitizeOutgoing } from '../../http/safe-errors.js';
import { writeStreamedRead } from '../../http/resource-body.js';
import { SseWriter, type SseWriterOptions } from '../../http/sse-writer.js';
import type { InflightCalls } from '../../protocol/inflight-calls.js';
import { CatalogChanges } from '../../protocol/catalog-changes.js';
import {
  SESSIONLESS_VERSIONS,
  type McpMethods,
  type RequestContext,
  type Result,
  type ToolCallParams,
} from '../../protocol/methods.js';
import { checkParamHeaders, decodeHeaderValue } from './param-headers.js';
import { createListenStreams } from './listen-stream.js';
import type { TaskService } from '../../tasks/task-service.js';
import {
  CLIENT_CAPABILITIES_META_KEY,
  declaresTasksExtension,
  requestClientCapabilities,
} from '../../wire/task-wire-ext.js';

export const MODERN_PROTOCOL_VERSION = '2026-07-28';
export const PROTOCOL_VERSION_META_KEY = 'io.modelcontextprotocol/protocolVersion';

/** JSON-RPC codes of the 2026-07-28 transport. */

export interface ModernEndpointOptions {
  methods: McpMethods;
  service: TaskService;
  log: Logger;
  inflight: InflightCalls;
  /** The bound of each SSE response (PROTOCOL.md §22.1): `TASKRELAY_MAX_STREAM_BUFFER_BYTES` and its counters. */
  streams?: SseWriterOptions;
  /** Told when a `subscriptions/listen` stream opens and closes (the memory budget, §22.2). Default: none. */
  listens?: { opened: () => void; closed: () => void };
}

type Params = Record<string, unknown> & { _meta?: Record<string, unknown> };

interface Rpc {
  id: string | number;
  method: string;
  params: Params;
  principal: string;
  req: Request;
  res: Response;
}

/** The signal of a request nothing cancels (the task methods answer at once). */
const never = new AbortController().signal;

type Handler = (rpc: Rpc) => Promise<Result | undefined>;

const RequestSchema = z.object({
  jsonrpc: z.literal('2.0'),
  id: z.union([z.string(), z.number().int()]).optional(),
  method: z.string().min(1),
  params: z.record(z.string(), z.unknown()).optional(),
});

/** Which body field `Mcp-Name` mirrors, per method (SEP-2243, SEP-2663 routing headers). */
const NAME_FIELD: Record<string, string> = {
  'tools/call': 'name',
  'prompts/get': 'name',
  'resources/read': 'uri',
  'tasks/get': 'taskId',
  'tasks/update': 'taskId',
  'tasks/cancel': 'taskId',
};

/**
 * Methods the 2026-07-28 revision (and its tasks extension) removed: answered 404 -32601 like an unknown method, with a
 * message saying what replaced them (PROTOCOL.md §16.2).
 */
const REMOVED: ReadonlyMap<string, string> = new Map([
  ['initialize', 'there is no initialization: send server/discover, and each request carries its capabilities'],
  ['ping', 'there is no ping'],
  ['logging/setLevel', 'a request sets its own log level'],
  ['resources/subscribe', 'use subscriptions/listen'],
  ['resources/unsubscribe', 'close the subscriptions/listen stream'],
  ['tasks/result', 'use tasks/get'],
  ['tasks/list', 'use tasks/get'],
]);

export function createModernEndpoint(options: ModernEndpointOptions) {
  const { methods, service, log } = options;
  let requests = 0;
  // Errors that reveal nothing (SECURITY.md): the same filter as the 2025-era sessions' transport.
  const outgoing: Outgoing = (message) => sanitizeOutgoing(message as JSONRPCMessage, log, undefined);
  const catalogChanges = new CatalogChanges({ list: () => service.listTools() });

  // Unique per request on this gateway: sessionless ids may repeat across clients.
  const context = (rpc: Rpc, call?: { stream: SseResponse | undefined }) =>
    requestContext(rpc, `modern:${++requests}`, call);

  const handlers: Record<string, Handler> = {
    'server/discover': () => Promise.resolve(methods.discover()),
    'tools/list': () => methods.listTools({ era: '2026-07-28' }),
    'tools/call': (rpc) => callTool(rpc),
    // taskrelay serves no prompts: an empty list, with SEP-2549's caching hints (PROTOCOL.md §14.1). Its resources
    // are task output (§34): templates to read, none listed.
    'prompts/list': () => Promise.resolve(methods.emptyList('prompts', { era: '2026-07-28' })),
    'resources/list': () => Promise.resolve(methods.emptyList('resources', { era: '2026-07-28' })),
    'resources/templates/list': () => Promise.resolve(methods.listResourceTemplates({ era: '2026-07-28' })),
    'prompts/get': (rpc) => Promise.reject(methods.unknownPrompt(rpc.params['name'])),
    'resources/read': (rpc) => readResource(rpc),
    'tasks/get': (rpc) => methods.getTask(context(rpc), taskIdOf(rpc)),
    'tasks/update': (rpc) => {
      const responses = rpc.params['inputResponses'];
      if (!isObject(responses))
        throw new WireError(JSON_RPC.INVALID_PARAMS, 'tasks/update needs params.inputResponses, an object');
      return methods.updateTask(context(rpc), taskIdOf(rpc), responses);
    },
    'tasks/cancel': (rpc) => methods.cancelTask(context(rpc), taskIdOf(rpc)),
    'subscriptions/listen': (rpc) => listen(rpc),
  };

  /** `subscriptions/listen` (PROTOCOL.md §14, §18): a push fed by the task router; see listen-stream.ts. */
  const listenStreams = createListenStreams({
    service,
    inflight: options.inflight,
    catalogChanges,
    log,
    render: (record) => methods.detailedTask(record),
    subscribeResource: (principal, uri, onUpdated) => methods.subscribeResource({ principal }, uri, onUpdated),
    outgoing,
    ...(options.streams ? { streams: options.streams } : {}),
    ...(options.listens ? { listens: options.listens } : {}),
  });
  async function listen(rpc: Rpc): Promise<Result | undefined> {
    await listenStreams(rpc);
    return undefined;
  }

  /**
   * `tools/call`: its params checked, then the method layer. With a progress token and an SSE-accepting client the
   * answer may become a stream (progress first, the result last); a closed stream is the call's cancel.
   */
  async function callTool(rpc: Rpc): Promise<Result | undefined> {
    const params = callParams(rpc.params);
    const streams = rpc.params._meta?.['progressToken'] !== undefined && acceptsEventStream(rpc.req);
    const stream = streams
      ? new SseResponse(rpc.res, outgoing, { ...options.streams, principal: rpc.principal })
      : undefined;
    const ctx = context(rpc, { stream });
    const call = methods.callTool(ctx, params);
    // Until a notification went out, the answer is one JSON body like any other (errors with their HTTP status).
    if (!stream) return call;
    return answerOnStream(rpc.id, ctx.signal, stream, call);
  }

  /** `resources/read` (§34.3): the output as one JSON body; a stored value written as it is read. */
  async function readResource(rpc: Rpc): Promise<Result | undefined> {
    const era = '2026-07-28';
    const read = await methods.readResource({ principal: rpc.principal, era }, rpc.params['uri']);
    if (read.kind === 'inline') return read.result;
    await writeStreamedRead(rpc.res, rpc.id, read.value, { resultType: 'complete', ...methods.cachingHints({ era }) });
    return undefined;
  }

  /** Handles one POST whose `MCP-Protocol-Version` is not a 2025-era version. */
  return async function handle(req: Request, res: Response, principal: string): Promise<void> {
    const header = (req.header('mcp-protocol-version') ?? '').trim();
    const parsed = RequestSchema.safeParse(req.body);
    if (!parsed.success) return send(res, 400, invalidRequest(req.body), outgoing);
    const { id, method } = parsed.data;
    const params: Params = parsed.data.params ?? {};
    const fail = (status: number, code: number, message: string, data?: unknown) =>
      send(
        res,
        status,
        { jsonrpc: '2.0', id: id ?? null, error: data === undefined ? { code, message } : { code, message, data } },
        outgoing,
      );

    if (header !== MODERN_PROTOCOL_VERSION) {
      return fail(400, JSON_RPC.UNSUPPORTED_PROTOCOL_VERSION, 'Unsupported protocol version', {
        supported: SESSIONLESS_VERSIONS,
        requested: header,
      });
    }
    // A notification (no id) gets no answer on this transport; nothing taskrelay serves needs one.
    if (id === undefined) {
      res.status(202).end();
      return;
    }
    const handler = handlers[method];
    const refused = refusalOf(req, header, method, params, handler !== undefined);
    if (refused) return fail(refused.status, refused.code, refused.message);
    if (!handler) return;
    await respond(handler, { id, method, params, principal, req, res }, log, outgoing);
  };
}

/** The answer to a body that is not one JSON-RPC request: a batch, or anything else. */
function invalidRequest(body: unknown): object {
  const detail = Array.isArray(body) ? 'batches are not supported' : 'the body must be one JSON-RPC 2.0 request object';
  return { jsonrpc: '2.0', id: null, error: { code: JSON_RPC.INVALID_REQUEST, message: `Invalid Request: ${detail}` } };
}

/** Runs the request's method and sends its answer as one JSON body, unless the method answered on a stream. */
async function respond(handler: Handler, rpc: Rpc, log: Logger, outgoing: Outgoing): Promise<void> {
  const { id, method, res } = rpc;
  try {
    const result = await handler(rpc);
    if (result === undefined || res.headersSent) return;
    send(res, 200, { jsonrpc: '2.0', id, result: withResultType(result) }, outgoing);
  } catch (error) {
    if (!(error instanceof McpError)) log.debug({ err: error, method }, 'request failed');
    if (res.headersSent) return;
    const body = errorObject(error);
    // A capability the client did not declare is a 400 on this transport (SEP-2575).
    // A header that does not match the body is one too (SEP-2243).
    const status =
      body.code === JSON_RPC.MISSING_CLIENT_CAPABILITY || body.code === JSON_RPC.HEADER_MISMATCH ? 400 : 200;
    send(res, status, { jsonrpc: '2.0', id, error: body }, outgoing);
  }
}

/** `tools/call`'s params, checked. A legacy `params.task` is tolerated and ignored: the server decides (SEP-2663). */
function callParams(params: Params): ToolCallParams {
  const name = params['name'];
  if (typeof name !== 'string') throw new WireError(JSON_RPC.INVALID_PARAMS, 'tools/call needs params.name, a string');
  const args = params['arguments'] ?? {};
  if (!isObject(args)) throw new WireError(JSON_RPC.INVALID_PARAMS, 'tools/call params.arguments must be an object');
  const requestState = params['requestState'];
  if (requestState !== undefined && typeof requestState !== 'string') {
    throw new WireError(JSON_RPC.INVALID_PARAMS, 'tools/call params.requestState must be a string');
  }
  const inputResponses = params['inputResponses'];
  if (inputResponses !== undefined && !isObject(inputResponses)) {
    throw new WireError(JSON_RPC.INVALID_PARAMS, 'tools/call params.inputResponses must be an object');
  }
  return { name, arguments: args, requestState, inputResponses };
}

/**
 * The answer of a call that may stream: until a notification went out it is still one JSON body (returned, errors
 * thrown); once the stream started, the result or error is its last event, and nothing is sent after the client
 * closed it (the call's cancel).
 */
async function answerOnStream(
  id: string | number,
  signal: AbortSignal,
  stream: SseResponse,
  call: Promise<Result>,
): Promise<Result | undefined> {
  let result: Result;
  try {
    result = await call;
  } catch (error) {
    if (!stream.started) throw error;
    if (!signal.aborted) stream.end({ jsonrpc: '2.0', id, error: errorObject(error) });
    return undefined;
  }
  if (!stream.started) return result;
  if (!signal.aborted) stream.end({ jsonrpc: '2.0', id, result: withResultType(result) });
  return undefined;
}

/**
 * The request's context: always the extension's rendering when declared (this era has no other), the capabilities
 * its `_meta` declares, and its response stream's close as its cancel (MUST; PROTOCOL.md §14). `scope` names the
 * request on this gateway.
 */
function requestContext(rpc: Rpc, scope: string, call?: { stream: SseResponse | undefined }): RequestContext {
  const meta = rpc.params._meta;
  let signal = never;
  if (call) {
    // Only a call is cancelled by its closed stream; the task methods answer at once and need no signal.
    const closed = new AbortController();
    rpc.res.once('close', () => {
      if (!rpc.res.writableFinished) closed.abort();
    });
    signal = closed.signal;
  }
  const stream = call?.stream;
  const token = meta?.['progressToken'] as ProgressToken | undefined;
  return {
    era: '2026-07-28',
    principal: rpc.principal,
    sessionId: undefined,
    scope,
    requestId: rpc.id,
    rendering: declaresTasksExtension(meta) ? 'extension' : undefined,
    meta,
    clientCapabilities: requestClientCapabilities(meta),
    signal,
    progress:
      stream && token !== undefined
        ? {
            token,
            // Coalesced while the client is behind: its stream stays bounded and is never closed for progress.
            send: (progress) =>
              Promise.resolve(
                stream.sendLatest('progress', { jsonrpc: '2.0', method: 'notifications/progress', params: progress }),
              ),
          }
        : undefined,
    // SEP-2243: arguments the tool mirrors into headers must match them (PROTOCOL.md §16.2).
    checkCall: (tool, args) => {
      const mismatch = checkParamHeaders((header) => rpc.req.header(header), tool.inputSchema, args);
      if (mismatch !== undefined) throw new WireError(JSON_RPC.HEADER_MISMATCH, `Header mismatch: ${mismatch}`);
    },
  };
}

/** An HTTP status and JSON-RPC error for a request this transport refuses before any method runs. */
interface Refusal {
  status: number;
  code: number;
  message: string;
}

const refusal = (status: number, code: number, message: string): Refusal => ({ status, code, message });

/**
 * The checks of a 2026-07-28 request before its method runs (PROTOCOL.md §16.2): the routing headers mirror the
 * body (SEP-2243), a removed or unknown method is a 404 (SEP-2575), and the `_meta` keys the era requires are there.
 */
function refusalOf(req: Request, header: string, method: string, params: Params, known: boolean): Refusal | undefined {
  // Routing headers mirror the body, so intermediaries can route without parsing it (SEP-2243).
  const methodHeader = req.header('mcp-method')?.trim();
  if (methodHeader !== method) {
    return refusal(
      400,
      JSON_RPC.HEADER_MISMATCH,
      methodHeader === undefined
        ? 'Mcp-Method header is required'
        : `Mcp-Method header (${methodHeader}) does not match the body method (${method})`,
    );
  }
  // The transport's HTTP status for an unknown or removed method is 404 (SEP-2575).
  const removed = REMOVED.get(method);
  if (removed !== undefined) {
    return refusal(
      404,
      JSON_RPC.METHOD_NOT_FOUND,
      `Method not found: ${method} is not part of ${MODERN_PROTOCOL_VERSION}; ${removed}`,
    );
  }
  if (!known) return { status: 404, code: JSON_RPC.METHOD_NOT_FOUND, message: `Method not found: ${method}` };
  const meta = params._meta;
  const missing = [PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY].filter((k) => meta?.[k] === undefined);
  if (missing.length > 0)
    return refusal(400, JSON_RPC.INVALID_PARAMS, `Invalid params: missing _meta keys: ${missing.join(', ')}`);
  if (meta?.[PROTOCOL_VERSION_META_KEY] !== header) {
    return refusal(400, JSON_RPC.HEADER_MISMATCH, 'MCP-Protocol-Version header does not match _meta.protocolVersion');
  }
  const nameField = NAME_FIELD[method];
  const bodyName = nameField === undefined ? undefined : params[nameField];
  if (typeof bodyName === 'string') {
    const rawName = req.header('mcp-name');
    const nameHeader = rawName === undefined ? undefined : decodeHeaderValue(rawName);
    if (nameHeader !== bodyName) {
      return refusal(
        400,
        JSON_RPC.HEADER_MISMATCH,
        rawName === undefined
          ? `Mcp-Name header is required for ${method}`
          : `Mcp-Name header does not match params.${nameField ?? 'name'}`,
      );
    }
  }
  return undefined;
}

function taskIdOf(rpc: Rpc): string {
  const taskId = rpc.params['taskId'];
  if (typeof taskId !== 'string')
    throw new WireError(JSON_RPC.INVALID_PARAMS, `${rpc.method} needs params.taskId, a string`);
  return taskId;
}

function errorObject(error: unknown): { code: number; message: string; data?: unknown } {
  return toWireErrorObject(error);
}

function acceptsEventStream(req: Request): boolean {
  return (req.header('accept') ?? '').includes('text/event-stream');
}

/** The outgoing filter of every message this transport sends (PROTOCOL.md §16: one filtered send). */
type Outgoing = (message: object) => object;

function send(res: Response, status: number, body: object, outgoing: Outgoing): void {
  res.status(status).json(outgoing(body));
}

function withResultType(result: Result): Result {
  return { ...result, resultType: result['resultType'] ?? 'complete' };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * A response that became an SSE stream: notifications, then the response, then the end. Bounded (§22.1): values sent
 * with `sendLatest` are coalesced while the client is behind; a stream that would pass its bound otherwise is closed.
 */
class SseResponse {
  /** Whether the response is a stream already (a notification went out); until then it can still be one JSON body. */
  started = false;
  private readonly writer: SseWriter;

  constructor(
    private readonly res: Response,
    private readonly outgoing: Outgoing,
    options: SseWriterOptions = {},
  ) {
    this.writer = new SseWriter(res, options);
  }

  /** Sends `message`, or keeps it as the newest value of `key` while the client is behind. */
  sendLatest(key: string, message: object): void {
    if (!this.writer.open) return;
    this.start();
    this.writer.writeLatest(key, eventText(this.outgoing(message)));
  }

  /** The last event: the response, once the stream started. */
  end(message: object): void {
    this.writer.end(eventText(this.outgoing(message)));
  }

  private start(): void {
    if (this.started) return;
    this.started = true;
    this.res.status(200).set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    this.res.flushHeaders();
  }
}

function eventText(message: object): string {
  return `event: message\ndata: ${JSON.stringify(message)}\n\n`;
}

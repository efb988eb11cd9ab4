/**
 * The 2026-07-28 Streamable HTTP transport on the same `/mcp` endpoint (PROTOCOL.md §14): every request stands alone
 * — no `initialize`, no session, no GET stream — and carries the client's capabilities in its `_meta`. Written here
 * as a small JSON-RPC path over the same TaskService as the 2025-11-25 sessions, rather than with the v2 SDK: v2
 * serves this era but has no task runtime, and taskrelay needs one task store and one set of flows for both eras.
 */
import { randomUUID } from 'node:crypto';
import type { Request, Response } from 'express';
import { z } from 'zod';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { TaskrelayError, isTerminal, type Logger, type ProgressToken, type TaskRecord } from '@taskrelay/shared';
import { WireError, callEndedByShutdown, toMcpError } from '../../wire/errors.js';
import { capResult } from '../../http/limits.js';
import type { GatewayMetrics } from '../../ops/metrics.js';
import { sanitizeOutgoing } from '../../http/safe-errors.js';
import { SseWriter, type SseWriterOptions } from '../../http/sse-writer.js';
import type { InflightCalls } from '../../protocol/inflight-calls.js';
import { idempotencyKeyOf } from '../../protocol/request-meta.js';
import { CatalogChanges } from '../../protocol/catalog-changes.js';
import { inputRequiredResult } from '../../protocol/mrtr.js';
import type { RequestStateSigner } from '../../protocol/request-state.js';
import { checkParamHeaders, decodeHeaderValue } from './param-headers.js';
import { createListenStreams } from './listen-stream.js';
import type { ProgressParams } from '../../tasks/task-router.js';
import type { TaskService } from '../../tasks/task-service.js';
import { renderResult } from '../../wire/task-wire.js';
import { WEBHOOK_META_KEY } from '../../ops/webhooks/url-policy.js';
import {
  CLIENT_CAPABILITIES_META_KEY,
  MISSING_CLIENT_CAPABILITY,
  TASKS_EXTENSION_ID,
  declaresTasksExtension,
  renderCreateTaskExt,
  renderDetailedTask,
  requestClientCapabilities,
  requireTasksExtension,
} from '../../wire/task-wire-ext.js';

export const MODERN_PROTOCOL_VERSION = '2026-07-28';
export const PROTOCOL_VERSION_META_KEY = 'io.modelcontextprotocol/protocolVersion';
const SERVER_INFO_META_KEY = 'io.modelcontextprotocol/serverInfo';

/** JSON-RPC codes of the 2026-07-28 transport. */
const HEADER_MISMATCH = -32020;
const UNSUPPORTED_VERSION = -32022;
const INVALID_REQUEST = -32600;
const METHOD_NOT_FOUND = -32601;
const INVALID_PARAMS = -32602;

export interface ModernEndpointOptions {
  service: TaskService;
  metrics: GatewayMetrics;
  log: Logger;
  version: string;
  inflight: InflightCalls;
  /** Largest tool result delivered (TASKRELAY_MAX_RESULT_BYTES); a bigger one becomes an isError result. */
  maxResultBytes?: number;
  /** The bound of each SSE response (PROTOCOL.md §22.1): `TASKRELAY_MAX_STREAM_BUFFER_BYTES` and its counters. */
  streams?: SseWriterOptions;
  /** Told when a `subscriptions/listen` stream opens and closes (the memory budget, §22.2). Default: none. */
  listens?: { opened: () => void; closed: () => void };
  /** Signs and verifies the `requestState` of input rounds (MRTR, PROTOCOL.md §17.2). */
  requestState: RequestStateSigner;
}

/** A wait nothing aborts (a round's end is its task's, or the stream's close, tracked apart). */
const never = new AbortController().signal;

type Params = Record<string, unknown> & { _meta?: Record<string, unknown> };

interface Rpc {
  id: string | number;
  method: string;
  params: Params;
  principal: string;
  req: Request;
  res: Response;
}

type Result = Record<string, unknown>;
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

/** The versions this endpoint serves sessionless, as `server/discover` lists them (2025-era ones get sessions). */
const SESSIONLESS_VERSIONS = [MODERN_PROTOCOL_VERSION];

export function createModernEndpoint(options: ModernEndpointOptions) {
  const { service, log, requestState: signer } = options;
  const catalogChanges = new CatalogChanges({ list: () => service.listTools() });

  const handlers: Record<string, Handler> = {
    'server/discover': () =>
      Promise.resolve({
        supportedVersions: SESSIONLESS_VERSIONS,
        // prompts and resources are declared because they are answered (empty lists, §14.1); no listChanged.
        capabilities: {
          tools: { listChanged: true },
          prompts: {},
          resources: {},
          extensions: { [TASKS_EXTENSION_ID]: {} },
        },
        ttlMs: 0,
        cacheScope: 'private',
        _meta: { [SERVER_INFO_META_KEY]: { name: 'taskrelay-gateway', version: options.version } },
      }),
    'tools/list': async () => ({
      tools: (await service.listTools()).map((tool) => {
        const listed: Result = { name: tool.name, description: tool.description, inputSchema: tool.inputSchema };
        if (tool.title !== undefined) listed['title'] = tool.title;
        if (tool.outputSchema !== undefined) listed['outputSchema'] = tool.outputSchema;
        return listed;
      }),
      ttlMs: 0,
      cacheScope: 'private',
    }),
    'tools/call': (rpc) => callTool(rpc),
    // taskrelay serves no prompts or resources: their lists are empty, with SEP-2549's caching hints (§14.1).
    'prompts/list': () => Promise.resolve({ prompts: [], ttlMs: 0, cacheScope: 'private' }),
    'resources/list': () => Promise.resolve({ resources: [], ttlMs: 0, cacheScope: 'private' }),
    'resources/templates/list': () => Promise.resolve({ resourceTemplates: [], ttlMs: 0, cacheScope: 'private' }),
    'prompts/get': (rpc) =>
      Promise.reject(new WireError(INVALID_PARAMS, `Unknown prompt: ${String(rpc.params['name'])}`)),
    'resources/read': (rpc) =>
      Promise.reject(new WireError(INVALID_PARAMS, 'Resource not found', { uri: rpc.params['uri'] })),
    'tasks/get': async (rpc) => {
      requireTasksExtension(rpc.params._meta, rpc.method);
      return renderDetailedTask(await service.get(taskIdOf(rpc), rpc.principal));
    },
    'tasks/update': async (rpc) => {
      requireTasksExtension(rpc.params._meta, rpc.method);
      const responses = rpc.params['inputResponses'];
      if (typeof responses !== 'object' || responses === null || Array.isArray(responses)) {
        throw new WireError(INVALID_PARAMS, 'tasks/update needs params.inputResponses, an object');
      }
      await service.answer(taskIdOf(rpc), rpc.principal, responses as Record<string, unknown>);
      return {};
    },
    'tasks/cancel': async (rpc) => {
      requireTasksExtension(rpc.params._meta, rpc.method);
      const taskId = taskIdOf(rpc);
      const record = await service.get(taskId, rpc.principal);
      if (!isTerminal(record.status)) {
        await service.cancel(taskId, rpc.principal).catch((error: unknown) => {
          if (!(error instanceof TaskrelayError && error.code === 'TASK_TERMINAL')) throw error;
        });
      }
      return {};
    },
    'subscriptions/listen': (rpc) => listen(rpc),
  };

  /** `subscriptions/listen` (PROTOCOL.md §14, §18): a push fed by the task router; see listen-stream.ts. */
  const listenStreams = createListenStreams({
    service,
    inflight: options.inflight,
    catalogChanges,
    log,
    ...(options.streams ? { streams: options.streams } : {}),
    ...(options.listens ? { listens: options.listens } : {}),
  });
  async function listen(rpc: Rpc): Promise<Result | undefined> {
    await listenStreams(rpc);
    return undefined;
  }

  async function callTool(rpc: Rpc): Promise<Result | undefined> {
    const { params, principal } = rpc;
    const name = params['name'];
    if (typeof name !== 'string') throw new WireError(INVALID_PARAMS, 'tools/call needs params.name, a string');
    const rawArgs = params['arguments'] ?? {};
    if (typeof rawArgs !== 'object' || rawArgs === null || Array.isArray(rawArgs)) {
      throw new WireError(INVALID_PARAMS, 'tools/call params.arguments must be an object');
    }
    const args = rawArgs as Record<string, unknown>;
    // An input round's retry (MRTR, PROTOCOL.md §17.3): the state the last round gave, and the answers.
    const requestState = params['requestState'];
    const inputResponses = params['inputResponses'];
    if (requestState !== undefined && typeof requestState !== 'string') {
      throw new WireError(INVALID_PARAMS, 'tools/call params.requestState must be a string');
    }
    if (
      inputResponses !== undefined &&
      (typeof inputResponses !== 'object' || inputResponses === null || Array.isArray(inputResponses))
    ) {
      throw new WireError(INVALID_PARAMS, 'tools/call params.inputResponses must be an object');
    }
    const ext = declaresTasksExtension(params._meta);
    // A legacy `params.task` is tolerated and ignored: the server decides (SEP-2663).
    const { tool, invalid } = await service.resolveCall(name, args, 'auto');
    // SEP-2243: arguments the tool mirrors into headers must match them (PROTOCOL.md §16.2).
    const mismatch = checkParamHeaders((header) => rpc.req.header(header), tool.inputSchema, args);
    if (mismatch !== undefined) throw new WireError(HEADER_MISMATCH, `Header mismatch: ${mismatch}`);
    if (tool.taskSupport === 'required' && !ext) {
      throw new WireError(
        MISSING_CLIENT_CAPABILITY,
        `Tool ${name} runs only as a task: declare the ${TASKS_EXTENSION_ID} extension in _meta["${CLIENT_CAPABILITIES_META_KEY}"]`,
        { requiredCapabilities: { extensions: { [TASKS_EXTENSION_ID]: {} } } },
      );
    }
    if (requestState !== undefined) {
      return retryRound(rpc, tool.name, requestState, (inputResponses ?? {}) as Record<string, unknown>);
    }
    // Answers without a state belong to no round: a new call, which asks again (SEP-2322: ignore what is not known).
    // An inputFirst tool asks as a plain call first and becomes a task once answered (PROTOCOL.md §17.4).
    const inputFirst = ext && tool.inputFirst === true && tool.taskSupport !== 'forbidden';
    const asTask = ext && tool.taskSupport !== 'forbidden' && !inputFirst;
    if (invalid !== undefined) {
      if (!asTask && !inputFirst) return { content: [{ type: 'text', text: invalid }], isError: true };
      const record = await service.rejectTask(
        { tool, principal, sessionId: undefined, requestedTtlMs: undefined, webhook: params._meta?.[WEBHOOK_META_KEY] },
        invalid,
      );
      return renderCreateTaskExt(record);
    }
    if (asTask) {
      const record = await service.start({
        tool,
        args,
        mode: 'task',
        principal,
        sessionId: undefined,
        progressToken: undefined,
        requestedTtlMs: undefined,
        idempotencyKey: idempotencyKeyOf(params._meta),
        clientCapabilities: requestClientCapabilities(params._meta),
        webhook: params._meta?.[WEBHOOK_META_KEY],
      });
      return renderCreateTaskExt(record);
    }

    if (options.inflight.ending) throw callEndedByShutdown();
    const stream = progressStream(rpc);
    const record = await service.start({
      tool,
      args,
      mode: 'call',
      principal,
      sessionId: undefined,
      progressToken: stream?.token,
      requestedTtlMs: undefined,
      // Refused: a plain call ends in its answer (PROTOCOL.md §27.1).
      webhook: params._meta?.[WEBHOOK_META_KEY],
      // What the tool may ask this client (ctx.elicit / ctx.sample refuse the rest at once).
      clientCapabilities: requestClientCapabilities(params._meta),
      ...(stream
        ? {
            // Coalesced while the client is behind: its stream stays bounded and is never closed for progress.
            sendProgress: (progress: ProgressParams) =>
              Promise.resolve(
                stream.sse.sendLatest('progress', {
                  jsonrpc: '2.0',
                  method: 'notifications/progress',
                  params: progress,
                }),
              ),
          }
        : {}),
    });
    return runRound(rpc, record, { becomesTask: inputFirst, stream: stream?.sse });
  }

  /** A plain call's response stream, once it carries a progress token and the client accepts SSE. */
  function progressStream(rpc: Rpc): { token: ProgressToken; sse: SseResponse } | undefined {
    const token = rpc.params._meta?.['progressToken'] as ProgressToken | undefined;
    if (token === undefined || !acceptsEventStream(rpc.req)) return undefined;
    return { token, sse: new SseResponse(rpc.res, options.streams) };
  }

  /**
   * One round of a plain call (PROTOCOL.md §17.1): waits until its task ends (the tool's result) or asks for input
   * (an `InputRequiredResult`; the task stays suspended on its hash, and the retry may come to any replica). Closing
   * the response stream before that cancels the call.
   */
  async function runRound(
    rpc: Rpc,
    record: TaskRecord,
    round: { becomesTask: boolean; stream: SseResponse | undefined },
  ): Promise<Result | undefined> {
    const { stream } = round;
    // On this transport a closed response stream is the client's cancel (MUST; PROTOCOL.md §14).
    const closed = new AbortController();
    const onClose = () => {
      if (!rpc.res.writableFinished) closed.abort();
    };
    rpc.res.on('close', onClose);
    const call = options.inflight.track(`modern:${randomUUID()}`, rpc.id, closed.signal, {
      shutdown: () => service.cancelCall(record, 'gateway-shutdown', 'GATEWAY_SHUTDOWN'),
    });
    const cancelOnClose = () => void service.cancelCall(record, 'stream-closed');
    call.signal.addEventListener('abort', cancelOnClose, { once: true });
    try {
      const { record: done, asked } = await service.waitForRound(record.taskId, rpc.principal, never);
      if (closed.signal.aborted) return undefined; // nobody to answer
      let result: Result;
      if (asked) {
        result = inputRequiredResult(done, signer, { becomesTask: round.becomesTask });
      } else {
        if (done.status === 'cancelled' && done.cancelReason === 'GATEWAY_SHUTDOWN') throw callEndedByShutdown();
        const missing = missingCapabilityError(done);
        if (missing) throw missing;
        result = capResult(renderResult(done), options.maxResultBytes ?? Infinity);
      }
      if (stream) {
        stream.end({
          jsonrpc: '2.0',
          id: rpc.id,
          result: { ...result, resultType: result['resultType'] ?? 'complete' },
        });
        return undefined;
      }
      return result;
    } catch (error) {
      if (!stream) throw error;
      stream.end({ jsonrpc: '2.0', id: rpc.id, error: errorObject(error) });
      return undefined;
    } finally {
      call.signal.removeEventListener('abort', cancelOnClose);
      rpc.res.off('close', onClose);
      call.done();
    }
  }

  /**
   * The retry of an input round (PROTOCOL.md §17.3): the echoed `requestState` verified (its MAC in constant time, then
   * principal, tool and expiry; any failure is -32602 and changes nothing), the answers stored, then the next round.
   */
  async function retryRound(
    rpc: Rpc,
    toolName: string,
    token: string,
    responses: Record<string, unknown>,
  ): Promise<Result | undefined> {
    const verified = signer.verify(token, { principal: rpc.principal, tool: toolName });
    if (!verified.ok) {
      log.info({ reason: verified.reason, tool: toolName }, 'requestState refused');
      throw new WireError(INVALID_PARAMS, 'Invalid requestState');
    }
    const { state } = verified;
    const record = await service.getCall(state.taskId, rpc.principal);
    if (!record) throw new WireError(INVALID_PARAMS, 'Invalid requestState: its call has ended or expired');
    // Progress stays on the first round's route (PROTOCOL.md §17.3): a retry's answer is the result alone.
    const round = { becomesTask: state.becomesTask, stream: undefined };
    if (isTerminal(record.status)) return runRound(rpc, record, round);
    const { resumed } = await service.answerCall(record, responses);
    if (!resumed) {
      // Something is still pending (an answer was missing): asked again at once, with a fresh state.
      const now = await service.getCall(state.taskId, rpc.principal);
      if (now?.status === 'input_required') return inputRequiredResult(now, signer, { becomesTask: state.becomesTask });
    } else if (state.becomesTask) {
      // The answers resumed the run: from here on it is a task the client polls (tasks-mrtr-composition).
      const task = await service.becomeTask(record, undefined);
      if (task) return renderCreateTaskExt(task);
    }
    return runRound(rpc, record, round);
  }

  /** Handles one POST whose `MCP-Protocol-Version` is not a 2025-era version. */
  return async function handle(req: Request, res: Response, principal: string): Promise<void> {
    const header = (req.header('mcp-protocol-version') ?? '').trim();
    const parsed = RequestSchema.safeParse(req.body);
    if (!parsed.success) {
      const detail = Array.isArray(req.body)
        ? 'batches are not supported'
        : 'the body must be one JSON-RPC 2.0 request object';
      send(res, 400, {
        jsonrpc: '2.0',
        id: null,
        error: { code: INVALID_REQUEST, message: `Invalid Request: ${detail}` },
      });
      return;
    }
    const { id, method } = parsed.data;
    const params: Params = parsed.data.params ?? {};
    const fail = (status: number, code: number, message: string, data?: unknown) =>
      send(res, status, {
        jsonrpc: '2.0',
        id: id ?? null,
        error: data === undefined ? { code, message } : { code, message, data },
      });

    if (header !== MODERN_PROTOCOL_VERSION) {
      return fail(400, UNSUPPORTED_VERSION, 'Unsupported protocol version', {
        supported: SESSIONLESS_VERSIONS,
        requested: header,
      });
    }
    // A notification (no id) gets no answer on this transport; nothing taskrelay serves needs one.
    if (id === undefined) {
      res.status(202).end();
      return;
    }
    // Routing headers mirror the body, so intermediaries can route without parsing it (SEP-2243).
    const methodHeader = req.header('mcp-method')?.trim();
    if (methodHeader !== method) {
      return fail(
        400,
        HEADER_MISMATCH,
        methodHeader === undefined
          ? 'Mcp-Method header is required'
          : `Mcp-Method header (${methodHeader}) does not match the body method (${method})`,
      );
    }
    // The transport's HTTP status for an unknown or removed method is 404 (SEP-2575).
    const removed = REMOVED.get(method);
    if (removed !== undefined) {
      return fail(
        404,
        METHOD_NOT_FOUND,
        `Method not found: ${method} is not part of ${MODERN_PROTOCOL_VERSION}; ${removed}`,
      );
    }
    const handler = handlers[method];
    if (!handler) return fail(404, METHOD_NOT_FOUND, `Method not found: ${method}`);
    const meta = params._meta;
    const missing = [PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY].filter((k) => meta?.[k] === undefined);
    if (missing.length > 0)
      return fail(400, INVALID_PARAMS, `Invalid params: missing _meta keys: ${missing.join(', ')}`);
    if (meta?.[PROTOCOL_VERSION_META_KEY] !== header) {
      return fail(400, HEADER_MISMATCH, 'MCP-Protocol-Version header does not match _meta.protocolVersion');
    }
    const nameField = NAME_FIELD[method];
    const bodyName = nameField === undefined ? undefined : params[nameField];
    if (typeof bodyName === 'string') {
      const rawName = req.header('mcp-name');
      const nameHeader = rawName === undefined ? undefined : decodeHeaderValue(rawName);
      if (nameHeader !== bodyName) {
        return fail(
          400,
          HEADER_MISMATCH,
          rawName === undefined
            ? `Mcp-Name header is required for ${method}`
            : `Mcp-Name header does not match params.${nameField ?? 'name'}`,
        );
      }
    }

    try {
      const result = await handler({ id, method, params, principal, req, res });
      if (result === undefined || res.headersSent) return;
      send(res, 200, { jsonrpc: '2.0', id, result: { ...result, resultType: result['resultType'] ?? 'complete' } });
    } catch (error) {
      if (!(error instanceof McpError)) log.debug({ err: error, method }, 'request failed');
      if (res.headersSent) return;
      const body = errorObject(error);
      // A capability the client did not declare is a 400 on this transport (SEP-2575).
      // A header that does not match the body is one too (SEP-2243).
      const status = body.code === MISSING_CLIENT_CAPABILITY || body.code === HEADER_MISMATCH ? 400 : 200;
      send(res, status, { jsonrpc: '2.0', id, error: body }, log);
    }
  };
}

function taskIdOf(rpc: Rpc): string {
  const taskId = rpc.params['taskId'];
  if (typeof taskId !== 'string') throw new WireError(INVALID_PARAMS, `${rpc.method} needs params.taskId, a string`);
  return taskId;
}

/**
 * A plain call whose tool asked for something the client did not declare (`ctx.sample` without `sampling`): on this
 * transport that is the request's -32021, naming the capability (SEP-2575), not a tool error.
 */
function missingCapabilityError(record: TaskRecord): WireError | undefined {
  if (record.status !== 'failed' || record.error?.code !== 'CAPABILITY_MISSING') return undefined;
  const capability = record.error.data?.['capability'];
  const required = typeof capability === 'string' ? { [capability]: {} } : {};
  return new WireError(MISSING_CLIENT_CAPABILITY, record.error.message, { requiredCapabilities: required });
}

function errorObject(error: unknown): { code: number; message: string; data?: unknown } {
  const mcp = toMcpError(error);
  // McpError prefixes its message with "MCP error <code>: "; the wire carries the message alone.
  const message = mcp.message.replace(/^MCP error -?\d+: /, '');
  return mcp.data === undefined ? { code: mcp.code, message } : { code: mcp.code, message, data: mcp.data };
}

function acceptsEventStream(req: Request): boolean {
  return (req.header('accept') ?? '').includes('text/event-stream');
}

function send(res: Response, status: number, body: unknown, log?: Logger): void {
  // Errors that reveal nothing (SECURITY.md): the same filter as the 2025-era sessions' transport.
  const message = log ? sanitizeOutgoing(body as Parameters<typeof sanitizeOutgoing>[0], log, undefined) : body;
  res.status(status).json(message);
}

/**
 * A response that became an SSE stream: notifications, then the response, then the end. Bounded (§22.1): values sent
 * with `sendLatest` are coalesced while the client is behind; a stream that would pass its bound otherwise is closed.
 */
class SseResponse {
  private started = false;
  private readonly writer: SseWriter;

  constructor(
    private readonly res: Response,
    options: SseWriterOptions = {},
  ) {
    this.writer = new SseWriter(res, options);
  }

  send(message: unknown): void {
    if (!this.writer.open) return;
    this.start();
    this.writer.write(eventText(message));
  }

  /** Sends `message`, or keeps it as the newest value of `key` while the client is behind. */
  sendLatest(key: string, message: unknown): void {
    if (!this.writer.open) return;
    this.start();
    this.writer.writeLatest(key, eventText(message));
  }

  end(message: unknown): void {
    if (!this.started) {
      if (!this.res.headersSent) this.res.status(200).json(message);
      return;
    }
    this.writer.end(eventText(message));
  }

  private start(): void {
    if (this.started) return;
    this.started = true;
    this.res.status(200).set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    this.res.flushHeaders();
  }
}

function eventText(message: unknown): string {
  return `event: message\ndata: ${JSON.stringify(message)}\n\n`;
}

/**
 * One MCP server per session, speaking the 2025-11-25 task wire. The handlers are taskrelay's own (not the SDK's
 * TaskStore interception) so that tasks are bound to the principal, `tools/call` answers the spec's -32601 cases as
 * JSON-RPC errors, and `tasks/result` blocks on Redis rather than on one process's memory.
 */
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { Protocol } from '@modelcontextprotocol/sdk/shared/protocol.js';
import {
  CallToolRequestSchema,
  CancelTaskRequestSchema,
  GetTaskPayloadRequestSchema,
  GetTaskRequestSchema,
  ListTasksRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  type ReadResourceResult,
  type CallToolResult,
  type JSONRPCRequest,
  type ServerCapabilities,
  type Task,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { JSON_RPC, type ProgressToken, type TaskRecord } from '@taskrelay/shared';
import { ClientChannel } from './client-channel.js';
import type { McpMethods, RequestContext, SessionTaskRoute } from '../../protocol/methods.js';
import { ANONYMOUS_PRINCIPAL } from '../../protocol/request-meta.js';
import { WireError, toMcpError } from '../../wire/errors.js';
import { MAX_RESOURCE_SUBSCRIPTIONS } from '../../protocol/resources.js';
import type { CallerSink, ProgressParams } from '../../tasks/task-router.js';
import type { TaskService } from '../../tasks/task-service.js';
import { relatedTaskMeta, renderTask } from '../../wire/task-wire.js';
import { TASKS_EXTENSION_ID, declaresTasksExtension, requestClientCapabilities } from '../../wire/task-wire-ext.js';

/** Requests whose handler below answers at once and sends nothing on the request's own stream. */
const ANSWERED_AT_ONCE = new Set([
  'initialize',
  'ping',
  'tools/list',
  'resources/list',
  'resources/templates/list',
  'resources/read',
  'resources/subscribe',
  'resources/unsubscribe',
  'logging/setLevel',
  'tasks/get',
  'tasks/list',
  'tasks/cancel',
  'tasks/update',
]);

/**
 * Whether a session request is answered at once, with nothing else on its stream (the transport then answers it as
 * JSON, PROTOCOL.md §9): the task-mode `tools/call` of 2025-11-25 (its progress and questions go to the GET stream)
 * and the task and listing methods; `tasks/result` for a task that `endedHere` says just ended on this gateway. Not a
 * plain call, not any other `tasks/result` (both wait, and stream), and not a call of the tasks extension (it may
 * become a plain call).
 */
export function answersAtOnce(request: JSONRPCRequest, endedHere?: (taskId: string) => boolean): boolean {
  if (ANSWERED_AT_ONCE.has(request.method)) return true;
  const params = request.params as { task?: unknown; taskId?: unknown; _meta?: Record<string, unknown> } | undefined;
  // A `tasks/result` for a task this gateway saw end a moment ago is answered from memory, at once (§6.7).
  if (request.method === 'tasks/result') {
    return typeof params?.taskId === 'string' && endedHere !== undefined && endedHere(params.taskId);
  }
  if (request.method !== 'tools/call') return false;
  return typeof params?.task === 'object' && params.task !== null && !declaresTasksExtension(params._meta);
}

export interface SessionServerOptions {
  methods: McpMethods;
  service: TaskService;
  /** Authentication on: tasks/list is offered (the spec says not to offer it when requestors can't be told apart). */
  authEnabled: boolean;
  version: string;
  /** Aborted when the gateway starts draining: pending `tasks/result` waits end (their tasks go on). */
  drainSignal: AbortSignal;
}

type Extra = {
  authInfo?: { clientId: string } | undefined;
  sessionId?: string | undefined;
  requestId: string | number;
  signal: AbortSignal;
  _meta?: { progressToken?: ProgressToken | undefined } | undefined;
  sendNotification: (notification: { method: 'notifications/progress'; params: ProgressParams }) => Promise<void>;
};

/** Runs a handler and turns taskrelay errors into JSON-RPC errors at the wire. */
async function wire<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw toMcpError(error);
  }
}

/**
 * The session's MCP server: an adapter from the SDK's requests to the method layer (`protocol/methods.ts`). It builds
 * each request's context (principal, session, the rendering its `_meta` chose, the session's streams) and nothing more.
 */
export function createSessionServer(options: SessionServerOptions): Server {
  const { methods, service } = options;
  const capabilities = sessionCapabilities(options.authEnabled);
  const server = new Server({ name: 'taskrelay-gateway', version: options.version }, { capabilities });
  // Input requests, their answers and tools' log messages for this session's client (PROTOCOL.md §12.9, §15).
  let sessionId: string | undefined;
  const channel = new ClientChannel({
    server,
    get sessionId() {
      return sessionId;
    },
    log: service.log,
    answer: (record, n, raw) => service.answerInput(record, n, raw),
  });
  server.onclose = () => channel.close();
  // The session's level, for every tool log message of this session's calls and tasks.
  server.setRequestHandler(SetLevelRequestSchema, (request) => {
    channel.setLevel(request.params.level);
    return {};
  });

  // Made once per session, not per call: a task's route outlives its request, and a closure made inside the handler
  // would keep that whole request (params, arguments, extra) alive until the task ends.
  const taskRoute: SessionTaskRoute = {
    sendProgress: (params: ProgressParams, taskId: string) => {
      params._meta = relatedTaskMeta(taskId);
      return server.notification({ method: 'notifications/progress', params });
    },
    sendStatus: (record: TaskRecord) =>
      server.notification({ method: 'notifications/tasks/status', params: renderTask(record) }),
    sink: channel.sink(undefined, 'task'),
  };

  /** The request's context: the extension when its `_meta` declares it, else the 2025-11-25 rendering. */
  const context: ContextOf = (extra, meta, sink) => {
    sessionId ??= extra.sessionId;
    const ext = declaresTasksExtension(meta);
    const declared = channel.capabilities();
    const token = extra._meta?.progressToken;
    return {
      era: '2025-11-25',
      principal: extra.authInfo?.clientId ?? ANONYMOUS_PRINCIPAL,
      sessionId: extra.sessionId,
      scope: extra.sessionId ?? '',
      requestId: extra.requestId,
      rendering: ext ? 'extension' : '2025-11-25',
      meta,
      // An extension request declares what it can answer with the request, beside the session's initialize.
      clientCapabilities: ext ? [...new Set([...declared, ...requestClientCapabilities(meta)])] : declared,
      signal: extra.signal,
      progress:
        token === undefined
          ? undefined
          : { token, send: (params) => extra.sendNotification({ method: 'notifications/progress', params }) },
      sink,
      taskRoute,
    };
  };

  server.setRequestHandler(ListToolsRequestSchema, (request) =>
    wire(
      async () =>
        (await methods.listTools({
          era: '2025-11-25',
          rendering: declaresTasksExtension(request.params?._meta) ? 'extension' : '2025-11-25',
        })) as { tools: Tool[] },
    ),
  );

  // Registered on the SDK's Protocol, not through Server's tools/call wrapper: that wrapper parses the request a second
  // time and re-validates each result as a CallToolResult, which writes `content: []` into the tasks extension's
  // CreateTaskResult (a field it does not have) and costs a zod parse of every result. The method layer builds the
  // results it answers; the request is still parsed once with CallToolRequestSchema.
  const setUnwrappedHandler = Protocol.prototype.setRequestHandler.bind(server) as Server['setRequestHandler'];
  setUnwrappedHandler(CallToolRequestSchema, (request, extra) =>
    wire(async () => {
      const { name, task, _meta: meta } = request.params;
      // A plain call has only its own request stream: its questions and logs go there.
      const ctx = context(extra, meta, channel.sink(extra.requestId, 'call'));
      const result = await methods.callTool(ctx, {
        name,
        arguments: request.params.arguments ?? {},
        task,
      });
      return result as CallToolResult;
    }),
  );
  registerTaskMethods(server, options, context, channel);
  registerResourceMethods(server, options, context);
  return server;
}

/**
 * Task output as resources (PROTOCOL.md §34): the templates, reads (a stored value is normally taken by the transport
 * and streamed; one inside a batch POST is read here whole), and subscriptions, whose updates go to the GET stream.
 */
function registerResourceMethods(server: Server, options: SessionServerOptions, context: ContextOf): void {
  const { methods } = options;
  const subscriptions = new Map<string, () => void>();
  const closed = server.onclose;
  server.onclose = () => {
    for (const stop of subscriptions.values()) stop();
    subscriptions.clear();
    closed?.();
  };
  server.setRequestHandler(ListResourcesRequestSchema, () => ({ resources: [] }));
  server.setRequestHandler(
    ListResourceTemplatesRequestSchema,
    () => methods.listResourceTemplates({ era: '2025-11-25' }) as { resourceTemplates: [] },
  );
  server.setRequestHandler(ReadResourceRequestSchema, (request, extra) =>
    wire(async () => {
      const read = await methods.readResource(context(extra, request.params._meta), request.params.uri);
      if (read.kind === 'inline') return read.result as ReadResourceResult;
      const { value } = read;
      const bytes = await value.readRange(0, value.meta.size);
      const content = value.meta.text ? { text: bytes.toString('utf8') } : { blob: bytes.toString('base64') };
      return { contents: [{ uri: value.uri, mimeType: value.meta.mimeType, ...content }] };
    }),
  );
  server.setRequestHandler(SubscribeRequestSchema, (request, extra) =>
    wire(async () => {
      const { uri } = request.params;
      if (subscriptions.has(uri)) return {};
      if (subscriptions.size >= MAX_RESOURCE_SUBSCRIPTIONS) {
        throw new WireError(
          JSON_RPC.INVALID_PARAMS,
          `Too many resource subscriptions: at most ${MAX_RESOURCE_SUBSCRIPTIONS} per session; unsubscribe one first`,
        );
      }
      const stop = await methods.subscribeResource(context(extra, request.params._meta), uri, (updated) => {
        server.notification({ method: 'notifications/resources/updated', params: { uri: updated } }).catch(() => {
          // No GET stream open and nothing to keep it: the client reads when it looks again.
        });
      });
      // A second subscribe of the same URI raced this one: keep one.
      if (subscriptions.has(uri)) stop();
      else subscriptions.set(uri, stop);
      return {};
    }),
  );
  server.setRequestHandler(UnsubscribeRequestSchema, (request) => {
    subscriptions.get(request.params.uri)?.();
    subscriptions.delete(request.params.uri);
    return {};
  });
}

/** What a session offers: tools, logging, 2025-11-25 tasks (listed only with auth on) and the tasks extension. */
function sessionCapabilities(authEnabled: boolean): ServerCapabilities {
  return {
    tools: {},
    logging: {},
    // Task output (PROTOCOL.md §34): templates to read, and subscriptions to a task's output.
    resources: { subscribe: true },
    tasks: {
      cancel: {},
      requests: { tools: { call: {} } },
      ...(authEnabled ? { list: {} } : {}),
    },
    // The SEP-2663 extension is served beside 2025-11-25 tasks, chosen per request (PROTOCOL.md §13).
    extensions: { [TASKS_EXTENSION_ID]: {} },
  };
}

/** The request's context, made per request by the session (see `createSessionServer`). */
type ContextOf = (extra: Extra, meta: Record<string, unknown> | undefined, sink?: CallerSink) => RequestContext;

/** The task methods of a session: get, update, result, list (with auth on), cancel. */
function registerTaskMethods(
  server: Server,
  options: SessionServerOptions,
  context: ContextOf,
  channel: ClientChannel,
): void {
  const { methods } = options;
  server.setRequestHandler(GetTaskRequestSchema, (request, extra) =>
    wire(async () => (await methods.getTask(context(extra, request.params._meta), request.params.taskId)) as Task),
  );

  server.setRequestHandler(UpdateTaskRequestSchema, (request, extra) =>
    wire(() =>
      methods.updateTask(context(extra, request.params._meta), request.params.taskId, request.params.inputResponses),
    ),
  );

  server.setRequestHandler(GetTaskPayloadRequestSchema, (request, extra) =>
    wire(async () => {
      const wait = eitherSignal(extra.signal, options.drainSignal);
      try {
        // The spec's side channel: the task's input requests go out on this response stream while it waits.
        const ctx = context(extra, request.params._meta, channel.sink(extra.requestId, 'task'));
        return await methods.taskResult(ctx, request.params.taskId, wait.signal);
      } finally {
        wait.dispose();
      }
    }),
  );

  if (options.authEnabled) {
    server.setRequestHandler(ListTasksRequestSchema, (request, extra) =>
      wire(
        async () =>
          (await methods.listTasks(context(extra, request.params?._meta), request.params?.cursor)) as {
            tasks: Task[];
          },
      ),
    );
  }

  server.setRequestHandler(CancelTaskRequestSchema, (request, extra) =>
    wire(async () => (await methods.cancelTask(context(extra, request.params._meta), request.params.taskId)) as Task),
  );
}

/** The extension's `tasks/update` (the SDK 1.32.2 has no schema for it). */
const UpdateTaskRequestSchema = z.object({
  method: z.literal('tasks/update'),
  params: z.looseObject({
    taskId: z.string(),
    inputResponses: z.record(z.string(), z.unknown()),
    _meta: z.record(z.string(), z.unknown()).optional(),
  }),
});

/** Aborted when either is, with that one's reason; `dispose` detaches it from both (the drain signal lives long). */
function eitherSignal(a: AbortSignal, b: AbortSignal): { signal: AbortSignal; dispose: () => void } {
  const controller = new AbortController();
  const fromA = () => controller.abort(a.reason);
  const fromB = () => controller.abort(b.reason);
  const dispose = () => {
    a.removeEventListener('abort', fromA);
    b.removeEventListener('abort', fromB);
  };
  if (a.aborted) fromA();
  else if (b.aborted) fromB();
  else {
    a.addEventListener('abort', fromA, { once: true });
    b.addEventListener('abort', fromB, { once: true });
  }
  return { signal: controller.signal, dispose };
}

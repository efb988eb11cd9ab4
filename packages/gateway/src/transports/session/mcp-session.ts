/**
 * One MCP server per session, speaking the 2025-11-25 task wire. The handlers are taskrelay's own (not the SDK's
 * TaskStore interception) so that tasks are bound to the principal, `tools/call` answers the spec's -32601 cases as
 * JSON-RPC errors, and `tasks/result` blocks on Redis rather than on one process's memory.
 */
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema,
  CancelTaskRequestSchema,
  GetTaskPayloadRequestSchema,
  GetTaskRequestSchema,
  ListTasksRequestSchema,
  ListToolsRequestSchema,
  SetLevelRequestSchema,
  type CallToolResult,
  type JSONRPCRequest,
  type ServerCapabilities,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { TaskrelayError, isTerminal, type ProgressToken, type TaskRecord } from '@taskrelay/shared';
import { ClientChannel } from './client-channel.js';
import type { InflightCalls } from '../../protocol/inflight-calls.js';
import { ANONYMOUS_PRINCIPAL, idempotencyKeyOf } from '../../protocol/request-meta.js';
import { WireError, callEndedByShutdown, toMcpError } from '../../wire/errors.js';
import { capResult } from '../../http/limits.js';
import type { GatewayMetrics } from '../../ops/metrics.js';
import type { ProgressParams } from '../../tasks/task-router.js';
import type { TaskService } from '../../tasks/task-service.js';
import { relatedTaskMeta, renderResult, renderTask } from '../../wire/task-wire.js';
import { WEBHOOK_META_KEY } from '../../ops/webhooks/url-policy.js';
import {
  TASKS_EXTENSION_ID,
  declaresTasksExtension,
  renderCreateTaskExt,
  renderDetailedTask,
  requestClientCapabilities,
  requireTasksExtension,
} from '../../wire/task-wire-ext.js';

/** Requests whose handler below answers at once and sends nothing on the request's own stream. */
const ANSWERED_AT_ONCE = new Set([
  'initialize',
  'ping',
  'tools/list',
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
  service: TaskService;
  metrics: GatewayMetrics;
  /** Authentication on: tasks/list is offered (the spec says not to offer it when requestors can't be told apart). */
  authEnabled: boolean;
  version: string;
  inflight: InflightCalls;
  /** Aborted when the gateway starts draining: pending `tasks/result` waits end (their tasks go on). */
  drainSignal: AbortSignal;
  /** Largest tool result delivered, as JSON bytes (TASKRELAY_MAX_RESULT_BYTES). Default: no limit. */
  maxResultBytes?: number;
}

type Extra = { authInfo?: { clientId: string } | undefined; sessionId?: string | undefined };

function principalOf(extra: Extra): string {
  return extra.authInfo?.clientId ?? ANONYMOUS_PRINCIPAL;
}

/** Runs a handler and turns taskrelay errors into JSON-RPC errors at the wire. */
async function wire<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw toMcpError(error);
  }
}

export function createSessionServer(options: SessionServerOptions): Server {
  const { service, metrics } = options;
  const maxResultBytes = options.maxResultBytes ?? Infinity;
  const capabilities: ServerCapabilities = {
    tools: {},
    logging: {},
    tasks: {
      cancel: {},
      requests: { tools: { call: {} } },
      ...(options.authEnabled ? { list: {} } : {}),
    },
    // The SEP-2663 extension is served beside 2025-11-25 tasks, chosen per request (PROTOCOL.md §13).
    extensions: { [TASKS_EXTENSION_ID]: {} },
  };
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

  server.setRequestHandler(ListToolsRequestSchema, () =>
    wire(async () => ({
      tools: (await service.listTools()).map((tool) => {
        const listed: Tool = {
          name: tool.name,
          description: tool.description,
          inputSchema: tool.inputSchema as Tool['inputSchema'],
          execution: { taskSupport: tool.taskSupport },
        };
        if (tool.title !== undefined) listed.title = tool.title;
        if (tool.outputSchema !== undefined) listed.outputSchema = tool.outputSchema as Tool['outputSchema'];
        return listed;
      }),
    })),
  );

  // Made once per session, not per call: a task's route outlives its request, and a closure made inside the handler
  // would keep that whole request (params, arguments, extra) alive until the task ends.
  const sendTaskProgress = (params: ProgressParams, taskId: string) => {
    params._meta = relatedTaskMeta(taskId);
    return server.notification({ method: 'notifications/progress', params });
  };
  const sendTaskStatus = (record: TaskRecord) =>
    server.notification({ method: 'notifications/tasks/status', params: renderTask(record) });
  const taskSink = channel.sink(undefined, 'task');

  server.setRequestHandler(CallToolRequestSchema, (request, extra) =>
    wire(async () => {
      const { name, task } = request.params;
      const args = request.params.arguments ?? {};
      const principal = principalOf(extra);
      sessionId ??= extra.sessionId;
      const progressToken: ProgressToken | undefined = extra._meta?.progressToken;
      const clientCapabilities = channel.capabilities();
      // An extension client asks for nothing: the server decides, and makes a task of every call that may be one.
      const ext = declaresTasksExtension(request.params._meta);
      const { tool, invalid } = await service.resolveCall(name, args, ext ? 'auto' : task !== undefined);
      const asTask = ext ? tool.taskSupport !== 'forbidden' : task !== undefined;
      const idempotencyKey = asTask ? idempotencyKeyOf(request.params._meta) : undefined;
      const requestedTtlMs = ext ? undefined : (task?.ttl ?? undefined);
      const webhook = request.params._meta?.[WEBHOOK_META_KEY];
      if (invalid !== undefined) {
        // SEP-1303: a tool execution error the model can read and correct, not a JSON-RPC error.
        if (!asTask) return { content: [{ type: 'text', text: invalid }], isError: true };
        const record = await service.rejectTask(
          { tool, principal, sessionId: extra.sessionId, requestedTtlMs, webhook },
          invalid,
        );
        return ext ? renderCreateTaskExt(record) : { task: renderTask(record) };
      }

      if (asTask && ext) {
        // No progress notifications on extension tasks (SEP-2663): statusMessage carries progress.
        const record = await service.start({
          tool,
          args,
          mode: 'task',
          principal,
          sessionId: extra.sessionId,
          progressToken: undefined,
          requestedTtlMs,
          idempotencyKey,
          // Its input requests are answered by tasks/update, its progress is its statusMessage (SEP-2663); what it
          // can answer is declared with the request.
          clientCapabilities: [...new Set([...clientCapabilities, ...requestClientCapabilities(request.params._meta)])],
          webhook,
        });
        return renderCreateTaskExt(record);
      }

      if (task !== undefined) {
        const record = await service.start({
          tool,
          args,
          mode: 'task',
          principal,
          sessionId: extra.sessionId,
          requestId: extra.requestId,
          progressToken,
          requestedTtlMs: task.ttl ?? undefined,
          idempotencyKey,
          // After CreateTaskResult the request stream is gone: the session's GET stream is the only route left.
          sendProgress: sendTaskProgress,
          sendStatus: sendTaskStatus,
          sink: taskSink,
          clientCapabilities,
          webhook,
        });
        return { task: renderTask(record) };
      }

      // The drain is already ending calls: do not start one only to cancel it.
      if (options.inflight.ending) throw callEndedByShutdown();
      const started = Date.now();
      const record = await service.start({
        tool,
        args,
        mode: 'call',
        principal,
        sessionId: extra.sessionId,
        requestId: extra.requestId,
        progressToken,
        requestedTtlMs: undefined,
        sendProgress: (params) => extra.sendNotification({ method: 'notifications/progress', params }),
        // A plain call has only its own request stream: its questions and logs go there.
        sink: channel.sink(extra.requestId, 'call'),
        clientCapabilities,
        // Refused: a plain call ends in its answer (PROTOCOL.md §27.1).
        webhook,
      });
      const call = options.inflight.track(extra.sessionId, extra.requestId, extra.signal, {
        shutdown: () => service.cancelCall(record, 'gateway-shutdown', 'GATEWAY_SHUTDOWN'),
      });
      try {
        // Whoever ended the task first is in its record: a result that won the race with the drain still goes out.
        const done = await service.waitForCall(record, call.signal);
        if (done.status === 'cancelled' && done.cancelReason === 'GATEWAY_SHUTDOWN') throw callEndedByShutdown();
        metrics.callDuration.observe({ tool: tool.name }, (Date.now() - started) / 1000);
        return capResult(renderResult(done), maxResultBytes);
      } finally {
        call.done();
      }
    }),
  );

  server.setRequestHandler(GetTaskRequestSchema, (request, extra) =>
    wire(async () => {
      const record = await service.get(request.params.taskId, principalOf(extra));
      return declaresTasksExtension(request.params._meta) ? renderDetailedTask(record) : renderTask(record);
    }),
  );

  // The extension's answer route: `tasks/update {inputResponses}` (PROTOCOL.md §12.3, §13); an ack, nothing more.
  server.setRequestHandler(UpdateTaskRequestSchema, (request, extra) =>
    wire(async () => {
      requireTasksExtension(request.params._meta, 'tasks/update');
      await service.answer(request.params.taskId, principalOf(extra), request.params.inputResponses);
      return { resultType: 'complete' };
    }),
  );

  server.setRequestHandler(GetTaskPayloadRequestSchema, (request, extra) =>
    wire(async () => {
      const { taskId } = request.params;
      // The extension has no tasks/result: results are inline in tasks/get.
      if (declaresTasksExtension(request.params._meta)) {
        throw new WireError(-32601, 'Method not found: tasks/result is not part of the tasks extension; use tasks/get');
      }
      const wait = eitherSignal(extra.signal, options.drainSignal);
      try {
        sessionId ??= extra.sessionId;
        // The spec's side channel: the task's input requests go out on this response stream while it waits.
        const stream = { sessionId: extra.sessionId, sink: channel.sink(extra.requestId, 'task') };
        const record = await service.waitForTerminal(taskId, principalOf(extra), wait.signal, stream);
        const result: CallToolResult = capResult(renderResult(record), maxResultBytes);
        return { ...result, _meta: { ...result._meta, ...relatedTaskMeta(taskId) } };
      } finally {
        wait.dispose();
      }
    }),
  );

  if (options.authEnabled) {
    server.setRequestHandler(ListTasksRequestSchema, (request, extra) =>
      wire(async () => {
        const page = await service.list(principalOf(extra), request.params?.cursor);
        return page.nextCursor === undefined
          ? { tasks: page.tasks.map(renderTask) }
          : { tasks: page.tasks.map(renderTask), nextCursor: page.nextCursor };
      }),
    );
  }

  server.setRequestHandler(CancelTaskRequestSchema, (request, extra) =>
    wire(async () => {
      const { taskId } = request.params;
      if (!declaresTasksExtension(request.params._meta))
        return renderTask(await service.cancel(taskId, principalOf(extra)));
      // The extension's cancel is an ack, idempotent on a terminal task; an unknown task is still -32602.
      const record = await service.get(taskId, principalOf(extra));
      if (!isTerminal(record.status)) {
        await service.cancel(taskId, principalOf(extra)).catch((error: unknown) => {
          if (!(error instanceof TaskrelayError && error.code === 'TASK_TERMINAL')) throw error;
        });
      }
      return { resultType: 'complete' };
    }),
  );

  return server;
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

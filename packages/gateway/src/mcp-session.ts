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
  type CallToolResult,
  type ServerCapabilities,
  type Task,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { TaskrelayError, type ProgressToken } from '@taskrelay/shared';
import { toMcpError } from './errors.js';
import type { GatewayMetrics } from './metrics.js';
import type { ProgressParams } from './task-router.js';
import type { TaskService } from './task-service.js';
import { relatedTaskMeta, renderResult, renderTask } from './task-wire.js';

export const ANONYMOUS_PRINCIPAL = 'anonymous';

/** `_meta` key of a task call's idempotency key (CONTRACT §4). */
export const IDEMPOTENCY_META_KEY = 'dev.taskrelay/idempotency-key';

/** The idempotency key of a request, checked: a string of 1..200 characters, or absent. */
export function idempotencyKeyOf(meta: Record<string, unknown> | undefined): string | undefined {
  const value = meta?.[IDEMPOTENCY_META_KEY];
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || value.length < 1 || value.length > 200) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["${IDEMPOTENCY_META_KEY}"] must be a string of 1 to 200 characters`,
    );
  }
  return value;
}

export interface SessionServerOptions {
  service: TaskService;
  metrics: GatewayMetrics;
  /** Authentication on: tasks/list is offered (the spec says not to offer it when requestors can't be told apart). */
  authEnabled: boolean;
  version: string;
  inflight: InflightCalls;
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
  const capabilities: ServerCapabilities = {
    tools: {},
    tasks: {
      cancel: {},
      requests: { tools: { call: {} } },
      ...(options.authEnabled ? { list: {} } : {}),
    },
  };
  const server = new Server({ name: 'taskrelay-gateway', version: options.version }, { capabilities });

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
  const sendTaskProgress = (params: ProgressParams) =>
    server.notification({ method: 'notifications/progress', params });
  const sendTaskStatus = (t: Task) => server.notification({ method: 'notifications/tasks/status', params: t });

  server.setRequestHandler(CallToolRequestSchema, (request, extra) =>
    wire(async () => {
      const { name, task } = request.params;
      const args = request.params.arguments ?? {};
      const principal = principalOf(extra);
      const progressToken: ProgressToken | undefined = extra._meta?.progressToken;
      const idempotencyKey = task === undefined ? undefined : idempotencyKeyOf(request.params._meta);
      const tool = await service.resolveCall(name, args, task !== undefined);

      if (task !== undefined) {
        const record = await service.start({
          tool,
          args,
          mode: 'task',
          principal,
          sessionId: extra.sessionId,
          progressToken,
          requestedTtlMs: task.ttl ?? undefined,
          idempotencyKey,
          // After CreateTaskResult the request stream is gone: the session's GET stream is the only route left.
          sendProgress: sendTaskProgress,
          sendStatus: sendTaskStatus,
        });
        return { task: renderTask(record) };
      }

      const started = Date.now();
      const record = await service.start({
        tool,
        args,
        mode: 'call',
        principal,
        sessionId: extra.sessionId,
        progressToken,
        requestedTtlMs: undefined,
        sendProgress: (params) => extra.sendNotification({ method: 'notifications/progress', params }),
      });
      const unregister = options.inflight.register(extra.sessionId, extra.requestId, () =>
        service.cancelCall(record, 'stream-closed'),
      );
      try {
        const done = await service.waitForCall(record, extra.signal);
        metrics.callDuration.observe({ tool: tool.name }, (Date.now() - started) / 1000);
        return renderResult(done);
      } finally {
        unregister();
      }
    }),
  );

  server.setRequestHandler(GetTaskRequestSchema, (request, extra) =>
    wire(async () => renderTask(await service.get(request.params.taskId, principalOf(extra)))),
  );

  server.setRequestHandler(GetTaskPayloadRequestSchema, (request, extra) =>
    wire(async () => {
      const { taskId } = request.params;
      const record = await service.waitForTerminal(taskId, principalOf(extra), extra.signal);
      const result: CallToolResult = renderResult(record);
      return { ...result, _meta: { ...result._meta, ...relatedTaskMeta(taskId) } };
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
    wire(async () => renderTask(await service.cancel(request.params.taskId, principalOf(extra)))),
  );

  return server;
}

/**
 * Plain calls in flight, by session and JSON-RPC id: the HTTP layer cancels one when its response stream closes
 * before the response was written (the newest spec treats that as cancellation; tasks are never in here).
 */
export class InflightCalls {
  private readonly calls = new Map<string, () => Promise<void>>();

  register(sessionId: string | undefined, requestId: string | number, cancel: () => Promise<void>): () => void {
    const key = inflightKey(sessionId, requestId);
    this.calls.set(key, cancel);
    return () => {
      if (this.calls.get(key) === cancel) this.calls.delete(key);
    };
  }

  cancel(sessionId: string | undefined, requestId: string | number): boolean {
    const cancel = this.calls.get(inflightKey(sessionId, requestId));
    if (!cancel) return false;
    void cancel();
    return true;
  }
}

function inflightKey(sessionId: string | undefined, requestId: string | number): string {
  return `${sessionId ?? ''}\u0000${JSON.stringify(requestId)}`;
}

/**
 * What the gateway does with tools and tasks, independent of the wire rendering: start a task for a call, read it,
 * wait for it, list and cancel it — always for one principal, never by session.
 */
import type { Task } from '@modelcontextprotocol/sdk/types.js';
import {
  TaskrelayError,
  isTerminal,
  type CancelReason,
  type JobData,
  type Logger,
  type ProgressToken,
  type RedisTaskStore,
  type TaskMode,
  type TaskPage,
  type TaskRecord,
} from '@taskrelay/shared';
import type { CatalogTool, ToolCatalog } from './catalog.js';
import { TaskSupportError, taskNotFound } from './errors.js';
import type { JobDispatcher } from './job-dispatcher.js';
import type { GatewayMetrics } from './metrics.js';
import type { ProgressParams, TaskRouter } from './task-router.js';

export interface TaskServiceConfig {
  gatewayId: string;
  defaultTtlMs: number;
  maxTtlMs: number;
  pollIntervalMs: number;
  maxToolTimeoutMs: number;
}

export interface StartTaskInput {
  tool: CatalogTool;
  args: Record<string, unknown>;
  mode: TaskMode;
  principal: string;
  sessionId: string | undefined;
  progressToken: ProgressToken | undefined;
  requestedTtlMs: number | undefined;
  sendProgress?: (params: ProgressParams) => Promise<void>;
  sendStatus?: (task: Task) => Promise<void>;
}

export type CancelTrigger = 'tasks/cancel' | 'notifications/cancelled' | 'stream-closed' | 'gateway-shutdown';

export class TaskService {
  constructor(
    private readonly store: RedisTaskStore,
    private readonly catalog: ToolCatalog,
    private readonly dispatcher: JobDispatcher,
    private readonly router: TaskRouter,
    private readonly metrics: GatewayMetrics,
    private readonly log: Logger,
    private readonly config: TaskServiceConfig,
  ) {}

  listTools(): Promise<CatalogTool[]> {
    return this.catalog.list();
  }

  /** Finds the tool and checks the call against it: the spec's -32602 and -32601 cases. */
  async resolveCall(name: string, args: Record<string, unknown>, asTask: boolean): Promise<CatalogTool> {
    const tool = await this.catalog.find(name);
    if (!tool) throw new TaskrelayError('TOOL_NOT_FOUND', `Unknown tool: ${name}`);
    if (asTask && tool.taskSupport === 'forbidden') {
      throw new TaskSupportError(`Tool ${name} does not support task-augmented calls (taskSupport: forbidden)`);
    }
    if (!asTask && tool.taskSupport === 'required') {
      throw new TaskSupportError(`Tool ${name} requires task augmentation: send params.task (taskSupport: required)`);
    }
    this.catalog.validate(tool, args);
    return tool;
  }

  /** Stores the task durably, starts routing its progress, then enqueues its job. */
  async start(input: StartTaskInput): Promise<TaskRecord> {
    const { tool } = input;
    const ttl = grantTtl(input.requestedTtlMs, this.config);
    const record = await this.store.create({
      tool: tool.name,
      queue: tool.queue,
      principal: input.principal,
      mode: input.mode,
      ttl,
      pollInterval: this.config.pollIntervalMs,
      sessionId: input.sessionId,
      gatewayId: this.config.gatewayId,
      progressToken: input.progressToken,
    });
    const route: Parameters<TaskRouter['register']>[0] = { record };
    if (input.sendProgress) route.sendProgress = input.sendProgress;
    if (input.sendStatus) route.sendStatus = input.sendStatus;
    this.router.register(route);
    const data: JobData = {
      taskId: record.taskId,
      tool: tool.name,
      arguments: input.args,
      timeoutMs: Math.min(tool.timeoutMs ?? this.config.maxToolTimeoutMs, this.config.maxToolTimeoutMs),
    };
    try {
      await this.dispatcher.enqueue(tool, data);
    } catch (error) {
      this.router.retire(record.taskId, { flush: false });
      const message = `Could not enqueue the job: ${error instanceof Error ? error.message : String(error)}`;
      await this.store
        .transition(record.taskId, 'failed', {
          statusMessage: message,
          result: { content: [{ type: 'text', text: message }], isError: true },
          error: { code: 'INTERNAL', message },
        })
        .catch(() => undefined);
      throw new TaskrelayError('INTERNAL', message, { cause: error });
    }
    this.metrics.tasksCreated.inc({ tool: tool.name, mode: input.mode });
    this.log.info(
      {
        taskId: record.taskId,
        tool: tool.name,
        mode: input.mode,
        principal: input.principal,
        sessionId: input.sessionId,
      },
      'task created',
    );
    return record;
  }

  /** A task the principal may see; plain calls' internal tasks are not tasks to the client. */
  async get(taskId: string, principal: string): Promise<TaskRecord> {
    const record = await this.store.get(taskId);
    if (!record || record.principal !== principal || record.mode !== 'task') throw taskNotFound(taskId);
    return record;
  }

  async waitForTerminal(taskId: string, principal: string, signal?: AbortSignal): Promise<TaskRecord> {
    await this.get(taskId, principal);
    return this.router.waitForTerminal(taskId, signal);
  }

  /** Waits for a plain call's task; an abort of `signal` cancels it (notifications/cancelled). */
  async waitForCall(record: TaskRecord, signal: AbortSignal): Promise<TaskRecord> {
    const onAbort = () => void this.cancelCall(record, 'notifications/cancelled');
    // The cancel may have arrived while the task was being created.
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    try {
      return await this.router.waitForTerminal(record.taskId);
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  async list(principal: string, cursor: string | undefined): Promise<TaskPage> {
    const page = await this.store.list(principal, cursor);
    return { ...page, tasks: page.tasks.filter((t) => t.mode === 'task') };
  }

  /** State first: the task is `cancelled` in Redis before this returns; then the worker is told. */
  async cancel(taskId: string, principal: string): Promise<TaskRecord> {
    const record = await this.get(taskId, principal);
    if (isTerminal(record.status)) throw terminalError(record);
    const outcome = await this.applyCancel(record, 'tasks/cancel');
    if (!outcome) {
      const now = await this.store.get(taskId);
      throw now ? terminalError(now) : taskNotFound(taskId);
    }
    return outcome;
  }

  /** Cancels a plain call's task; a no-op when it already ended. */
  async cancelCall(
    record: TaskRecord,
    trigger: CancelTrigger,
    reason: CancelReason = 'CLIENT_CANCELLED',
  ): Promise<void> {
    try {
      await this.applyCancel(record, trigger, reason);
    } catch (error) {
      this.log.warn({ taskId: record.taskId, err: error }, 'cancel of a plain call failed');
    }
  }

  private async applyCancel(
    record: TaskRecord,
    trigger: CancelTrigger,
    reason: CancelReason = 'CLIENT_CANCELLED',
  ): Promise<TaskRecord | undefined> {
    const statusMessage = reason === 'GATEWAY_SHUTDOWN' ? 'Gateway shutting down' : 'Cancelled by the client';
    const now = new Date();
    const outcome = await this.store.transition(
      record.taskId,
      'cancelled',
      { statusMessage, cancelReason: reason },
      now,
    );
    if (!outcome.ok) return undefined;
    // Nothing more is forwarded for this task, even an update already on its way.
    this.router.retire(record.taskId, { flush: false });
    this.metrics.tasksCancelled.inc({ trigger });
    this.metrics.tasksFinished.inc({ status: 'cancelled' });
    this.log.info(
      { taskId: record.taskId, tool: record.tool, principal: record.principal, trigger, reason },
      'task cancelled',
    );
    await this.dispatcher.cancel(record.taskId, record.queue, reason);
    return {
      ...record,
      status: 'cancelled',
      statusMessage,
      lastUpdatedAt: now.toISOString(),
      cancelReason: reason,
    };
  }
}

/** The smallest ttl granted: a terminal task stays readable at least this long. */
export const MIN_TTL_MS = 1_000;

/** The ttl actually granted (the spec lets the receiver choose): whole ms, between MIN_TTL_MS and the maximum. */
export function grantTtl(
  requested: number | undefined,
  config: Pick<TaskServiceConfig, 'defaultTtlMs' | 'maxTtlMs'>,
): number {
  const wanted = requested !== undefined && Number.isFinite(requested) ? requested : config.defaultTtlMs;
  return Math.min(config.maxTtlMs, Math.max(MIN_TTL_MS, Math.round(wanted)));
}

function terminalError(record: TaskRecord): TaskrelayError {
  return new TaskrelayError('TASK_TERMINAL', `Cannot cancel task in terminal status: ${record.status}`);
}

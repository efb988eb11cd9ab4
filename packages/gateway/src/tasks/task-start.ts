/**
 * Starting a task for a call (PROTOCOL.md §10.1): the create script's input (ttl, deadline, fair share, idempotency or
 * dedupe key, webhook, open-work cap, shard), the job added with it or after it, the route registered first, and
 * undoing a create whose job could not be added.
 */
import { createHash, randomInt } from 'node:crypto';
import {
  TaskrelayError,
  isTerminal,
  newTaskId,
  OpenCapReached,
  type JobData,
  type Logger,
  type ProgressToken,
  type TaskRecords,
  type TaskStore,
  type TaskMode,
  type TaskRecord,
  startTaskSpan,
  DEFAULT_PRIORITY,
  canonicalDigest,
  priorityBase,
} from '@taskrelay/shared';
import type { CatalogTool } from './catalog.js';
import { fairShareTtlMs, type JobDispatcher } from './job-dispatcher.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import {
  CALL_TTL_MS,
  grantTtl,
  priorityLevel,
  runDeadlineAt,
  toolTimeoutMs,
  type TaskServiceConfig,
} from './task-policy.js';
import type { CallerSink, ProgressParams, TaskRouter } from './task-router.js';
import { WebhookRefusedError } from './webhooks/url-policy.js';

export interface StartTaskInput {
  tool: CatalogTool;
  args: Record<string, unknown>;
  mode: TaskMode;
  principal: string;
  sessionId: string | undefined;
  /** The JSON-RPC id of the tools/call, for log correlation. */
  requestId?: string | number | undefined;
  progressToken: ProgressToken | undefined;
  requestedTtlMs: number | undefined;
  /** `_meta["dev.taskrelay/idempotency-key"]` of a task call (1..200 characters). */
  idempotencyKey?: string | undefined;
  /** `_meta["dev.taskrelay/priority"]` (1..5), checked for its form; `start` checks it against the ceiling (§25.1). */
  priority?: number | undefined;
  /** The caller is an operator (`TASKRELAY_OPERATORS`): it may ask for any priority level. */
  operator?: boolean;
  sendProgress?: (params: ProgressParams, taskId: string) => Promise<void>;
  sendStatus?: (record: TaskRecord) => Promise<void>;
  /** Where the task's input requests and log messages go (PROTOCOL.md §12.9, §15). */
  sink?: CallerSink;
  /** What the caller's client declared it can answer (`elicitation`, `sampling`): `ctx.elicit` refuses the rest. */
  clientCapabilities?: string[];
  /** `_meta["dev.taskrelay/webhook"]` as the request carried it (PROTOCOL.md §27.1); checked before anything is stored. */
  webhook?: unknown;
  /** `_meta["dev.taskrelay/tags"]`, checked (PROTOCOL.md §30.2). */
  tags?: string[] | undefined;
  /** A replay (PROTOCOL.md §30.3): the task it replays, and for a redrive the original's step results (JSON). */
  replay?: { of: string; steps?: string };
  /**
   * `_meta["dev.taskrelay/start-at"]` of a task call, checked (ms since the epoch; PROTOCOL.md §33.1): its job is a
   * delayed job until then. A time already past starts it at once.
   */
  startAt?: number | undefined;
}

/** What `start` answers: the task, `joined` when it is an earlier one the call joined (idempotency or dedupe). */
export type StartedTask = TaskRecord & { joined?: true };

/** Creates tasks for calls: `TaskService.start` and `rejectTask`. */
export class TaskStarter {
  /** Per tool queue, the shard its next unkeyed call goes to, in the sharded layout (`shardOf`). */
  private readonly shardTurns = new Map<string, number>();

  constructor(
    private readonly store: TaskStore,
    private readonly dispatcher: JobDispatcher,
    private readonly router: TaskRouter,
    private readonly metrics: GatewayMetrics,
    private readonly log: Logger,
    private readonly config: TaskServiceConfig,
  ) {}

  /**
   * A task call whose arguments do not match the tool's schema: the task is stored already `failed` with the
   * `isError` result naming the field, and no job runs (the client gets the usual task flow and reads the error).
   */
  async rejectTask(
    input: Pick<StartTaskInput, 'tool' | 'principal' | 'sessionId' | 'requestedTtlMs' | 'webhook'>,
    message: string,
  ): Promise<TaskRecord> {
    const webhook = await this.acceptWebhook(input.webhook, 'task', input.principal);
    const { record } = await this.store.records.createTask({
      ...(webhook ? { webhook } : {}),
      tool: input.tool.name,
      queue: input.tool.queue,
      principal: input.principal,
      mode: 'task',
      ttl: grantTtl(input.requestedTtlMs, this.config),
      pollInterval: this.config.pollIntervalMs,
      sessionId: input.sessionId,
      gatewayId: this.config.gatewayId,
    });
    const fields = {
      statusMessage: message,
      result: { content: [{ type: 'text', text: message }], isError: true },
      error: { code: 'INVALID_ARGUMENTS' as const, message },
    };
    const outcome = await this.store.runs.transition(record.taskId, 'failed', fields);
    this.metrics.tasksCreated.inc({ tool: input.tool.name, mode: 'task' });
    // It never gets a route (nothing runs), so no router counts its end: every created task is finished once.
    if (outcome.ok) this.metrics.taskEnded(input.tool.name, 'failed', record.createdAt);
    this.log.info({ taskId: record.taskId, tool: input.tool.name, principal: input.principal }, message);
    return (
      (await this.store.records.get(record.taskId)) ?? { ...record, status: outcome.ok ? 'failed' : record.status }
    );
  }

  /**
   * Stores the task durably, starts routing its progress, then enqueues its job. With an idempotency key the
   * principal already used, returns that task and starts nothing.
   */
  async start(input: StartTaskInput): Promise<StartedTask> {
    const { tool } = input;
    const timeoutMs = toolTimeoutMs(tool, this.config);
    const level = priorityLevel(tool, input);
    const delayMs = input.startAt === undefined ? 0 : Math.max(0, input.startAt - Date.now());
    const { createInput, taskId } = await this.createInputOf(input, timeoutMs, level, delayMs);
    const span = startTaskSpan(`tools/call ${tool.name}`, {
      'taskrelay.task_id': taskId,
      'taskrelay.tool': tool.name,
      'taskrelay.mode': input.mode,
      'taskrelay.principal': input.principal,
      'mcp.session_id': input.sessionId,
      'rpc.jsonrpc.request_id': input.requestId === undefined ? undefined : String(input.requestId),
    });
    const data = this.jobDataOf(input, taskId, timeoutMs, level, span.carrier);
    // Without an idempotency key the create cannot be a replay: its job is added by the same script, one round trip
    // for both writes (PROTOCOL.md §10.1). A replay must add nothing, so keyed tasks add their job after the create.
    // A delayed job is BullMQ's other add script: it is added after the create, as a keyed task's is (§33.1).
    const job =
      createInput.idempotencyKey === undefined && delayMs === 0 ? await this.prepareJob(tool, data) : undefined;
    if (job) createInput.job = job;
    const route = (record: TaskRecord) => {
      const r: Parameters<TaskRouter['register']>[0] = { record };
      if (input.sendProgress) r.sendProgress = input.sendProgress;
      if (input.sendStatus) r.sendStatus = input.sendStatus;
      if (input.sink) r.sink = input.sink;
      this.router.register(r);
    };
    // A job added by the create may run and end before the create's reply arrives: its route must exist first, or
    // its status events reach a gateway that does not know it yet (and a plain call waits for nothing).
    const now = new Date();
    const prepared = job ? this.store.records.prepareCreate({ ...createInput, taskId }, now) : undefined;
    if (prepared) route(prepared.record);
    let outcome: Awaited<ReturnType<TaskRecords['createTask']>>;
    try {
      outcome = await this.createUnderCap(createInput, now, prepared, input.principal);
    } catch (error) {
      if (job) this.router.retire(taskId, { flush: false });
      span.end(error);
      throw error;
    }
    const { record, created, priority } = outcome;
    // The create linked the original to its replay (§30.3): a copy of the original held here would not show it.
    if (created && input.replay !== undefined) this.router.forget(input.replay.of);
    if (!created) {
      // A key replayed after its first call failed to add the job (§10.10): the job is added now, or the task would
      // wait for the reaper to fail it.
      if (createInput.idempotencyKey !== undefined) await this.addMissingJob(record, input, timeoutMs, level, delayMs);
      span.end();
      const joined = createInput.idempotencyKey === undefined;
      this.log.info(
        { taskId: record.taskId, tool: tool.name, principal: input.principal, mode: input.mode },
        joined
          ? 'call joined an unfinished one with the same dedupe key'
          : 'idempotency key already used; returning its task',
      );
      if (joined) this.metrics.callsJoined.inc({ tool: tool.name });
      return { ...record, joined: true };
    }
    if (!job) route(record);
    try {
      if (job && !outcome.jobAdded)
        throw new TaskrelayError('INTERNAL', `the create script added no job for ${taskId}`);
      if (!job) {
        await this.dispatcher.enqueue(tool, data, priority === undefined ? undefined : { priority }, delayMs);
      }
    } catch (error) {
      await this.unrun(record, error);
      span.end(error);
      throw error;
    }
    span.end();
    this.metrics.tasksCreated.inc({ tool: tool.name, mode: input.mode });
    this.log.info(
      {
        taskId: record.taskId,
        jobId: record.taskId,
        tool: tool.name,
        mode: input.mode,
        principal: input.principal,
        sessionId: input.sessionId,
        requestId: input.requestId,
      },
      'task created',
    );
    return record;
  }

  /**
   * What the create script gets for a call (PROTOCOL.md §10.1): the task with its ttl and deadline, its fair-share
   * entry (§25), its idempotency or dedupe key (§25.2), its webhook (§27.1) and the open-work cap (§25).
   */
  private async createInputOf(
    input: StartTaskInput,
    timeoutMs: number,
    level: number,
    delayMs: number,
  ): Promise<{ createInput: Parameters<TaskRecords['createTask']>[0]; taskId: string }> {
    const { tool } = input;
    // The start the call asked for, to the ms (not now + delay: that drifts by the time since the delay was taken).
    const startAt = delayMs > 0 && input.startAt !== undefined ? input.startAt : Date.now();
    const ttl = input.mode === 'call' ? CALL_TTL_MS : grantTtl(input.requestedTtlMs, this.config);
    const createInput: Parameters<TaskRecords['createTask']>[0] = {
      // Its job's fair-share entry is made with it, in its priority level: one round trip (§25, §25.1).
      fairShare: {
        // A delayed job waits in its share until it starts (§33.1): the entry outlives its delay too.
        ttlMs: delayMs + fairShareTtlMs({ timeoutMs, queueTimeoutMs: this.config.queueTimeoutMs }),
        base: priorityBase(level),
      },
      tool: tool.name,
      queue: tool.queue,
      principal: input.principal,
      mode: input.mode,
      ttl,
      pollInterval: this.config.pollIntervalMs,
      sessionId: input.sessionId,
      gatewayId: this.config.gatewayId,
      progressToken: input.progressToken,
      // The queue timeout counts from the start a delayed call asked for, not from its creation.
      deadlineAt: runDeadlineAt(tool, this.config, startAt),
    };
    if (delayMs > 0) createInput.waitingMessage = `scheduled for ${new Date(startAt).toISOString()}`;
    if (input.clientCapabilities !== undefined) createInput.clientCapabilities = input.clientCapabilities;
    Object.assign(createInput, operatorFields(input));
    if (input.mode === 'task' && input.idempotencyKey !== undefined) {
      createInput.idempotencyKey = input.idempotencyKey;
    } else if (tool.dedupe) {
      // A repeat of an unfinished call joins it (§25.2): the digest of the tool's dedupe arguments, in this mode.
      const { key, ttlMs } = tool.dedupe;
      const picked = key ? Object.fromEntries(key.map((k) => [k, input.args[k] ?? null])) : input.args;
      createInput.dedupe = { digest: canonicalDigest(picked), ttlMs };
    }
    const webhook = await this.acceptWebhook(input.webhook, input.mode, input.principal);
    if (webhook) createInput.webhook = webhook;
    const taskId = newTaskId(await this.shardOf(tool, input.principal, createInput));
    createInput.taskId = taskId;
    // Tasks and plain calls alike count toward the principal's open-work cap, checked by the create (PROTOCOL.md §25).
    const cap = this.config.openTasks;
    if (cap?.max) createInput.openTasks = { max: cap.max, ttlMs: cap.ttlMs };
    return { createInput, taskId };
  }

  /**
   * The shard a call's task goes to in the sharded layout (PROTOCOL.md §1.1), undefined in the single layout: the
   * tool's one shard, or one of its `shards`. A call with an idempotency or dedupe key goes to the shard its key
   * names, so a replay or a repeat finds the first task (those keys are kept per shard); the others in turn (each
   * gateway keeps its own turn per tool), so the calls spread evenly and fair share holds on every shard
   * (docs/SCALING.md).
   */
  private async shardOf(
    tool: CatalogTool,
    principal: string,
    createInput: Pick<Parameters<TaskRecords['createTask']>[0], 'idempotencyKey' | 'dedupe'>,
  ): Promise<string | undefined> {
    const placement = this.store.placement;
    if (placement === undefined) return undefined;
    const codes = await placement.codes(tool.queue, tool.shards ?? 1);
    if (codes.length <= 1) return codes[0];
    const key = createInput.idempotencyKey ?? createInput.dedupe?.digest;
    let at: number;
    if (key === undefined) {
      at = this.shardTurns.get(tool.queue) ?? randomInt(codes.length);
      this.shardTurns.set(tool.queue, (at + 1) % codes.length);
    } else {
      at = createHash('sha256').update(`${principal}\n${key}`).digest().readUInt32BE(0) % codes.length;
    }
    return codes[at];
  }

  /** The job's data (PROTOCOL.md §4): what a worker needs to run the call, and to log and trace it. */
  private jobDataOf(
    input: StartTaskInput,
    taskId: string,
    timeoutMs: number,
    level: number,
    trace: Record<string, string> | undefined,
  ): JobData {
    const data: JobData = {
      taskId,
      tool: input.tool.name,
      arguments: input.args,
      timeoutMs,
      queueTimeoutMs: this.config.queueTimeoutMs,
      principal: input.principal,
    };
    const cap = this.config.openTasks;
    if (level !== DEFAULT_PRIORITY) data.priority = level;
    if (cap?.max) data.maxOpen = cap.max;
    if (input.sessionId !== undefined) data.sessionId = input.sessionId;
    if (input.requestId !== undefined) data.requestId = String(input.requestId);
    if (trace) data.trace = trace;
    return data;
  }

  /** The create; at the open-work cap, what has ended is dropped from the principal's set and it is tried once more. */
  private createUnderCap(
    createInput: Parameters<TaskRecords['createTask']>[0],
    now: Date,
    prepared: ReturnType<TaskRecords['prepareCreate']> | undefined,
    principal: string,
  ): ReturnType<TaskRecords['createTask']> {
    const cap = this.config.openTasks;
    return this.store.records.createTask(createInput, now, prepared).catch(async (error: unknown) => {
      if (!(error instanceof OpenCapReached) || !cap) throw error;
      // The cap is kept per shard in the sharded layout: the set of the shard the task goes to (PROTOCOL.md §1.1).
      if ((await cap.prune(principal, createInput.taskId)) >= cap.max) throw cap.refusal(error.open);
      return this.store.records.createTask(createInput, now, prepared).catch((again: unknown) => {
        throw again instanceof OpenCapReached ? cap.refusal(again.open) : again;
      });
    });
  }

  /**
   * A created task whose job could not be added. The client is told the call failed, so the task must not run later:
   * it fails now, or the reaper fails it (the job does not exist) once Redis is back. Either way its idempotency key
   * is freed for a retry.
   */
  private async unrun(record: TaskRecord, error: unknown): Promise<void> {
    this.router.retire(record.taskId, { flush: false });
    // The client reads this message: the Redis/BullMQ details stay in the log.
    this.log.warn({ taskId: record.taskId, err: error }, 'could not enqueue the job');
    const message = 'Could not enqueue the job';
    await this.store.runs
      .transition(
        record.taskId,
        'failed',
        {
          statusMessage: message,
          result: { content: [{ type: 'text', text: message }], isError: true },
          error: { code: 'JOB_LOST', message },
        },
        { dropIdempotency: true },
      )
      .catch(() => undefined);
  }

  /**
   * The replay of an idempotency key whose task never started: its job is added if it does not exist (its first call
   * stored the task, then Redis went away before the job was added, PROTOCOL.md §10.10), with this call's arguments
   * (a retry sends the same call). A task that started, ended or was cancelled is left as it is.
   */
  private async addMissingJob(
    record: TaskRecord,
    input: StartTaskInput,
    timeoutMs: number,
    level: number,
    delayMs: number,
  ): Promise<void> {
    if (isTerminal(record.status) || record.attempt !== undefined || record.tool !== input.tool.name) return;
    const data = this.jobDataOf(input, record.taskId, timeoutMs, level, undefined);
    if (await this.dispatcher.ensureEnqueued(input.tool, data, delayMs)) {
      this.log.warn(
        { taskId: record.taskId, tool: input.tool.name, principal: input.principal },
        'idempotency key replayed for a task whose job was never added (Redis was unavailable); job added now',
      );
    }
  }

  /** The job for the create script to add (`JobDispatcher.prepare`); undefined: `enqueue` adds it after the create. */
  private async prepareJob(tool: CatalogTool, data: JobData) {
    try {
      return await this.dispatcher.prepare(tool, data);
    } catch (error) {
      this.log.debug({ taskId: data.taskId, err: error }, 'job not prepared for the create script; adding it after');
      return undefined;
    }
  }

  /** A webhook named with a call, checked (PROTOCOL.md §27.1): refused with a JSON-RPC error, or what to store. */
  private async acceptWebhook(
    value: unknown,
    mode: TaskMode,
    principal: string,
  ): Promise<{ url: string; cap: number } | undefined> {
    if (value === undefined) return undefined;
    if (!this.config.webhooks) {
      throw new WebhookRefusedError('webhooks are off on this gateway (TASKRELAY_WEBHOOK_SECRET is not set)');
    }
    return this.config.webhooks.accept(value, mode, principal);
  }
}

/**
 * What a task keeps for its operators (PROTOCOL.md §30.2, §30.3): its tags, its arguments (a task, not a plain call:
 * for a replay after its job is gone) and, for a replay, its original and the steps a redrive starts with.
 */
function operatorFields(input: StartTaskInput): Partial<Parameters<TaskRecords['createTask']>[0]> {
  const fields: Partial<Parameters<TaskRecords['createTask']>[0]> = {};
  if (input.tags !== undefined && input.tags.length > 0) fields.tags = input.tags;
  if (input.mode === 'task') fields.argumentsJson = JSON.stringify(input.args);
  if (input.replay !== undefined) {
    fields.replayOf = input.replay.of;
    if (input.replay.steps !== undefined) fields.steps = input.replay.steps;
  }
  return fields;
}

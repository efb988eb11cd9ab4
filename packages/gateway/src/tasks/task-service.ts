/**
 * What the gateway does with tools and tasks, independent of the wire rendering: start a task for a call, read it,
 * wait for it, list and cancel it — always for one principal, never by session.
 */
import { createHash, randomInt } from 'node:crypto';
import {
  TaskrelayError,
  inputKeyOf,
  isTerminal,
  newTaskId,
  OpenCapReached,
  type CancelReason,
  type InputRequest,
  type JobData,
  type Logger,
  type ProgressToken,
  type TaskRecords,
  type TaskStore,
  type TaskMode,
  type TaskPage,
  type TaskRecord,
  startTaskSpan,
  DEFAULT_PRIORITY,
  PRIORITY_LEVELS,
  canonicalDigest,
  priorityBase,
} from '@taskrelay/shared';
import { withWaitingReason, type CatalogTool, type ToolCatalog } from './catalog.js';
import { taskNotFound } from './errors.js';
import { fairShareTtlMs, type JobDispatcher } from './job-dispatcher.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { CallerSink, ProgressParams, ResultStream, TaskRouter } from './task-router.js';
import type { WebhookIntake } from './webhooks/intake.js';
import { WebhookRefusedError } from './webhooks/url-policy.js';

export interface TaskServiceConfig {
  gatewayId: string;
  defaultTtlMs: number;
  maxTtlMs: number;
  pollIntervalMs: number;
  maxToolTimeoutMs: number;
  /** How long a job may wait for a worker before the reaper fails its task (PROTOCOL.md §10.2). */
  queueTimeoutMs: number;
  /** The per-principal cap on unfinished tasks and plain calls. Default: none. */
  openTasks?: OpenTaskCap;
  /**
   * Checks a client's answer against its input request (PROTOCOL.md §12.5). The answer's shapes are the wire's, so
   * the check is given here rather than written in this layer.
   */
  checkAnswer: AnswerChecker;
  /** The creation-time webhook checks (PROTOCOL.md §27.1). Default: none, so every webhook is refused. */
  webhooks?: Pick<WebhookIntake, 'accept'>;
}

/**
 * The per-principal cap on unfinished work, tasks and plain calls (PROTOCOL.md §25). The task's create script checks
 * it and counts the task in the same step; at the cap, `prune` drops what has ended from the principal's set and the
 * create is tried once more, and `refusal` is the error when it is still at the cap.
 */
export interface OpenTaskCap {
  /** The cap (0: none); a job carries it, so a batch's children are held to it too (PROTOCOL.md §26.6). */
  readonly max: number;
  /** How long the principal's set outlives its newest member. */
  readonly ttlMs: number;
  /** Removes ended work (and stale reservations) from the principal's set; resolves with how many members remain. */
  prune(principal: string, taskId?: string): Promise<number>;
  /** The error for a principal with `open` unfinished tasks and calls, at the cap. */
  refusal(open: number): Error;
}

export type AnswerCheck = { ok: true; answer: Record<string, unknown> } | { ok: false; message: string };
export type AnswerChecker = (request: InputRequest, raw: unknown) => AnswerCheck;

/** A plain call's task is read once, by the waiter, right after it ends: it need not stay long (bounded Redis). */
export const CALL_TTL_MS = 10_000;
/** How long a cancel answered here waits for the owning gateway's ack (PROTOCOL.md §10.9). */
export const CANCEL_ACK_TIMEOUT_MS = 500;

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

/** How an answer to an input request ended: stored (the task resumes), invalid (asked again), refused (too late). */
export type InputAnswerOutcome = 'stored' | 'invalid' | 'refused';

export type CancelTrigger = 'tasks/cancel' | 'notifications/cancelled' | 'stream-closed' | 'gateway-shutdown';

export class TaskService {
  /** Per tool queue, the shard its next unkeyed call goes to, in the sharded layout (`shardOf`). */
  private readonly shardTurns = new Map<string, number>();

  constructor(
    private readonly store: TaskStore,
    private readonly catalog: ToolCatalog,
    private readonly dispatcher: JobDispatcher,
    private readonly router: TaskRouter,
    private readonly metrics: GatewayMetrics,
    readonly log: Logger,
    private readonly config: TaskServiceConfig,
  ) {}

  listTools(): Promise<CatalogTool[]> {
    return this.catalog.list();
  }

  /**
   * Finds the tool and checks the arguments against it: an unknown tool is thrown (the spec's -32602); arguments that
   * do not match the schema are returned as `invalid` (a message naming the field), since the caller gets those as an
   * `isError` tool result (SEP-1303). What kind of call it is, the protocol layer decides (`callKind`).
   */
  async resolveCall(name: string, args: Record<string, unknown>): Promise<{ tool: CatalogTool; invalid?: string }> {
    const tool = await this.catalog.find(name);
    if (!tool) throw new TaskrelayError('TOOL_NOT_FOUND', `Unknown tool: ${name}`);
    const invalid = this.catalog.validate(tool, args);
    return invalid === undefined ? { tool } : { tool, invalid };
  }

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

  /** A task the principal may see; plain calls' internal tasks are not tasks to the client. */
  async get(taskId: string, principal: string): Promise<TaskRecord> {
    const record = await this.store.records.get(taskId);
    if (!record || record.principal !== principal || record.mode !== 'task') throw taskNotFound(taskId);
    return this.withWaitingReason(record);
  }

  /**
   * `subscriptions/listen` (PROTOCOL.md §18.1): follows a task the principal may see, calling `onChange` on each of
   * its status events from any gateway or worker, and returns it as read now; undefined (nothing followed) for a task
   * that is missing, expired or not the principal's. One read, which also registers this gateway as a watcher.
   */
  async follow(
    taskId: string,
    principal: string,
    onChange: () => void,
  ): Promise<{ record: TaskRecord; stop: () => void } | undefined> {
    const stop = this.router.follow(taskId, onChange);
    try {
      const record = await this.router.watch(taskId);
      if (!record || record.principal !== principal || record.mode !== 'task') {
        stop();
        return undefined;
      }
      return { record: await this.withWaitingReason(record), stop };
    } catch (error) {
      stop();
      throw error;
    }
  }

  /** The record with why it waits, when it does (`withWaitingReason`, PROTOCOL.md §3.2). */
  private async withWaitingReason(record: TaskRecord): Promise<TaskRecord> {
    const shown = await withWaitingReason(record, this.catalog);
    // The catalog warns once when the tool's or pool's last worker goes; this is per poll.
    if (shown !== record)
      this.log.debug({ taskId: record.taskId, tool: record.tool, queue: record.queue }, shown.statusMessage);
    return shown;
  }

  /**
   * tasks/result: one read (which also registers this gateway as a waiter), then status events. The task's input
   * requests go out on `stream` while it waits (PROTOCOL.md §12.9).
   */
  async waitForTerminal(
    taskId: string,
    principal: string,
    signal?: AbortSignal,
    stream?: ResultStream,
  ): Promise<TaskRecord> {
    return this.router.waitForTerminal(taskId, {
      signal,
      authorize: (record) => record.principal === principal && record.mode === 'task',
      stream,
    });
  }

  /**
   * A client's answer to input request `n` of `record` (PROTOCOL.md §12.3, §12.5): checked against the request, then
   * stored while the request is pending (the task goes back to `working`), then the suspended job is promoted.
   */
  async answerInput(record: TaskRecord, n: string, raw: unknown): Promise<InputAnswerOutcome> {
    const log = this.log.child({ taskId: record.taskId, inputRequest: n });
    const request = record.inputRequests?.[n];
    if (!request) return 'refused';
    const checked = this.config.checkAnswer(request, raw);
    if (!checked.ok) {
      log.warn({ method: request.method, reason: checked.message }, 'bad answer to an input request; asking again');
      return 'invalid';
    }
    const deadlineAt = runDeadlineAt(await this.catalog.find(record.tool).catch(() => undefined), this.config);
    const outcome = await this.store.runs.answerInput(record.taskId, n, checked.answer, deadlineAt);
    if (!outcome.ok) {
      log.info({ status: outcome.status ?? 'missing' }, 'answer refused: the request is no longer pending');
      return 'refused';
    }
    // The task resumes once its last pending request is answered (several may be asked at once, §12.2).
    if (outcome.resumed) await this.dispatcher.promote(record.taskId, outcome.queue || record.queue);
    log.info({ method: request.method, resumed: outcome.resumed }, 'input request answered');
    return 'stored';
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

  /** Waits for a joined call's task to end (§25.2); `signal` only stops the wait, it cancels nothing. */
  waitForJoined(record: TaskRecord, signal: AbortSignal): Promise<TaskRecord> {
    return this.router.waitForTerminal(record.taskId, { signal });
  }

  async list(principal: string, cursor: string | undefined): Promise<TaskPage> {
    const page = await this.store.records.list(principal, cursor);
    return { ...page, tasks: page.tasks.filter((t) => t.mode === 'task') };
  }

  /** State first: the task is `cancelled` in Redis before this returns; then the worker is told. */
  /** An operator cancels any principal's task (PROTOCOL.md §30.5), as its owner's `tasks/cancel` would. */
  async cancelAsOperator(taskId: string): Promise<TaskRecord> {
    const record = await this.store.records.get(taskId);
    if (!record) throw taskNotFound(taskId);
    return this.cancel(taskId, record.principal);
  }

  async cancel(taskId: string, principal: string): Promise<TaskRecord> {
    const stopTimer = this.metrics.cancelLatency.startTimer({ trigger: 'tasks/cancel' });
    const record = await this.get(taskId, principal);
    if (isTerminal(record.status)) throw terminalError(record);
    const outcome = await this.applyCancel(record, 'tasks/cancel');
    if (!outcome) {
      const now = await this.store.records.get(taskId);
      throw now ? terminalError(now) : taskNotFound(taskId);
    }
    stopTimer();
    return outcome;
  }

  /**
   * Answers input requests of a task the principal owns (PROTOCOL.md §12.3). An answer to a pending request that does
   * not fit it is refused with INVALID_ARGUMENTS saying why, and nothing of the call is stored. Answers to requests
   * that are not pending (answered already, never asked, the task moved on) change nothing and are ignored: the
   * extension's `tasks/update` is an eventually consistent ack. When the last pending request is answered, the
   * suspended job is promoted. Returns the request numbers that were stored.
   */
  async answer(taskId: string, principal: string, responses: Record<string, unknown>): Promise<string[]> {
    const record = await this.get(taskId, principal);
    return (await this.answerPending(record, responses)).stored;
  }

  /**
   * A plain call's task the principal started, for a retry of its input round (PROTOCOL.md §17.3); undefined when it
   * is gone (expired, or never was) or is not the principal's plain call.
   */
  async getCall(taskId: string, principal: string): Promise<TaskRecord | undefined> {
    const record = await this.store.records.get(taskId);
    if (!record || record.principal !== principal || record.mode !== 'call') return undefined;
    return record;
  }

  /**
   * Answers a plain call's pending input requests (an MRTR retry, §17.3), as `answer` does a task's: checked, then
   * stored, and the job promoted once nothing is pending. `resumed`: the last pending request was answered.
   */
  answerCall(record: TaskRecord, responses: Record<string, unknown>): Promise<{ stored: string[]; resumed: boolean }> {
    return this.answerPending(record, responses);
  }

  /**
   * A retried input round of a plain call takes the call's route before its answers resume the run (PROTOCOL.md
   * §17.3): this gateway owns the call from now on (the previous owner watches it to its end), and the progress the
   * tool reports goes to `sendProgress` on the retry's own token. False when the call ended meanwhile.
   */
  async routeRetry(
    record: TaskRecord,
    progressToken: ProgressToken | undefined,
    sendProgress?: (params: ProgressParams, taskId: string) => Promise<void>,
  ): Promise<boolean> {
    if (!(await this.store.records.routeCall(record.taskId, this.config.gatewayId, progressToken))) return false;
    this.router.reroute(record, progressToken, sendProgress);
    return true;
  }

  private async answerPending(
    record: TaskRecord,
    responses: Record<string, unknown>,
  ): Promise<{ stored: string[]; resumed: boolean }> {
    const { taskId, principal } = record;
    // Answers are keyed as the wire shows the requests: the tool's name for one, else its number (§17.6).
    const pending = new Map<string, string>();
    if (record.status === 'input_required') {
      for (const n of record.pendingInputs ?? []) pending.set(inputKeyOf(n, record.inputRequests?.[n]), n);
    }
    const checked: Array<[string, Record<string, unknown>]> = [];
    for (const [key, response] of Object.entries(responses)) {
      const n = pending.get(key);
      const request = n === undefined ? undefined : record.inputRequests?.[n];
      if (n === undefined || !request) {
        this.log.info({ taskId, principal, inputRequest: key }, 'answer to a request that is not pending ignored');
        continue;
      }
      const check = this.config.checkAnswer(request, response);
      if (!check.ok) throw new TaskrelayError('INVALID_ARGUMENTS', `Answer to input request ${key}: ${check.message}`);
      checked.push([n, check.answer]);
    }
    const stored: string[] = [];
    const tool = checked.length > 0 ? await this.catalog.find(record.tool).catch(() => undefined) : undefined;
    let resumed = false;
    for (const [key, answer] of checked) {
      const deadlineAt = runDeadlineAt(tool, this.config);
      const outcome = await this.store.runs.answerInput(taskId, key, answer, deadlineAt);
      if (!outcome.ok) continue; // answered meanwhile by another route: the first answer stands
      stored.push(key);
      this.log.info({ taskId, principal, inputRequest: key }, 'input request answered');
      if (outcome.resumed) {
        resumed = true;
        await this.dispatcher.promote(taskId, outcome.queue || record.queue);
      }
    }
    return { stored, resumed };
  }

  /**
   * Waits for one round of a plain call (PROTOCOL.md §17.1): until its task ends (`asked: false`, the terminal
   * record) or suspends for input (`asked: true`, the record with its pending requests), on any gateway. An abort of
   * `signal` ends the wait (the call goes on).
   */
  async waitForRound(
    taskId: string,
    principal: string,
    signal: AbortSignal,
  ): Promise<{ record: TaskRecord; asked: boolean }> {
    let asked: TaskRecord | undefined;
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
    const sink: CallerSink = {
      deliverInput: (record) => {
        if (record.status !== 'input_required' || asked) return;
        asked = record;
        stop.abort(new Error('input requested'));
      },
      withdrawInput: () => undefined,
      sendLog: () => undefined,
    };
    try {
      const record = await this.router.waitForTerminal(taskId, {
        signal: stop.signal,
        authorize: (r) => r.principal === principal,
        stream: { sessionId: undefined, sink },
      });
      return { record, asked: false };
    } catch (error) {
      if (asked) return { record: asked, asked: true };
      throw error;
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * An `inputFirst` tool's plain call becomes a task of its principal once its answers resume it (PROTOCOL.md §17.4):
   * mode `task`, the granted ttl, listed from then on. Undefined when the call is gone or ended meanwhile.
   */
  async becomeTask(record: TaskRecord, requestedTtlMs: number | undefined): Promise<TaskRecord | undefined> {
    const ttl = grantTtl(requestedTtlMs, this.config);
    if (!(await this.store.records.becomeTask(record, ttl))) return undefined;
    this.metrics.tasksCreated.inc({ tool: record.tool, mode: 'task' });
    this.log.info(
      { taskId: record.taskId, tool: record.tool, principal: record.principal },
      'plain call became a task',
    );
    return (await this.store.records.get(record.taskId)) ?? undefined;
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
    // Another gateway routes this task's progress: it acks once it retired the route, and only then is the client
    // answered, so no progress notification can follow the answer (PROTOCOL.md §10.9).
    const owner = record.gatewayId;
    const remoteOwner = owner !== undefined && owner !== this.config.gatewayId && record.progressToken !== undefined;
    const ack = remoteOwner ? this.router.expectAck(record.taskId, CANCEL_ACK_TIMEOUT_MS) : undefined;
    const outcome = await this.store.runs
      .transition(
        record.taskId,
        'cancelled',
        { statusMessage, cancelReason: reason },
        remoteOwner ? { ackTo: this.config.gatewayId } : {},
        now,
      )
      .catch((error: unknown) => {
        ack?.cancel();
        throw error;
      });
    if (!outcome.ok) {
      ack?.cancel();
      return undefined;
    }
    // Nothing more is forwarded for this task, even an update already on its way.
    this.router.retire(record.taskId, { flush: false, endedAs: 'cancelled' });
    // The worker is told, and a waiting job removed, before the owner's ack is awaited: a job must not be taken in
    // between and run (§21.2.1). A task whose run never started (a delayed start not reached, §33.1) has its job
    // removed, not promoted.
    const started = record.attempt !== undefined;
    await this.dispatcher.cancel(record.taskId, record.queue, reason, record.principal, started).catch((error) => {
      ack?.cancel();
      throw error;
    });
    if (ack && !(await ack.wait())) {
      this.log.debug({ taskId: record.taskId, owner }, 'no cancel ack from the owning gateway (gone?)');
    }
    this.metrics.tasksCancelled.inc({ trigger });
    this.log.info(
      { taskId: record.taskId, tool: record.tool, principal: record.principal, trigger, reason },
      'task cancelled',
    );
    // A suspended job the remove could not take: woken, a worker finds the task cancelled and ends it (§12.8).
    if (record.status === 'input_required') await this.dispatcher.promote(record.taskId, record.queue);
    return {
      ...record,
      status: 'cancelled',
      statusMessage,
      lastUpdatedAt: now.toISOString(),
      cancelReason: reason,
    };
  }
}

/** A tool's run-time bound: its own `timeoutMs`, never above the gateway's maximum. */
export function toolTimeoutMs(
  tool: Pick<CatalogTool, 'timeoutMs'> | undefined,
  config: Pick<TaskServiceConfig, 'maxToolTimeoutMs'>,
): number {
  return Math.min(tool?.timeoutMs ?? config.maxToolTimeoutMs, config.maxToolTimeoutMs);
}

/**
 * When the reaper may fail a task that has not finished (PROTOCOL.md §10): its wait in the queue, then its run. The
 * one place it is computed, for a new task and for a resumed one (both answer routes, §12.3).
 */
export function runDeadlineAt(
  tool: Pick<CatalogTool, 'timeoutMs'> | undefined,
  config: Pick<TaskServiceConfig, 'maxToolTimeoutMs' | 'queueTimeoutMs'>,
  now = Date.now(),
): number {
  return now + config.queueTimeoutMs + toolTimeoutMs(tool, config);
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

/**
 * A call's priority level (PROTOCOL.md §25.1): what it asks for (`_meta["dev.taskrelay/priority"]`), else its tool's
 * (`defineTool({ priority })`), else 3. A principal may ask for its tool's level or a later one (4, 5); only an
 * operator may ask for an earlier one, so priority never lets a principal take more than its share from others.
 */
export function priorityLevel(
  tool: Pick<CatalogTool, 'name' | 'priority'>,
  input: Pick<StartTaskInput, 'priority' | 'operator'>,
): number {
  const own = tool.priority ?? DEFAULT_PRIORITY;
  const asked = input.priority;
  if (asked === undefined) return own;
  if (asked < own && !input.operator) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["dev.taskrelay/priority"] ${asked} is ahead of what tool ${tool.name} allows (${own}); ` +
        `ask for ${own} to ${PRIORITY_LEVELS}, or be an operator`,
    );
  }
  return asked;
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

/**
 * What the gateway does with tools and tasks, independent of the wire rendering: start a task for a call, read it,
 * wait for it, list and cancel it — always for one principal, never by session.
 */
import {
  TaskrelayError,
  inputKeyOf,
  isTerminal,
  type CancelReason,
  type Logger,
  type ProgressToken,
  type TaskStore,
  type TaskPage,
  type TaskRecord,
} from '@taskrelay/shared';
import { withWaitingReason, type CatalogTool, type ToolCatalog } from './catalog.js';
import { taskNotFound } from './errors.js';
import type { JobDispatcher } from './job-dispatcher.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import { CANCEL_ACK_TIMEOUT_MS, grantTtl, runDeadlineAt, type TaskServiceConfig } from './task-policy.js';
import { TaskStarter, type StartTaskInput, type StartedTask } from './task-start.js';
import type { CallerSink, ProgressParams, ResultStream, TaskRouter } from './task-router.js';

/** How an answer to an input request ended: stored (the task resumes), invalid (asked again), refused (too late). */
export type InputAnswerOutcome = 'stored' | 'invalid' | 'refused';

export type CancelTrigger = 'tasks/cancel' | 'notifications/cancelled' | 'stream-closed' | 'gateway-shutdown';

export class TaskService {
  private readonly starter: TaskStarter;

  constructor(
    private readonly store: TaskStore,
    private readonly catalog: ToolCatalog,
    private readonly dispatcher: JobDispatcher,
    private readonly router: TaskRouter,
    private readonly metrics: GatewayMetrics,
    readonly log: Logger,
    private readonly config: TaskServiceConfig,
  ) {
    this.starter = new TaskStarter(store, dispatcher, router, metrics, log, config);
  }

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
  rejectTask(
    input: Pick<StartTaskInput, 'tool' | 'principal' | 'sessionId' | 'requestedTtlMs' | 'webhook'>,
    message: string,
  ): Promise<TaskRecord> {
    return this.starter.rejectTask(input, message);
  }

  /**
   * Stores the task durably, starts routing its progress, then enqueues its job. With an idempotency key the
   * principal already used, returns that task and starts nothing.
   */
  start(input: StartTaskInput): Promise<StartedTask> {
    return this.starter.start(input);
  }

  /** A task the principal may see; plain calls' internal tasks are not tasks to the client. */
  async get(taskId: string, principal: string): Promise<TaskRecord> {
    // A task that ended here a moment ago is answered as its terminal event told it, with no read (PROTOCOL.md §6.7):
    // the poll that finds a task done is most often the one right after its end. Only a copy that shows it as the
    // principal's task answers: one that does not (a call that became a task after its route was made, §17.4) is
    // read again.
    const visible = principalsTask(principal);
    const held = this.router.recentlyEnded(taskId);
    const record = held !== undefined && visible(held) ? held : await this.store.records.get(taskId);
    if (!record || !visible(record)) throw taskNotFound(taskId);
    return this.withWaitingReason(record);
  }

  /**
   * `tasks/get`: `get`, after a young task routed here had a moment to end (PROTOCOL.md §28.1). A client's first poll
   * comes right after the create; without the wait it finds most short tasks still `working` and waits a whole
   * suggested interval for the next.
   */
  async poll(taskId: string, principal: string): Promise<TaskRecord> {
    await this.router.settle(taskId, principalsTask(principal));
    return this.get(taskId, principal);
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
      if (!record || !principalsTask(principal)(record)) {
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
      authorize: principalsTask(principal),
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

function terminalError(record: TaskRecord): TaskrelayError {
  return new TaskrelayError('TASK_TERMINAL', `Cannot cancel task in terminal status: ${record.status}`);
}

/** Whether a record is a task `principal` may see: its own, and a task (a plain call's record is not one to it). */
function principalsTask(principal: string): (record: TaskRecord) => boolean {
  return (record) => record.principal === principal && record.mode === 'task';
}

/**
 * What one session's client is sent besides responses (PROTOCOL.md §12, §15): the input requests of its tasks
 * (`elicitation/create`, `sampling/createMessage`) with the answers they bring back, and tools' log messages
 * (`notifications/message`) filtered by the session's `logging/setLevel`. One per session; each stream of the session
 * (the GET stream, a `tools/call` or `tasks/result` response stream) gets a `CallerSink` from it.
 */
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { LoggingMessageNotification, RequestId } from '@modelcontextprotocol/sdk/types.js';
import {
  INPUT_CAPABILITIES,
  LOG_LEVELS,
  type LogLevel,
  type Logger,
  type TaskMode,
  type TaskRecord,
} from '@taskrelay/shared';
import { z } from 'zod';
import type { CallerSink } from '../../tasks/task-router.js';
import { relatedTaskMeta } from '../../wire/task-wire.js';

/** What a session receives before it calls `logging/setLevel`: `info` and above (debug is opt-in). */
export const DEFAULT_LOG_LEVEL: LogLevel = 'info';

/** A client that sends this many bad answers in a row to one request on one stream is not asked there again. */
export const MAX_BAD_ANSWERS = 3;

/** The longest a sent request waits for its answer in this process (setTimeout's limit, ~24.8 days). */
const MAX_WAIT_MS = 2_147_483_647;

export type AnswerOutcome = 'stored' | 'invalid' | 'refused';

export interface ClientChannelOptions {
  server: Server;
  sessionId: string | undefined;
  log: Logger;
  /** Checks the client's answer to request `n` and, when good, stores it and wakes the task (TaskService). */
  answer: (record: TaskRecord, n: string, answer: unknown) => Promise<AnswerOutcome>;
}

interface Delivery {
  taskId: string;
  n: string;
  aborted: boolean;
  /** The request in flight: aborting it sends the client `notifications/cancelled` for it (and only for it). */
  inflight: AbortController | undefined;
}

function abortDelivery(delivery: Delivery, reason: string): void {
  delivery.aborted = true;
  delivery.inflight?.abort(reason);
}

const AnyResultSchema = z.looseObject({});

export class ClientChannel {
  private level: LogLevel = DEFAULT_LOG_LEVEL;
  /** Requests sent and not yet answered, by task, request number and stream: one each (§12). */
  private readonly deliveries = new Map<string, Delivery>();
  private closed = false;

  constructor(private readonly options: ClientChannelOptions) {
    // SDK clients (1.32.2, `Protocol._oncancel`) ignore `notifications/cancelled` for request id 0, and the SDK server
    // numbers its requests from 0: start this session's at 1, so every request it sends can be withdrawn.
    const counter = options.server as unknown as { _requestMessageId?: unknown };
    if (counter._requestMessageId === 0) counter._requestMessageId = 1;
  }

  get sessionId(): string | undefined {
    return this.options.sessionId;
  }

  setLevel(level: LogLevel): void {
    this.level = level;
  }

  /** The capabilities of the session's client that tools may use (`elicitation`, `sampling`), from `initialize`. */
  capabilities(): string[] {
    const declared = this.options.server.getClientCapabilities();
    return (['elicitation', 'sampling', 'roots'] as const).filter((name) => declared?.[name] !== undefined);
  }

  /**
   * The sink for one stream: a request's response stream (`relatedRequestId`), or the GET stream when undefined.
   * `mode` says whether messages carry the related-task `_meta` (tasks do, plain calls don't).
   */
  sink(relatedRequestId: RequestId | undefined, mode: TaskMode): CallerSink {
    const streamKey = relatedRequestId === undefined ? 'GET' : JSON.stringify(relatedRequestId);
    return {
      deliverInput: (record) => this.deliver(record, relatedRequestId, streamKey, mode),
      withdrawInput: (taskId, n) => this.withdraw(taskId, n, streamKey),
      sendLog: (taskId, params) => this.sendLog(taskId, params, relatedRequestId, mode),
    };
  }

  /** The session closed: pending requests are dropped (their tasks keep waiting; a new session can answer). */
  close(): void {
    this.closed = true;
    for (const delivery of this.deliveries.values()) abortDelivery(delivery, 'session closed');
    this.deliveries.clear();
  }

  private sendLog(
    taskId: string,
    params: LoggingMessageNotification['params'],
    relatedRequestId: RequestId | undefined,
    mode: TaskMode,
  ): void {
    if (this.closed || LOG_LEVELS.indexOf(params.level) < LOG_LEVELS.indexOf(this.level)) return;
    const message = { method: 'notifications/message' as const, params };
    if (mode === 'task') message.params = { ...params, _meta: { ...params._meta, ...relatedTaskMeta(taskId) } };
    this.options.server
      .notification(message, relatedRequestId === undefined ? undefined : { relatedRequestId })
      .catch((error: unknown) => this.options.log.debug({ taskId, err: error }, 'log message not delivered'));
  }

  private deliver(
    record: TaskRecord,
    relatedRequestId: RequestId | undefined,
    streamKey: string,
    mode: TaskMode,
  ): void {
    if (this.closed || record.status !== 'input_required') return;
    // Requests asked at once are pending together (§12.2): each is its own delivery.
    for (const n of record.pendingInputs ?? []) this.deliverOne(record, n, relatedRequestId, streamKey, mode);
  }

  private deliverOne(
    record: TaskRecord,
    n: string,
    relatedRequestId: RequestId | undefined,
    streamKey: string,
    mode: TaskMode,
  ): void {
    const request = record.inputRequests?.[n];
    if (!request) return;
    const key = `${record.taskId}\u0000${n}\u0000${streamKey}`;
    if (this.deliveries.has(key)) return;
    const log = this.options.log.child({ taskId: record.taskId, inputRequest: n, method: request.method });
    const capability = INPUT_CAPABILITIES[request.method];
    if (!this.capabilities().includes(capability)) {
      // ctx.elicit refuses this up front when the task recorded its client's capabilities; one that did not waits.
      log.warn(`the client did not declare the ${capability} capability; request not sent`);
      return;
    }
    const delivery: Delivery = { taskId: record.taskId, n, aborted: false, inflight: undefined };
    this.deliveries.set(key, delivery);
    void this.run(record, n, request, relatedRequestId, mode, delivery, log).finally(() => {
      if (this.deliveries.get(key) === delivery) this.deliveries.delete(key);
    });
  }

  private async run(
    record: TaskRecord,
    n: string,
    request: NonNullable<TaskRecord['inputRequests']>[string],
    relatedRequestId: RequestId | undefined,
    mode: TaskMode,
    delivery: Delivery,
    log: Logger,
  ): Promise<void> {
    // A plain call's task is internal (the client cannot tasks/get it): only tasks name themselves.
    const params =
      mode === 'task'
        ? {
            ...request.params,
            _meta: {
              ...(request.params['_meta'] as Record<string, unknown> | undefined),
              ...relatedTaskMeta(record.taskId),
            },
          }
        : request.params;
    for (let bad = 0; bad < MAX_BAD_ANSWERS;) {
      if (delivery.aborted) return;
      const timeout = Math.min(MAX_WAIT_MS, Math.max(1_000, (record.deadlineAt ?? 0) - Date.now()));
      const inflight = new AbortController();
      delivery.inflight = inflight;
      const { signal } = inflight;
      let raw: unknown;
      try {
        raw = await this.options.server.request(
          { method: request.method, params },
          AnyResultSchema,
          relatedRequestId === undefined ? { signal, timeout } : { signal, timeout, relatedRequestId },
        );
      } catch (error) {
        if (!delivery.aborted) log.warn({ err: error }, 'input request not answered on this stream');
        return;
      } finally {
        delivery.inflight = undefined;
      }
      if (delivery.aborted) return;
      const outcome = await this.options.answer(record, n, raw).catch((error: unknown) => {
        log.warn({ err: error }, 'could not store the answer; asking again');
        return 'invalid' as const;
      });
      if (outcome !== 'invalid') {
        // Answered (or refused as late): the same request still open on other streams of this session is moot.
        for (const other of this.deliveries.values()) {
          if (other !== delivery && other.taskId === record.taskId && other.n === n) abortDelivery(other, 'answered');
        }
        return;
      }
      bad += 1;
    }
    log.warn({ badAnswers: MAX_BAD_ANSWERS }, 'too many bad answers on this stream; not asking here again');
  }

  private withdraw(taskId: string, n: string | undefined, streamKey: string): void {
    for (const [key, delivery] of this.deliveries) {
      if (delivery.taskId !== taskId || (n !== undefined && delivery.n !== n)) continue;
      if (!key.endsWith(`\u0000${streamKey}`)) continue;
      abortDelivery(delivery, 'no longer pending');
      this.deliveries.delete(key);
    }
  }
}

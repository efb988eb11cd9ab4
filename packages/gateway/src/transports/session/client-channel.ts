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

/**
 * What the channel asks of the session's transport (`SessionTransport`): whether a stream is open now, and a call
 * each time one ends. A transport without them (tests) counts every stream as open.
 */
export interface SessionStreams {
  isStreamOpen(relatedRequestId?: RequestId): boolean;
  onStreamEnded(listener: () => void): () => void;
}

/** One stream of the session that wants a question: where it would be sent, and how. */
interface Target {
  record: TaskRecord;
  streamKey: string;
  relatedRequestId: RequestId | undefined;
  mode: TaskMode;
}

/** A question in flight on one stream: the session's only delivery of it (PROTOCOL.md §19). */
interface Delivery extends Target {
  taskId: string;
  n: string;
  aborted: boolean;
  /** The request in flight: aborting it sends the client `notifications/cancelled` for it (and only for it). */
  inflight: AbortController | undefined;
  /**
   * The client's answer is in hand and being stored: the question stays here until the store says whether it took
   * it. Moving it meanwhile would ask the client a question it has just answered.
   */
  answering: boolean;
  /** Its stream left while the answer was being stored: a refused answer moves the question to a standby. */
  moveOnEnd: boolean;
}

function abortDelivery(delivery: Delivery, reason: string): void {
  delivery.aborted = true;
  delivery.inflight?.abort(reason);
}

/** How many answered questions a session remembers, so a late wish to ask one again is refused (§19). */
const SETTLED_MAX = 1_000;

const AnyResultSchema = z.looseObject({});

const questionKey = (taskId: string, n: string) => `${taskId}\u0000${n}`;

export class ClientChannel {
  private level: LogLevel = DEFAULT_LOG_LEVEL;
  /** The question in flight, by task and request number: one per session, on one of its streams (§19). */
  private readonly deliveries = new Map<string, Delivery>();
  /** Other streams that want a question in flight elsewhere, by question then stream: it moves to one of them. */
  private readonly standbys = new Map<string, Map<string, Target>>();
  /** Questions answered (or refused as late) in this session, oldest first: never asked here again. */
  private readonly settled = new Set<string>();
  private stopWatching: (() => void) | undefined;
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
      withdrawInput: (taskId, n) => this.withdraw(taskId, n, streamKey, false),
      leave: (taskId) => this.withdraw(taskId, undefined, streamKey, true),
      sendLog: (taskId, params) => this.sendLog(taskId, params, relatedRequestId, mode),
    };
  }

  /** The session closed: pending requests are dropped (their tasks keep waiting; a new session can answer). */
  close(): void {
    this.closed = true;
    this.stopWatching?.();
    for (const delivery of this.deliveries.values()) abortDelivery(delivery, 'session closed');
    this.deliveries.clear();
    this.standbys.clear();
  }

  /** The session's transport, when it can tell open streams; watched from the first question on. */
  private streams(): SessionStreams | undefined {
    const transport = this.options.server.transport as Partial<SessionStreams> | undefined;
    if (typeof transport?.isStreamOpen !== 'function' || typeof transport.onStreamEnded !== 'function') {
      return undefined;
    }
    this.stopWatching ??= transport.onStreamEnded(() => this.onStreamEnded());
    return transport as SessionStreams;
  }

  private isOpen(target: Target): boolean {
    return this.streams()?.isStreamOpen(target.relatedRequestId) ?? true;
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
    for (const n of record.pendingInputs ?? []) this.deliverOne({ record, streamKey, relatedRequestId, mode }, n);
  }

  /**
   * A stream wants question `n` of its task (PROTOCOL.md §19): sent there when the session has it in flight nowhere,
   * or only on a stream that has closed since (it moves here); otherwise this stream waits as a standby.
   */
  private deliverOne(target: Target, n: string): void {
    const { record } = target;
    const request = record.inputRequests?.[n];
    if (!request) return;
    const key = questionKey(record.taskId, n);
    if (this.settled.has(key)) return;
    const log = this.options.log.child({ taskId: record.taskId, inputRequest: n, method: request.method });
    const capability = INPUT_CAPABILITIES[request.method];
    if (!this.capabilities().includes(capability)) {
      // ctx.elicit refuses this up front when the task recorded its client's capabilities; one that did not waits.
      log.warn(`the client did not declare the ${capability} capability; request not sent`);
      return;
    }
    const current = this.deliveries.get(key);
    if (current?.streamKey === target.streamKey) return; // once per stream; a resume replays it
    if (current && (current.answering || this.isOpen(current))) {
      const waiting = this.standbys.get(key) ?? new Map<string, Target>();
      this.standbys.set(key, waiting);
      waiting.set(target.streamKey, target);
      return;
    }
    if (current) {
      // Its stream closed before an answer: the question moves to this open one (the old request is withdrawn).
      log.info({ from: current.streamKey }, 'input request moves to another stream of the session');
      this.deliveries.delete(key);
      abortDelivery(current, 'moved to another stream');
    }
    this.start(target, n, log);
  }

  private start(target: Target, n: string, log: Logger): void {
    const { record } = target;
    const request = record.inputRequests?.[n];
    if (!request) return;
    const key = questionKey(record.taskId, n);
    this.standbys.get(key)?.delete(target.streamKey);
    const delivery: Delivery = {
      ...target,
      taskId: record.taskId,
      n,
      aborted: false,
      inflight: undefined,
      answering: false,
      moveOnEnd: false,
    };
    this.deliveries.set(key, delivery);
    void this.run(delivery, request, log).then(
      (answered) => this.ended(delivery, answered, log),
      (error: unknown) => {
        log.warn({ err: error }, 'input request delivery failed');
        this.ended(delivery, false, log);
      },
    );
  }

  /** A delivery ended: answered (settled: every standby goes), or not (the question goes to a standby, if any). */
  private ended(delivery: Delivery, answered: boolean, log: Logger): void {
    const key = questionKey(delivery.taskId, delivery.n);
    if (this.deliveries.get(key) === delivery) this.deliveries.delete(key);
    if (answered) {
      this.settle(key);
      return;
    }
    if ((delivery.aborted && !delivery.moveOnEnd) || this.closed || this.deliveries.has(key)) return;
    this.moveToStandby(key, log);
  }

  /** The question is answered, or moot: no stream of this session is asked it again, even by a late read of it. */
  private settle(key: string): void {
    this.standbys.delete(key);
    this.settled.add(key);
    if (this.settled.size > SETTLED_MAX) this.settled.delete(this.settled.values().next().value as string);
  }

  /** The question in flight nowhere now: sent on a standby stream, an open one first. */
  private moveToStandby(key: string, log: Logger): void {
    const waiting = this.standbys.get(key);
    if (!waiting || waiting.size === 0) {
      this.standbys.delete(key);
      return;
    }
    const targets = [...waiting.values()];
    const next = targets.find((t) => this.isOpen(t)) ?? targets[0];
    if (!next) return;
    const n = key.slice(key.indexOf('\u0000') + 1);
    this.start(next, n, log);
  }

  /** A stream of the session ended: each question in flight on a now closed stream moves to an open standby. */
  private onStreamEnded(): void {
    if (this.closed) return;
    for (const [key, delivery] of [...this.deliveries]) {
      if (delivery.answering || this.isOpen(delivery)) continue;
      const open = [...(this.standbys.get(key)?.values() ?? [])].find((t) => this.isOpen(t));
      if (!open) continue; // kept: a Last-Event-ID resume of its stream replays it, or the next stream takes it
      this.options.log.info(
        { taskId: delivery.taskId, inputRequest: delivery.n, from: delivery.streamKey, to: open.streamKey },
        'input request moves to another stream of the session (its stream closed unanswered)',
      );
      this.deliveries.delete(key);
      abortDelivery(delivery, 'moved to another stream');
      const request = open.record.inputRequests?.[delivery.n];
      if (request) {
        this.start(open, delivery.n, this.options.log.child({ taskId: delivery.taskId, inputRequest: delivery.n }));
      }
    }
  }

  /** Sends the request and handles its answers; true when it was answered (stored, or refused as late). */
  private async run(
    delivery: Delivery,
    request: NonNullable<TaskRecord['inputRequests']>[string],
    log: Logger,
  ): Promise<boolean> {
    const { record, n, relatedRequestId, mode } = delivery;
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
      if (delivery.aborted) return false;
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
        return false;
      } finally {
        delivery.inflight = undefined;
      }
      if (delivery.aborted) return false;
      delivery.answering = true;
      const outcome = await this.options.answer(record, n, raw).catch((error: unknown) => {
        log.warn({ err: error }, 'could not store the answer; asking again');
        return 'invalid' as const;
      });
      delivery.answering = false;
      // Answered (or refused as late): the question is settled in this session.
      if (outcome !== 'invalid') return true;
      bad += 1;
    }
    log.warn({ badAnswers: MAX_BAD_ANSWERS }, 'too many bad answers on this stream; not asking here again');
    return false;
  }

  /**
   * A stream stops wanting the task's question `n` (any, when undefined): its standby goes, and a delivery in flight
   * on it is withdrawn (`notifications/cancelled`). `leaving`: the stream goes away while the question may still be
   * pending (a `tasks/result` that ended), so it moves to a standby; otherwise the question is moot (answered, moved
   * on, ended) and every stream is told so by the router.
   */
  private withdraw(taskId: string, n: string | undefined, streamKey: string, leaving: boolean): void {
    const moot: string[] = [];
    for (const [key, waiting] of this.standbys) {
      if (!key.startsWith(`${taskId}\u0000`) || (n !== undefined && key !== questionKey(taskId, n))) continue;
      waiting.delete(streamKey);
      if (waiting.size === 0) this.standbys.delete(key);
      if (!leaving) moot.push(key);
    }
    for (const [key, delivery] of [...this.deliveries]) {
      if (delivery.taskId !== taskId || (n !== undefined && delivery.n !== n)) continue;
      if (delivery.streamKey !== streamKey) continue;
      if (!leaving) moot.push(key);
      if (leaving && delivery.answering) {
        // The answer decides: stored settles the question; refused moves it to a standby then (`ended`).
        delivery.aborted = true;
        delivery.moveOnEnd = true;
        continue;
      }
      abortDelivery(delivery, 'no longer pending');
      this.deliveries.delete(key);
      if (leaving) this.moveToStandby(key, this.options.log.child({ taskId, inputRequest: delivery.n }));
    }
    // The task moved on from these questions: a read of the task that started before it did (a `tasks/result` that
    // opened meanwhile) must not ask them again on another stream.
    for (const key of moot) this.settle(key);
  }
}

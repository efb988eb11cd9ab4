/**
 * The gateway's single subscriber (PROTOCOL.md §6, §10.9), on this gateway's own channel: forwards each task's
 * progress to the one session that asked for it, on that request's own token, until the task is terminal; wakes
 * anyone waiting for a task to end; and acknowledges cancels answered by other gateways once nothing more can be
 * forwarded.
 */
import {
  Coalescer,
  GatewayEventSchema,
  isRedisUnavailableError,
  isTerminal,
  MIN_SUGGESTED_POLL_MS,
  messageEvent,
  parseMessage,
  type Keys,
  type Logger,
  type ProgressEvent,
  type ProgressToken,
  type TaskStore,
  type AckEvent,
  type LogEvent,
  type LogLevel,
  type StatusEvent,
  type TaskMode,
  type TaskRecord,
  type TaskStatus,
  terminalRecord,
  type RedisClient,
} from '@taskrelay/shared';
import type { ChannelBacklog } from './channel-backlog.js';
import type { GatewayChannels } from './gateway-channels.js';
import { taskNotFound } from './errors.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';

export interface ProgressParams {
  progressToken: ProgressToken;
  progress: number;
  total?: number;
  message?: string;
  _meta?: Record<string, unknown>;
}

/** A tool's log message as the caller gets it (notifications/message params). */
export interface LogParams {
  level: LogLevel;
  data: unknown;
  logger?: string;
  _meta?: Record<string, unknown>;
}

/**
 * One stream of the caller's session (its GET stream, or a request's response stream) that a task's input requests
 * and log messages can go out on (PROTOCOL.md §12, §15). Each method sends in the background and never throws.
 */
export interface CallerSink {
  /** Sends the task's pending input request on this stream, once per request, and handles the answer. */
  deliverInput(record: TaskRecord): void;
  /** Stops waiting on this stream for an answer to the task's request `n` (any, when undefined): it is moot. */
  withdrawInput(taskId: string, n?: string): void;
  /**
   * This stream stops waiting for the task (its `tasks/result` ended) while its requests may still be pending: one
   * in flight here moves to another stream of the session that wants it (PROTOCOL.md §19). Default: `withdrawInput`.
   */
  leave?(taskId: string): void;
  /** Sends a tool's log message, when the session's level lets it through. */
  sendLog(taskId: string, params: LogParams): void;
}

/** An open `tasks/result` request: the spec's side channel for a task's input requests. */
export interface ResultStream {
  sessionId: string | undefined;
  sink: CallerSink;
}

export interface RouteInput {
  record: TaskRecord;
  /** The caller's stream for input requests and logs: the GET stream (tasks) or the `tools/call` stream (calls). */
  sink?: CallerSink;
  /**
   * Sends one notifications/progress to the caller; absent when the request carried no progress token. A task's
   * sender adds the related-task `_meta` (the wire's business, not the router's).
   */
  sendProgress?: (params: ProgressParams, taskId: string) => Promise<void>;
  /** Sends the task's new status (notifications/tasks/status, task mode only), rendered by the caller's transport. */
  sendStatus?: (record: TaskRecord) => Promise<void>;
}

interface Route {
  record: TaskRecord;
  mode: TaskMode;
  sink: CallerSink | undefined;
  coalescer: Coalescer<ProgressEvent> | undefined;
  sendStatus: ((record: TaskRecord) => Promise<void>) | undefined;
}

export interface TaskRouterOptions {
  gatewayId: string;
  progressIntervalMs: number;
  /** Safety net when a status event is missed: waiters re-read the hash this often. Default 2000 ms. */
  fallbackPollMs?: number;
  /** Told of each tool message read, and of a new subscriber (PROTOCOL.md §22.4). None: nothing is bounded. */
  backlog?: Pick<ChannelBacklog, 'counted' | 'resubscribed' | 'close'>;
  /**
   * The sharded layout's channels (PROTOCOL.md §1.2): this gateway's events channel on every shard, subscribed with
   * `SSUBSCRIBE`. None: the single layout's one channel, subscribed here.
   */
  channels?: Pick<GatewayChannels, 'start' | 'isEvents' | 'ensureTask' | 'close'>;
}

export interface WaitOptions {
  signal?: AbortSignal | undefined;
  /** Whether the caller may see this task; a refused or missing one is "not found". Default: any. */
  authorize?: (record: TaskRecord) => boolean;
  /**
   * The waiting `tasks/result` stream: once the task is known to be the caller's, its input requests go out on it
   * (the pending one at once) until the wait ends (PROTOCOL.md §12.9).
   */
  stream?: ResultStream | undefined;
}

/** Publishes on Redis (the gateway's command connection): for acks to other gateways. */
export type Publish = (channel: string, message: string) => Promise<unknown>;

/** How long, at most, a task that ended is answered from memory (§6.7), how many are kept, and the margin kept
 * before its hash's expiry. */
const ENDED_KEEP_MS = 5_000;
const ENDED_MAX = 10_000;
const ENDED_MARGIN_MS = 250;

export class TaskRouter {
  private readonly routes = new Map<string, Route>();
  /** Waiters of `waitForTerminal`, woken by any status event of their task (with it, when it tells the outcome). */
  private readonly waiters = new Map<string, Set<(told?: TaskRecord) => void>>();
  private readonly acks = new Map<string, () => void>();
  /**
   * Tasks routed here that ended in the last few seconds, as their final event told them (§6.7), oldest first: a
   * `tasks/result` for one is answered from here, with no read. Terminal records never change; an entry goes before
   * its task's hash expires.
   */
  private readonly ended = new Map<string, { record: TaskRecord; until: number }>();
  private readonly resultStreams = new Map<string, Set<ResultStream>>();
  /** `subscriptions/listen` streams following a task (PROTOCOL.md §18.1): woken by each of its status events. */
  private readonly followers = new Map<string, Set<() => void>>();
  private readonly fallbackPollMs: number;
  private connectedOnce = false;

  constructor(
    private readonly subscriber: RedisClient,
    private readonly publish: Publish,
    private readonly store: TaskStore,
    private readonly keys: Keys,
    private readonly log: Logger,
    private readonly metrics: GatewayMetrics,
    private readonly options: TaskRouterOptions,
  ) {
    this.fallbackPollMs = options.fallbackPollMs ?? 2000;
  }

  async start(): Promise<void> {
    this.subscriber.on(messageEvent(this.keys), (channel: string, raw: string) => this.onMessage(channel, raw));
    this.subscriber.on('ready', () => {
      // ioredis resubscribes by itself; anything published while we were away is read back from the hashes.
      if (this.connectedOnce) this.resubscribed();
      this.connectedOnce = true;
    });
    const channels = this.options.channels;
    if (channels === undefined) {
      await this.subscriber.subscribe(this.keys.gatewayChannel(this.options.gatewayId));
    } else {
      // A Cluster's sharded subscribers reconnect apart from the cluster itself, each to its master: ioredis
      // re-subscribes them and then says `subscribersReady`. It says so at the start too, before or after our first
      // subscriptions (a race), and after a topology change that cut nothing: every one after the start counts, as
      // re-reading the routes is harmless (and a reset backlog count only lets one budget more through, §22.4).
      let started = false;
      this.subscriber.on('subscribersReady', () => {
        if (started) this.resubscribed();
      });
      await channels.start();
      started = true;
    }
    this.connectedOnce = true;
  }

  private resubscribed(): void {
    this.options.backlog?.resubscribed();
    void this.reconcile();
  }

  /** Starts forwarding a task's progress and status; call before its job exists so no early update is lost. */
  register(input: RouteInput): void {
    const { record } = input;
    const coalescer = this.progressCoalescer(record.taskId, record.progressToken, input.sendProgress);
    this.routes.set(record.taskId, {
      record,
      mode: record.mode,
      sink: input.sink,
      coalescer,
      sendStatus: input.sendStatus,
    });
    this.metrics.routes.set(this.routes.size);
  }

  /**
   * A plain call's retried input round (PROTOCOL.md §17.3), once this gateway owns the call (`routeCall`): its
   * progress from now on goes to `sendProgress` on the retry's `token` (none: nowhere), replacing the earlier round's
   * route here, or making one when the call was routed by another gateway.
   */
  reroute(record: TaskRecord, token: ProgressToken | undefined, sendProgress?: RouteInput['sendProgress']): void {
    const coalescer = this.progressCoalescer(record.taskId, token, sendProgress);
    const route = this.routes.get(record.taskId);
    if (route) {
      route.coalescer?.cancel();
      route.coalescer = coalescer;
      return;
    }
    // What the route knows of the call is only what a status event keeps current: no questions (a wait reads them).
    const routed: TaskRecord = { ...record, status: 'working', gatewayId: this.options.gatewayId };
    delete routed.pendingInputs;
    delete routed.inputRequests;
    if (token === undefined) delete routed.progressToken;
    else routed.progressToken = token;
    this.routes.set(record.taskId, {
      record: routed,
      mode: record.mode,
      sink: undefined,
      coalescer,
      sendStatus: undefined,
    });
    this.metrics.routes.set(this.routes.size);
  }

  private progressCoalescer(
    taskId: string,
    token: ProgressToken | undefined,
    sendProgress: RouteInput['sendProgress'],
  ): Coalescer<ProgressEvent> | undefined {
    if (!sendProgress || token === undefined) return undefined;
    return new Coalescer<ProgressEvent>({
      minIntervalMs: this.options.progressIntervalMs,
      onCoalesced: () => this.metrics.progressCoalesced.inc(),
      send: (event) => {
        const params: ProgressParams = { progressToken: token, progress: event.progress };
        if (event.total !== undefined) params.total = event.total;
        if (event.message !== undefined) params.message = event.message;
        this.metrics.progressForwarded.inc();
        sendProgress(params, taskId).catch((error: unknown) =>
          this.log.debug({ taskId, err: error }, 'progress notification not delivered'),
        );
      },
    });
  }

  /**
   * Stops forwarding for a task. `flush` sends a coalesced value that is still pending (it was published before the
   * task ended); otherwise it is dropped. `endedAs`: the task reached this terminal status; whoever retires the route
   * first (the status event or the local cancel, which race) counts it, once.
   */
  retire(taskId: string, options: { flush: boolean; endedAs?: TaskStatus }): void {
    const route = this.routes.get(taskId);
    if (!route) return;
    this.routes.delete(taskId);
    this.metrics.routes.set(this.routes.size);
    if (options.endedAs) this.metrics.taskEnded(route.record.tool, options.endedAs, route.record.createdAt);
    if (options.flush) route.coalescer?.flush();
    else route.coalescer?.cancel();
    route.sink?.withdrawInput(taskId);
  }

  /** A session went away: its tasks go on, but nothing can be forwarded to it any more. */
  retireSession(sessionId: string): void {
    for (const [taskId, route] of this.routes) {
      if (route.record.sessionId === sessionId) this.retire(taskId, { flush: false });
    }
  }

  /**
   * Resolves with the task once it is terminal. Rejects with "not found" when it is missing, expired or refused by
   * `authorize`, and with the signal's reason when it aborts. One abort listener for the whole wait.
   */
  async waitForTerminal(taskId: string, options: WaitOptions = {}): Promise<TaskRecord> {
    const { signal, authorize } = options;
    signal?.throwIfAborted();
    // A record known without a read answers only when the caller may see it. One it may not is read again: the copy
    // may be out of date there (a call that became a task after its route was made, §17.4).
    const mine = (record: TaskRecord | undefined): record is TaskRecord =>
      record !== undefined && (!authorize || authorize(record));
    const known = this.recentlyEnded(taskId);
    if (mine(known)) return known;
    let wake: (told?: TaskRecord) => void = () => undefined;
    const set = this.waiters.get(taskId) ?? new Set();
    this.waiters.set(taskId, set);
    const waker = (told?: TaskRecord) => wake(told);
    set.add(waker);
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<never>((_resolve, reject) => {
      onAbort = () => reject(signal?.reason instanceof Error ? signal.reason : new Error('aborted'));
      signal?.addEventListener('abort', onAbort, { once: true });
    });
    aborted.catch(() => undefined);
    let timer: NodeJS.Timeout | undefined;
    // A task this gateway routes is not terminal yet (its route goes at the terminal event): the first read can wait
    // for that event, saving a round trip on the common path (tools/call then tasks/result on the same gateway).
    const routed = this.routes.get(taskId)?.record;
    let read = routed === undefined || (authorize !== undefined && !authorize(routed));
    let first = true;
    let streamOpen = false;
    const openStream = (record: TaskRecord) => {
      if (!options.stream || streamOpen) return;
      streamOpen = true;
      const streams = this.resultStreams.get(taskId) ?? new Set();
      this.resultStreams.set(taskId, streams);
      streams.add(options.stream);
      // A client that asks for the result while the task waits gets the pending request on this stream, unless its
      // session has it in flight on another open stream (then this one stands by, PROTOCOL.md §19).
      if (record.status === 'input_required') this.deliverInput(taskId, [options.stream.sink], record);
    };
    if (!read && routed) openStream(routed);
    try {
      for (;;) {
        // Armed before the read, so a status event arriving during it is not missed.
        const woken = new Promise<TaskRecord | undefined>((resolve) => (wake = resolve));
        if (read) {
          let record: TaskRecord | undefined | null = null;
          try {
            record = await Promise.race([this.watch(taskId), aborted]);
          } catch (error) {
            // Only the first read answers "unavailable": a wait already under way rides out an outage (the task
            // may well finish meanwhile), and the next poll or the subscriber's reconnect picks it up again.
            if (first || signal?.aborted || !isRedisUnavailableError(error)) throw error;
            this.log.debug({ taskId, err: error }, 'task read failed during a wait; waiting on');
          }
          if (record !== null) {
            if (!record || (authorize && !authorize(record))) throw taskNotFound(taskId);
            if (isTerminal(record.status)) {
              // Its terminal event was lost (the subscriber was cut off meanwhile): the read ends the route instead.
              this.retire(taskId, { flush: false, endedAs: record.status });
              return record;
            }
            openStream(record);
          }
        }
        first = false;
        read = true;
        const told = await Promise.race([
          woken,
          new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), this.fallbackPollMs))),
          aborted,
        ]);
        clearTimeout(timer);
        // The terminal event told the outcome of a task routed here: no read (§6.7).
        if (mine(told)) return told;
      }
    } finally {
      clearTimeout(timer);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
      if (streamOpen && options.stream) {
        const { sink } = options.stream;
        if (sink.leave) sink.leave(taskId);
        else sink.withdrawInput(taskId);
        const streams = this.resultStreams.get(taskId);
        streams?.delete(options.stream);
        if (streams?.size === 0) this.resultStreams.delete(taskId);
      }
      set.delete(waker);
      if (set.size === 0 && this.waiters.get(taskId) === set) this.waiters.delete(taskId);
    }
  }

  /**
   * Arms a wait for the owning gateway's ack of a cancel this gateway answers (PROTOCOL.md §10.9). Arm it before
   * the transition, then `wait()`; `cancel()` when no ack will come.
   */
  expectAck(taskId: string, timeoutMs: number): { wait(): Promise<boolean>; cancel(): void } {
    let resolve!: (acked: boolean) => void;
    const acked = new Promise<boolean>((r) => (resolve = r));
    const done = () => resolve(true);
    this.acks.set(taskId, done);
    const clear = () => {
      if (this.acks.get(taskId) === done) this.acks.delete(taskId);
    };
    return {
      wait: async () => {
        const timer = setTimeout(() => resolve(false), timeoutMs);
        try {
          return await acked;
        } finally {
          clearTimeout(timer);
          clear();
        }
      },
      cancel: () => {
        clear();
        resolve(false);
      },
    };
  }

  /**
   * Wakes `onChange` on every status event of the task that reaches this gateway, and once the subscriber reconnects
   * (anything may have changed meanwhile); returns the stop. Follow first, then `watch`: an event between the two
   * is not lost. Events come for tasks this gateway owns, and for others once `watch` registered it (PROTOCOL.md §18.1).
   */
  follow(taskId: string, onChange: () => void): () => void {
    const set = this.followers.get(taskId) ?? new Set();
    this.followers.set(taskId, set);
    set.add(onChange);
    return () => {
      set.delete(onChange);
      if (set.size === 0 && this.followers.get(taskId) === set) this.followers.delete(taskId);
    };
  }

  /**
   * A poll of a young task (PROTOCOL.md §28.1): when the task is routed here, still `working`, and younger than the
   * shortest suggested poll interval, resolves at its next status event or once it is that old, whichever is first;
   * at once for any other task. The poll then answers what it finds, so a task that ends in its first
   * `MIN_SUGGESTED_POLL_MS` is seen at its end, not one interval later. `visible`: whether the caller may see the
   * task (no other caller's poll waits on it).
   */
  async settle(taskId: string, visible: (record: TaskRecord) => boolean): Promise<void> {
    const route = this.routes.get(taskId);
    if (!route || route.record.status !== 'working' || !visible(route.record)) return;
    const age = Date.now() - Date.parse(route.record.createdAt);
    const waitMs = Math.min(MIN_SUGGESTED_POLL_MS, MIN_SUGGESTED_POLL_MS - age);
    if (!(waitMs > 0)) return; // old enough, or no usable creation time
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        stop();
        resolve();
      };
      const timer = setTimeout(done, waitMs);
      const stop = this.follow(taskId, done);
    });
  }

  /** Reads a task and, while it is not terminal, has its status events sent to this gateway too (§10.9). */
  async watch(taskId: string): Promise<TaskRecord | undefined> {
    // Its status events come on the channel of its shard (§1.2): subscribed before this gateway is named a watcher.
    await this.options.channels?.ensureTask(taskId);
    return this.store.records.watch(taskId, this.options.gatewayId);
  }

  get activeRoutes(): number {
    return this.routes.size;
  }

  /** A task routed here that ended a moment ago, as its final event told it; undefined when not known here. */
  recentlyEnded(taskId: string): TaskRecord | undefined {
    const entry = this.ended.get(taskId);
    if (!entry) return undefined;
    if (entry.until > Date.now()) return entry.record;
    this.ended.delete(taskId);
    return undefined;
  }

  /**
   * The ended task changed after all (a replay linked it, §30.3): it is read again from Redis here. Another gateway
   * holding it still answers from its copy, for at most `ENDED_KEEP_MS`.
   */
  forget(taskId: string): void {
    this.ended.delete(taskId);
  }

  private remember(record: TaskRecord): void {
    const now = Date.now();
    // Gone well before the hash expires (its ttl runs from the end), however long the task is kept.
    const expiresAt = (Date.parse(record.lastUpdatedAt) || now) + record.ttl - ENDED_MARGIN_MS;
    const until = Math.min(now + ENDED_KEEP_MS, expiresAt);
    if (until <= now) return;
    this.ended.set(record.taskId, { record, until });
    // Oldest first: drop the expired, and the oldest beyond the cap.
    for (const [taskId, entry] of this.ended) {
      if (entry.until > now && this.ended.size <= ENDED_MAX) break;
      this.ended.delete(taskId);
    }
  }

  close(): void {
    this.ended.clear();
    for (const taskId of [...this.routes.keys()]) this.retire(taskId, { flush: false });
    this.options.backlog?.close();
    this.options.channels?.close();
    this.subscriber.disconnect();
  }

  private onMessage(channel: string, raw: string): void {
    const mine = this.options.channels
      ? this.options.channels.isEvents(channel)
      : channel === this.keys.gatewayChannel(this.options.gatewayId);
    if (!mine) return;
    const event = parseMessage(GatewayEventSchema, raw);
    if (!event) {
      this.log.debug({ raw: raw.slice(0, 200) }, 'malformed gateway event dropped');
      return;
    }
    if (event.type === 'status') {
      this.onStatus(event);
      return;
    }
    if (event.type === 'ack') {
      this.onAck(event);
      return;
    }
    // A tool message: taken off the backlog the scripts counted it in (§22.4), whatever becomes of it here.
    this.options.backlog?.counted(channel, raw);
    if (event.type === 'log') {
      this.onLog(event);
      return;
    }
    const route = this.routes.get(event.taskId);
    if (!route?.coalescer) {
      this.metrics.progressDropped.inc();
      return;
    }
    route.coalescer.push(event);
  }

  private onAck(event: AckEvent): void {
    this.acks.get(event.taskId)?.();
  }

  /** A tool's log message: to the caller only, on its open `tasks/result` stream if any, else its route's stream. */
  private onLog(event: LogEvent): void {
    const route = this.routes.get(event.taskId);
    if (!route?.sink) return;
    let sink = route.sink;
    for (const stream of this.resultStreams.get(event.taskId) ?? []) {
      if (stream.sessionId === route.record.sessionId) sink = stream.sink;
    }
    const params: LogParams = { level: event.level, data: event.data };
    if (event.logger !== undefined) params.logger = event.logger;
    sink.sendLog(event.taskId, params);
  }

  /**
   * Sends the task's pending input request: on the given sinks, or on every open `tasks/result` stream for it, or,
   * with none open, on the route's own stream (PROTOCOL.md §12.9). Reads the request from the hash when `known` lacks it.
   */
  private deliverInput(taskId: string, sinks?: CallerSink[], known?: TaskRecord): void {
    const send = (record: TaskRecord) => {
      if (record.status !== 'input_required') return;
      const targets = sinks ?? [...(this.resultStreams.get(taskId) ?? [])].map((s) => s.sink);
      if (targets.length === 0) {
        const route = this.routes.get(taskId);
        if (route?.sink) targets.push(route.sink);
      }
      for (const sink of targets) sink.deliverInput(record);
    };
    const pending = known?.pendingInputs ?? [];
    if (known && pending.length > 0 && pending.every((n) => known.inputRequests?.[n] !== undefined)) {
      send(known);
      return;
    }
    this.store.records.get(taskId).then(
      (record) => {
        if (record) send(record);
      },
      (error: unknown) => this.log.warn({ taskId, err: error }, 'could not read the pending input request'),
    );
  }

  /** The task moved on (answered, or ended): nothing is waited for on any of its streams here any more. */
  private withdrawInput(taskId: string, route: Route | undefined): void {
    route?.sink?.withdrawInput(taskId);
    for (const stream of this.resultStreams.get(taskId) ?? []) stream.sink.withdrawInput(taskId);
  }

  private onStatus(event: StatusEvent): void {
    const route = this.routes.get(event.taskId);
    if (event.status === 'input_required' && event.inputRequestId !== undefined) {
      if (route || this.resultStreams.has(event.taskId)) this.deliverInput(event.taskId);
    } else {
      this.withdrawInput(event.taskId, route);
    }
    if (route) {
      const terminal = isTerminal(event.status);
      if (terminal) {
        // Every progress event of this task was published before this status event, so a pending one still goes
        // out — before the status notification, and before any waiter answers. Not after a cancel: the client may
        // already have been told the task is cancelled.
        this.retire(event.taskId, { flush: event.status !== 'cancelled', endedAs: event.status });
      }
      // Kept current, so a wait that starts after this event (an MRTR round, §17.1) sees the task is asking.
      const record: TaskRecord | undefined =
        !terminal || route.sendStatus
          ? { ...route.record, status: event.status, lastUpdatedAt: event.lastUpdatedAt }
          : undefined;
      if (record && event.statusMessage !== undefined) record.statusMessage = event.statusMessage;
      if (record && !terminal) route.record = record;
      if (record && route.sendStatus) {
        route
          .sendStatus(record)
          .catch((error: unknown) =>
            this.log.debug({ taskId: event.taskId, err: error }, 'status notification not delivered'),
          );
      }
    }
    if (event.ackTo !== undefined && event.ackTo !== this.options.gatewayId) {
      // The route is retired (or never was here): nothing more goes out for this task from this gateway.
      const ack: AckEvent = { type: 'ack', taskId: event.taskId };
      // On the home channel of the gateway that asked (§1.2): an ack names no shard.
      this.publish(this.keys.gatewayChannel(event.ackTo), JSON.stringify(ack)).catch((error: unknown) =>
        this.log.debug({ taskId: event.taskId, err: error }, 'cancel ack not published'),
      );
    }
    // A terminal event that carries the outcome, for a task routed here, answers the waiters as it is.
    const carries = event.final === true || event.finalJson === true;
    const told = route && carries && isTerminal(event.status) ? terminalRecord(route.record, event) : undefined;
    if (told) this.remember(told);
    for (const wake of this.waiters.get(event.taskId) ?? []) wake(told);
    for (const onChange of this.followers.get(event.taskId) ?? []) onChange();
  }

  private async reconcile(): Promise<void> {
    for (const set of this.followers.values()) for (const onChange of set) onChange();
    const taskIds = [...new Set([...this.routes.keys(), ...this.waiters.keys()])];
    try {
      const statuses = await this.store.records.statuses(taskIds);
      statuses.forEach((status, i) => {
        const taskId = taskIds[i];
        if (taskId === undefined) return;
        // A task that ended while the subscriber was away is counted as ended here, once (its event was lost).
        if (status === undefined) this.retire(taskId, { flush: false });
        else if (isTerminal(status)) this.retire(taskId, { flush: false, endedAs: status });
        // A request asked while the subscriber was away goes out now (a stream that already has it is skipped).
        if (status === 'input_required') this.deliverInput(taskId);
        for (const wake of this.waiters.get(taskId) ?? []) wake();
      });
      this.log.info({ tasks: taskIds.length }, 'subscriber reconnected; task routes reconciled');
    } catch (error) {
      this.log.warn({ err: error }, 'could not reconcile task routes after reconnect');
    }
  }
}

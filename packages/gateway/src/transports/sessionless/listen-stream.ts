/**
 * `subscriptions/listen` on the 2026-07-28 endpoint as a push (PROTOCOL.md §18): each followed task's status events
 * reach this gateway through the task router (from whichever gateway or worker wrote them), and each one re-reads
 * the task and sends its `DetailedTask`; nothing polls. The stream's bounds (ids, streams per principal, bytes
 * waiting, the rate limit) and its endings (its result, or `notifications/cancelled` naming it, never a bare close)
 * are §18.3–18.4.
 */
import { randomUUID } from 'node:crypto';
import type { Response } from 'express';
import { z } from 'zod';
import { JSON_RPC, TaskrelayError, isTerminal, type Logger, type TaskRecord } from '@taskrelay/shared';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { WireError } from '../../wire/errors.js';
import { MAX_RESOURCE_SUBSCRIPTIONS } from '../../protocol/resources.js';
import { SseWriter, type SseWriterOptions } from '../../http/sse-writer.js';
import type { InflightCalls } from '../../protocol/inflight-calls.js';
import type { CatalogChanges } from '../../protocol/catalog-changes.js';
import type { TaskService } from '../../tasks/task-service.js';
import { requireTasksExtension, type ExtDetailedTask } from '../../wire/task-wire-ext.js';

/** Most task ids one stream follows (§18.3). */
export const MAX_LISTEN_TASKS = 100;
/** Most open listen streams of one principal on one gateway (§18.3). */
export const MAX_LISTEN_STREAMS = 32;
/** Most bytes of unsent frames one listen stream holds (§18.3). */
export const LISTEN_BUFFER_BYTES = 256 * 1024;

const SUBSCRIPTION_ID_META_KEY = 'io.modelcontextprotocol/subscriptionId';
/** §18.3: a JSON-RPC error, not an HTTP 429: the principal holds these streams itself and can close one. */

/** What a `subscriptions/listen` asks to be told; other notification kinds (prompts, resource lists) are ignored. */
const ListenFilterSchema = z.looseObject({
  taskIds: z.array(z.string()).max(MAX_LISTEN_TASKS).optional(),
  toolsListChanged: z.boolean().optional(),
  resourceSubscriptions: z.array(z.string()).max(MAX_RESOURCE_SUBSCRIPTIONS).optional(),
});

export interface ListenRequest {
  id: string | number;
  params: Record<string, unknown> & { _meta?: Record<string, unknown> };
  principal: string;
  res: Response;
}

export interface ListenStreamsOptions {
  service: TaskService;
  inflight: InflightCalls;
  catalogChanges: CatalogChanges;
  log: Logger;
  /** A task as its `notifications/tasks` carries it: the extension's rendering, its result capped (`McpMethods`). */
  render: (record: TaskRecord) => ExtDetailedTask;
  /** The transport's outgoing filter, applied to every message of the stream (PROTOCOL.md §16: one filtered send). */
  outgoing?: (message: object) => object;
  /** Counters of every SSE response (§22.1); the bound of a listen stream is its own. */
  streams?: SseWriterOptions;
  /** Told when a stream opens and closes (the memory budget, §22.2). */
  listens?: { opened: () => void; closed: () => void };
  /** Default {@link MAX_LISTEN_STREAMS}. */
  maxStreamsPerPrincipal?: number;
  /** Default {@link LISTEN_BUFFER_BYTES}. */
  maxBufferedBytes?: number;
  /** Follows a task resource for a principal (PROTOCOL.md §34.5): the stop; rejects (not found) when it may not. */
  subscribeResource?: (principal: string, uri: string, onUpdated: (uri: string) => void) => Promise<() => void>;
}

/** One followed task: its stop, and its reads kept in order (a newer read never loses to an older one). */
interface Followed {
  stop: () => void;
  reading: boolean;
  again: boolean;
  done: boolean;
  sent: string | undefined;
}

export function createListenStreams(options: ListenStreamsOptions) {
  const outgoing = options.outgoing ?? ((message: object) => message);
  const eventText = (message: object) => sseEvent(outgoing(message));
  const maxStreams = options.maxStreamsPerPrincipal ?? MAX_LISTEN_STREAMS;
  const openPerPrincipal = new Map<string, number>();

  /**
   * Serves one `subscriptions/listen {notifications: {taskIds?, toolsListChanged?}}`. Resolves once the stream has
   * ended (its result sent, the client gone, or ended by the server with `notifications/cancelled`).
   */
  return async function listen(rpc: ListenRequest): Promise<void> {
    const parsed = ListenFilterSchema.safeParse(rpc.params['notifications'] ?? {});
    if (!parsed.success) {
      throw new WireError(
        JSON_RPC.INVALID_PARAMS,
        `notifications must be {taskIds?: at most ${MAX_LISTEN_TASKS} task ids, toolsListChanged?: boolean, resourceSubscriptions?: at most ${MAX_RESOURCE_SUBSCRIPTIONS} URIs}`,
      );
    }
    const { taskIds, toolsListChanged, resourceSubscriptions } = parsed.data;
    if (taskIds === undefined && toolsListChanged !== true && resourceSubscriptions === undefined) {
      throw new WireError(
        JSON_RPC.INVALID_PARAMS,
        'subscriptions/listen: nothing to notify; this server notifies task status (notifications.taskIds), toolsListChanged and task output (notifications.resourceSubscriptions)',
      );
    }
    if (taskIds !== undefined) requireTasksExtension(rpc.params._meta, 'subscriptions/listen');
    const held = openPerPrincipal.get(rpc.principal) ?? 0;
    if (held >= maxStreams) {
      throw new WireError(
        JSON_RPC.SERVER_ERROR,
        `Too many listen streams: at most ${maxStreams} open subscriptions/listen streams per principal on this gateway; close one first`,
      );
    }
    // Counted before the first await, so concurrent openings cannot all pass the check.
    openPerPrincipal.set(rpc.principal, held + 1);
    const release = () => {
      const left = (openPerPrincipal.get(rpc.principal) ?? 1) - 1;
      if (left <= 0) openPerPrincipal.delete(rpc.principal);
      else openPerPrincipal.set(rpc.principal, left);
    };
    await new ListenStream(rpc, options, eventText, release).serve(
      taskIds,
      toolsListChanged === true,
      resourceSubscriptions,
    );
  };
}

/** One open `subscriptions/listen` stream: the tasks it follows, its writer, and how it ends. */
class ListenStream {
  private readonly followed = new Map<string, Followed>();
  private readonly meta: Record<string, unknown>;
  private readonly writer: SseWriter;
  /** False until the acknowledgement and the first frames are out: changes meanwhile only mark their entry. */
  private streaming = false;
  private ended = false;
  private finish!: () => void;
  private readonly finished = new Promise<void>((resolve) => (this.finish = resolve));
  private stopTools: (() => void) | undefined;
  /** The task resources followed (§34.5), by URI; such a stream stays open until the client closes it. */
  private readonly resources = new Map<string, () => void>();
  private call: { done: () => void } | undefined;

  constructor(
    private readonly rpc: ListenRequest,
    private readonly o: ListenStreamsOptions,
    private readonly eventText: (message: object) => string,
    /** Gives the principal's stream back; called once. */
    private readonly release: () => void,
  ) {
    this.meta = { [SUBSCRIPTION_ID_META_KEY]: rpc.id };
    this.writer = new SseWriter(rpc.res, {
      ...o.streams,
      principal: rpc.principal,
      maxBufferedBytes: o.maxBufferedBytes ?? LISTEN_BUFFER_BYTES,
      boundPending: true,
      // A client that stopped reading gets 30 s to read its last words; what waits meanwhile is bounded.
      lastWordsMs: 30_000,
      lastWords: () =>
        this.cancelled(`The client fell behind this listen stream by more than its buffer holds; listen again`),
    });
  }

  async serve(
    taskIds: readonly string[] | undefined,
    toolsListChanged: boolean,
    resourceUris: readonly string[] | undefined,
  ): Promise<void> {
    this.rpc.res.once('close', this.cleanUp);
    try {
      const initial = await this.followAll(taskIds ?? []);
      await this.followResources(resourceUris ?? []);
      if (this.ended) return;
      this.begin(initial, taskIds !== undefined, toolsListChanged, resourceUris !== undefined);
      await this.finished;
    } finally {
      this.cleanUp();
    }
  }

  private readonly cleanUp = (): void => {
    if (this.ended) return;
    this.ended = true;
    for (const entry of this.followed.values()) entry.stop();
    for (const stop of this.resources.values()) stop();
    this.stopTools?.();
    this.call?.done();
    this.release();
    this.finish();
  };

  private cancelled(reason: string): string {
    return this.eventText({
      jsonrpc: '2.0',
      method: 'notifications/cancelled',
      params: { requestId: this.rpc.id, reason },
    });
  }

  /** Follows each task: another principal's or an unknown task is left out of the acknowledgement, alike. */
  private async followAll(taskIds: readonly string[]): Promise<TaskRecord[]> {
    const initial: TaskRecord[] = [];
    for (const taskId of new Set(taskIds)) {
      if (this.ended || this.followed.has(taskId)) continue;
      const entry: Followed = { stop: () => undefined, reading: false, again: false, done: false, sent: undefined };
      // In the map before the follow starts: a status event that comes while the first read is under way (a task
      // that ends at once) marks the entry, and is read once the stream has begun, instead of being lost.
      this.followed.set(taskId, entry);
      const found = await this.o.service
        .follow(taskId, this.rpc.principal, () => this.changed(taskId))
        .catch((error: unknown) => {
          this.followed.delete(taskId);
          throw error;
        });
      if (!found) {
        this.followed.delete(taskId);
        continue;
      }
      entry.stop = found.stop;
      // The client left while the task was being read: its clean-up has run already.
      if (this.ended) found.stop();
      initial.push(found.record);
    }
    return initial;
  }

  /**
   * Follows each task resource the caller may read (§34.5); one it may not (unknown, gone, another principal's) is
   * left out of the acknowledgement, alike. Updates before the stream began are dropped: the client reads after the
   * acknowledgement anyway.
   */
  private async followResources(uris: readonly string[]): Promise<void> {
    const subscribe = this.o.subscribeResource;
    if (!subscribe) return;
    for (const uri of new Set(uris)) {
      if (this.ended) return;
      const stop = await subscribe(this.rpc.principal, uri, (updated) => this.resourceUpdated(updated)).catch(
        (error: unknown) => {
          if (error instanceof McpError && error.code === JSON_RPC.INVALID_PARAMS) return undefined;
          throw error;
        },
      );
      if (stop === undefined) continue;
      if (this.ended) stop();
      else this.resources.set(uri, stop);
    }
  }

  private resourceUpdated(uri: string): void {
    if (!this.streaming || this.ended) return;
    this.writer.writeLatest(
      `\u0000resource:${uri}`,
      this.eventText({ jsonrpc: '2.0', method: 'notifications/resources/updated', params: { uri, _meta: this.meta } }),
    );
  }

  /** Headers, the acknowledgement and the first frames; then what changed meanwhile, and the drain's hook. */
  private begin(initial: TaskRecord[], tasksAsked: boolean, toolsListChanged: boolean, resourcesAsked: boolean): void {
    const { res } = this.rpc;
    res.status(200).set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.flushHeaders();
    this.o.listens?.opened();
    res.once('close', () => this.o.listens?.closed());
    const acknowledged: Record<string, unknown> = {};
    if (tasksAsked) acknowledged['taskIds'] = [...this.followed.keys()];
    if (toolsListChanged) acknowledged['toolsListChanged'] = true;
    if (resourcesAsked) acknowledged['resourceSubscriptions'] = [...this.resources.keys()];
    this.writer.write(
      this.eventText({
        jsonrpc: '2.0',
        method: 'notifications/subscriptions/acknowledged',
        params: { notifications: acknowledged, _meta: this.meta },
      }),
    );
    if (toolsListChanged) {
      this.stopTools = this.o.catalogChanges.subscribe(() =>
        this.writer.writeLatest(
          '\u0000tools',
          this.eventText({ jsonrpc: '2.0', method: 'notifications/tools/list_changed', params: { _meta: this.meta } }),
        ),
      );
    }
    for (const record of initial) this.frame(record);
    // What changed while the stream was being set up is read now, after the acknowledgement and the first frames.
    this.streaming = true;
    for (const [taskId, entry] of this.followed) {
      if (entry.again) this.changed(taskId);
    }
    // A drain ends the stream as the server's (§18.4): told first, then closed.
    this.call = this.o.inflight.track(`listen:${randomUUID()}`, this.rpc.id, new AbortController().signal, {
      shutdown: () => {
        this.endByServer('Gateway is shutting down; listen again (another gateway can serve it)');
        return Promise.resolve();
      },
    });
    this.maybeComplete();
  }

  /** A status event of `taskId` reached this gateway: read it (again, once the read under way is done). */
  private changed(taskId: string): void {
    const entry = this.followed.get(taskId);
    if (!entry || entry.done || this.ended) return;
    if (entry.reading || !this.streaming) {
      entry.again = true;
      return;
    }
    entry.reading = true;
    void this.read(taskId, entry);
  }

  private async read(taskId: string, entry: Followed): Promise<void> {
    try {
      do {
        entry.again = false;
        const record = await this.o.service.get(taskId, this.rpc.principal).catch((error: unknown) => {
          // Not found: expired (nothing more will come). Anything else (Redis away): the reconnect wakes us again.
          if (error instanceof TaskrelayError && error.code === 'TASK_NOT_FOUND') return null;
          this.o.log.debug({ taskId, err: error }, 'listen: task read failed');
          return undefined;
        });
        if (this.ended) return;
        if (record === null) {
          entry.done = true;
          entry.stop();
        } else if (record !== undefined) {
          this.frame(record);
        }
      } while (entry.again && !entry.done && !this.ended);
    } finally {
      entry.reading = false;
    }
    this.maybeComplete();
  }

  /** Sends the task's state if it changed; while the client is behind, it replaces the task's unsent frame. */
  private frame(record: TaskRecord): void {
    const entry = this.followed.get(record.taskId);
    if (!entry || this.ended) return;
    const version = `${record.status}\u0000${record.lastUpdatedAt}\u0000${record.statusMessage ?? ''}`;
    if (entry.sent !== version) {
      entry.sent = version;
      const { resultType: _complete, ...task } = this.o.render(record);
      this.writer.writeLatest(
        record.taskId,
        this.eventText({ jsonrpc: '2.0', method: 'notifications/tasks', params: { ...task, _meta: this.meta } }),
      );
    }
    if (isTerminal(record.status)) {
      entry.done = true;
      entry.stop();
    }
  }

  /** Every task ended (and no tool changes were asked for): the listen's own result ends the stream. */
  private maybeComplete(): void {
    if (this.ended || this.stopTools !== undefined || this.resources.size > 0 || this.call === undefined) return;
    for (const entry of this.followed.values()) if (!entry.done || entry.reading) return;
    this.writer.end(
      this.eventText({ jsonrpc: '2.0', id: this.rpc.id, result: { resultType: 'complete', _meta: this.meta } }),
    );
    this.cleanUp();
  }

  private endByServer(reason: string): void {
    if (this.ended) return;
    this.writer.end(this.cancelled(reason));
    this.cleanUp();
  }
}

function sseEvent(message: object): string {
  return `event: message\ndata: ${JSON.stringify(message)}\n\n`;
}

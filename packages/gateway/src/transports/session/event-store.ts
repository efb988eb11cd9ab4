/**
 * The SSE event store of one session (PROTOCOL.md §9), in this process's memory. A session lives in one gateway
 * process only (another replica answers 404 for it), so a `Last-Event-ID` resume can only ever reach the process that
 * sent the events: nothing is gained by writing them to Redis. One store per session, because the SDK names every
 * session's GET stream `_GET_stream`; bounded in bytes and age, and released when the session closes.
 */
import { randomBytes } from 'node:crypto';
import type { EventId, EventStore, StreamId } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';

/** Bytes of serialised events one session keeps for replay: 1 MiB. */
export const MAX_SESSION_EVENT_BYTES = 1024 * 1024;

export interface SessionEventStoreOptions {
  /** Events older than this are dropped and never replayed (`TASKRELAY_EVENT_TTL_MS`). */
  ttlMs: number;
  /**
   * Most bytes held (each event counts its JSON and its stream id). The oldest events are evicted first to make room;
   * an event bigger than the whole cap is sent live but not kept. Default {@link MAX_SESSION_EVENT_BYTES}.
   */
  maxBytes?: number;
  /** The clock, in ms. Default `Date.now`. */
  now?: () => number;
  /** Told every change of the bytes held (positive or negative), for a process-wide gauge. Default: none. */
  onResize?: (deltaBytes: number) => void;
}

interface StoredEvent {
  seq: number;
  streamId: StreamId;
  json: string;
  bytes: number;
  storedAt: number;
}

const SEPARATOR = '|';

export class SessionEventStore implements EventStore {
  // Oldest first, `seq` strictly increasing: eviction and expiry only ever remove from the front (`head`).
  private events: Array<StoredEvent | undefined> = [];
  private head = 0;
  private heldBytes = 0;
  private lastSeq = 0;
  private released = false;
  /** Marks this store's event ids, so an id from another session (or an earlier process) is told apart. */
  private readonly epoch = randomBytes(4).toString('hex');
  private readonly ttlMs: number;
  private readonly maxBytes: number;
  private readonly now: () => number;
  private readonly onResize: (deltaBytes: number) => void;

  constructor(options: SessionEventStoreOptions) {
    this.ttlMs = options.ttlMs;
    this.maxBytes = options.maxBytes ?? MAX_SESSION_EVENT_BYTES;
    this.now = options.now ?? Date.now;
    this.onResize = options.onResize ?? (() => undefined);
  }

  /** Bytes held right now. */
  get bytes(): number {
    return this.heldBytes;
  }

  async storeEvent(streamId: StreamId, message: JSONRPCMessage): Promise<EventId> {
    return this.storeJson(streamId, JSON.stringify(message));
  }

  /** Stores an event already serialised (the transport writes the same JSON), and returns its id at once. */
  storeJson(streamId: StreamId, json: string): EventId {
    const seq = ++this.lastSeq;
    const eventId = `${streamId}${SEPARATOR}${this.epoch}.${seq}`;
    if (this.released) return eventId;
    const now = this.now();
    this.prune(now);
    const bytes = Buffer.byteLength(json) + Buffer.byteLength(streamId);
    // Too big to keep: it still goes out live with its id, and a resume after it replays what follows.
    if (bytes > this.maxBytes) return eventId;
    while (this.heldBytes + bytes > this.maxBytes && this.head < this.events.length) this.dropOldest();
    this.events.push({ seq, streamId, json, bytes, storedAt: now });
    this.heldBytes += bytes;
    this.onResize(bytes);
    return eventId;
  }

  /** The stream of an id this store issued; undefined for any other id (answered 400). */
  streamOf(eventId: EventId): StreamId | undefined {
    return this.parse(eventId)?.streamId;
  }

  /** The stream of an id this store issued; undefined for any other id (the SDK then answers 400). */
  async getStreamIdForEventId(eventId: EventId): Promise<StreamId | undefined> {
    return this.parse(eventId)?.streamId;
  }

  /**
   * Sends, in order, every event still held that the stream of `lastEventId` got after it — including events stored
   * while this replay is under way, which the SDK would otherwise neither replay nor send live.
   */
  async replayEventsAfter(
    lastEventId: EventId,
    { send }: { send: (eventId: EventId, message: JSONRPCMessage) => Promise<void> },
  ): Promise<StreamId> {
    const parsed = this.parse(lastEventId);
    if (!parsed) throw new Error(`Unknown event id: ${lastEventId}`);
    this.prune(this.now());
    let after = parsed.seq;
    for (let event = this.next(parsed.streamId, after); event; event = this.next(parsed.streamId, after)) {
      after = event.seq;
      await send(`${event.streamId}${SEPARATOR}${this.epoch}.${event.seq}`, JSON.parse(event.json) as JSONRPCMessage);
    }
    return parsed.streamId;
  }

  /**
   * The same replay with the stored JSON as it is and a synchronous `send` (the session transport writes it as it
   * is); returns the stream id, or undefined for an id this store did not issue.
   */
  replayJsonAfter(lastEventId: EventId, send: (eventId: EventId, json: string) => void): StreamId | undefined {
    const parsed = this.parse(lastEventId);
    if (!parsed) return undefined;
    this.prune(this.now());
    for (let event = this.next(parsed.streamId, parsed.seq); event; event = this.next(parsed.streamId, event.seq)) {
      send(`${event.streamId}${SEPARATOR}${this.epoch}.${event.seq}`, event.json);
    }
    return parsed.streamId;
  }

  /** Drops the events older than the ttl; the gateway's sweep calls it so a quiet session frees them too. */
  prune(now = this.now()): void {
    const cutoff = now - this.ttlMs;
    while (this.head < this.events.length && (this.events[this.head]?.storedAt ?? Infinity) < cutoff) {
      this.dropOldest();
    }
  }

  /**
   * Drops the oldest events until at most `maxBytes` are held (the memory budget under pressure, PROTOCOL.md §22.2): a
   * resume then replays what is left, as after the store's own cap. Returns the bytes freed.
   */
  trimTo(maxBytes: number): number {
    const before = this.heldBytes;
    while (this.heldBytes > maxBytes && this.head < this.events.length) this.dropOldest();
    return before - this.heldBytes;
  }

  /** The session closed: everything goes, and nothing more is kept. */
  release(): void {
    this.released = true;
    this.events = [];
    this.head = 0;
    this.onResize(-this.heldBytes);
    this.heldBytes = 0;
  }

  private dropOldest(): void {
    const event = this.events[this.head];
    if (!event) return;
    this.events[this.head] = undefined;
    this.head++;
    this.heldBytes -= event.bytes;
    this.onResize(-event.bytes);
    // Compact now and then, so the array does not grow with every event ever stored.
    if (this.head >= 1024 && this.head * 2 >= this.events.length) {
      this.events = this.events.slice(this.head);
      this.head = 0;
    }
  }

  /** The first held event of `streamId` with a sequence number above `after`. */
  private next(streamId: StreamId, after: number): StoredEvent | undefined {
    // Binary search for the first event after `after`, then walk to the stream's next one.
    let lo = this.head;
    let hi = this.events.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((this.events[mid]?.seq ?? Infinity) <= after) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < this.events.length; i++) {
      const event = this.events[i];
      if (event?.streamId === streamId) return event;
    }
    return undefined;
  }

  private parse(eventId: EventId): { streamId: StreamId; seq: number } | undefined {
    const at = eventId.lastIndexOf(SEPARATOR);
    if (at <= 0) return undefined;
    const match = /^([0-9a-f]+)\.(\d+)$/.exec(eventId.slice(at + 1));
    if (match?.[1] !== this.epoch) return undefined;
    const seq = Number(match[2]);
    if (!Number.isSafeInteger(seq) || seq < 1 || seq > this.lastSeq) return undefined;
    return { streamId: eventId.slice(0, at), seq };
  }
}

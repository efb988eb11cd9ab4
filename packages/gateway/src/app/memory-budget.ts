/**
 * The gateway's memory budget (PROTOCOL.md §22.2): what clients make it hold — sessions, their event stores, task
 * routes, listen streams — counted against one bound, `TASKRELAY_MEMORY_BUDGET_BYTES`. Event stores are counted by
 * their bytes at what they cost the process ({@link HELD_BYTE_COST}); a session, a route and a listen stream by a
 * fixed, generous estimate of what each holds besides (its SDK server, transport and maps; a record and a throttle; a
 * poll loop); the SSE streams' send buffers by the bytes waiting in them (`StreamBuffers`), at the same cost. Each
 * stream also has its own bound (§22.1).
 */

/** Default budget: 512 MiB, within a default 2 GiB-class V8 heap with room for the rest of the process. */
export const DEFAULT_MEMORY_BUDGET_BYTES = 512 * 1024 * 1024;
/** What one open session holds besides its event store (SDK server, transport, client channel, maps). */
export const SESSION_COST_BYTES = 64 * 1024;
/** What one task route holds (its record, throttle, callbacks). */
export const ROUTE_COST_BYTES = 4 * 1024;
/** What one `subscriptions/listen` stream holds (its poll loop, the versions it sent). */
export const LISTEN_COST_BYTES = 16 * 1024;
/**
 * What one byte held for a client costs the process (an event store's JSON, a stream's queued bytes): twice its
 * length (§22.2, issue 48 F3). A string the gateway holds lives in V8's old space, which grows to about twice what is
 * live before a full collection frees the garbage beside it (the copies made while serialising, framing and writing
 * each message). Counted once, 1,000 unread streams kept the budget at 537 MB while RSS was 0.92-1.19 GB.
 */
export const HELD_BYTE_COST = 2;

export interface MemoryBudgetOptions {
  /** The bound, in bytes (`TASKRELAY_MEMORY_BUDGET_BYTES`). Default {@link DEFAULT_MEMORY_BUDGET_BYTES}. */
  budgetBytes?: number;
  /** Sessions held right now (the session registry's count). */
  sessions: () => number;
  /** Task routes held right now (the router's count). */
  routes: () => number;
  /** Bytes waiting in every SSE stream's send buffers right now (§22.2). Default: none counted. */
  streamBytes?: () => number;
}

export interface MemoryUse {
  /** What the budget counts: held bytes at {@link HELD_BYTE_COST}, plus the fixed costs. */
  usedBytes: number;
  budgetBytes: number;
  /** Bytes of JSON in the event stores (their length, before {@link HELD_BYTE_COST}). */
  eventBytes: number;
  sessions: number;
  routes: number;
  listenStreams: number;
  /** Bytes waiting in the SSE streams' send buffers. */
  streamBytes: number;
  /** A new session would not fit: idle sessions are being evicted, and new sessions refused when none is idle. */
  pressure: boolean;
}

export class MemoryBudget {
  readonly budgetBytes: number;
  private eventBytes = 0;
  private listenCount = 0;

  constructor(private readonly options: MemoryBudgetOptions) {
    this.budgetBytes = options.budgetBytes ?? DEFAULT_MEMORY_BUDGET_BYTES;
  }

  /** Bytes counted right now. */
  get usedBytes(): number {
    return (
      (this.eventBytes + (this.options.streamBytes?.() ?? 0)) * HELD_BYTE_COST +
      this.options.sessions() * SESSION_COST_BYTES +
      this.options.routes() * ROUTE_COST_BYTES +
      this.listenCount * LISTEN_COST_BYTES
    );
  }

  /** Whether `extraBytes` more would still be within the budget. */
  fits(extraBytes = 0): boolean {
    return this.usedBytes + extraBytes <= this.budgetBytes;
  }

  /** An event store grew or shrank. */
  eventsResized(deltaBytes: number): void {
    this.eventBytes += deltaBytes;
  }

  listenOpened(): void {
    this.listenCount++;
  }

  listenClosed(): void {
    this.listenCount--;
  }

  use(): MemoryUse {
    const usedBytes = this.usedBytes;
    return {
      usedBytes,
      budgetBytes: this.budgetBytes,
      eventBytes: this.eventBytes,
      sessions: this.options.sessions(),
      routes: this.options.routes(),
      listenStreams: this.listenCount,
      streamBytes: this.options.streamBytes?.() ?? 0,
      pressure: usedBytes + SESSION_COST_BYTES > this.budgetBytes,
    };
  }
}

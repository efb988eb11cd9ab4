/**
 * Per-task progress throttle (PROTOCOL.md §8). The first value goes out at once; values that arrive within
 * `minIntervalMs` of the last send replace a single pending value, flushed when the interval ends. The newest value
 * always wins and order is never changed.
 */
export interface CoalescerOptions<T> {
  /** Minimum time between two sends, in milliseconds. 0 disables coalescing. */
  minIntervalMs: number;
  send: (value: T) => void;
  /** Called when a pending value is replaced by a newer one (it is never sent): the throttle's merge count. */
  onCoalesced?: () => void;
  /** Injected for tests; defaults to Date.now. */
  now?: () => number;
}

export class Coalescer<T> {
  private lastSentAt = Number.NEGATIVE_INFINITY;
  private pending: { value: T } | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly now: () => number;

  constructor(private readonly options: CoalescerOptions<T>) {
    this.now = options.now ?? Date.now;
  }

  push(value: T): void {
    const elapsed = this.now() - this.lastSentAt;
    if (this.timer === undefined && elapsed >= this.options.minIntervalMs) {
      this.emit(value);
      return;
    }
    if (this.pending) this.options.onCoalesced?.();
    this.pending = { value };
    this.timer ??= setTimeout(() => this.flush(), Math.max(0, this.options.minIntervalMs - elapsed));
  }

  /** Sends the pending value now, if any. */
  flush(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    const pending = this.pending;
    this.pending = undefined;
    if (pending) this.emit(pending.value);
  }

  /** Drops the pending value: nothing more is sent. */
  cancel(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.pending = undefined;
  }

  private emit(value: T): void {
    this.lastSentAt = this.now();
    this.options.send(value);
  }
}

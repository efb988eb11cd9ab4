/**
 * One SSE response with a bounded send buffer (PROTOCOL.md §22.1). Node queues whatever `res.write` is given, so a
 * client that stops reading would otherwise make the gateway hold every event in its heap until it runs out (a
 * progress stream of 200 KB messages reached 4 GB in two minutes). This follows `res.write`'s return value and
 * `'drain'`:
 * - a value that a newer one replaces (progress of one token, the status of one task) is coalesced while the client
 *   is behind: only the newest per key waits, and goes out on `'drain'`;
 * - anything else is written, unless the bytes waiting would pass the bound: then the stream is closed (destroyed, so
 *   its buffers are freed at once). A resumable client replays what it missed from the event store (§9).
 *
 * Hand-written: it is a few lines over node's own backpressure signals, and which values may be coalesced is
 * taskrelay's rule.
 */
import type { ServerResponse } from 'node:http';
import type { StreamBuffers } from './stream-buffers.js';

/** Default bound on the bytes waiting to go out on one stream: 1 MiB. */
export const DEFAULT_MAX_STREAM_BUFFER_BYTES = 1024 * 1024;

export interface SseWriterOptions {
  /**
   * Most bytes that may wait in this response's buffers (node's and its socket's, not the kernel's). A write that would
   * pass it while something is still waiting closes the stream; a single message bigger than the bound still goes out
   * on an empty buffer. Default {@link DEFAULT_MAX_STREAM_BUFFER_BYTES}.
   */
  maxBufferedBytes?: number;
  /** The stream went over its bound and was closed. Default: none. */
  onOverflow?: () => void;
  /** A waiting value was replaced by a newer one of the same key. Default: none. */
  onCoalesced?: () => void;
  /**
   * Count the coalesced values waiting for `'drain'` against the bound too (a `subscriptions/listen` stream, whose
   * every value is coalesced: its keys are bounded, not the size of their values). Default false.
   */
  boundPending?: boolean;
  /**
   * What an overflowing stream says last instead of a bare close (`notifications/cancelled` of a listen, §18.4): it
   * is written past the bound and the response ended; a client that never reads it is cut off after `lastWordsMs`.
   */
  lastWords?: () => string;
  /** How long an ended overflowing stream may keep its last words waiting. Default 5000 ms. */
  lastWordsMs?: number;
  /**
   * Where the stream reports the bytes waiting in its buffers, for the gateway's memory budget (§22.2), which may shed
   * it. Default: none.
   */
  buffers?: StreamBuffers;
  /** Whose stream this is, for `buffers`. Default `''`. */
  principal?: string;
}

export class SseWriter {
  /** The newest text per key, waiting for `'drain'`; insertion order is the order they go out in. */
  private readonly pending = new Map<string, string>();
  private pendingBytes = 0;
  private waitingForDrain = false;
  private closedForOverflow = false;
  private readonly maxBufferedBytes: number;

  constructor(
    readonly res: ServerResponse,
    private readonly options: SseWriterOptions = {},
  ) {
    this.maxBufferedBytes = options.maxBufferedBytes ?? DEFAULT_MAX_STREAM_BUFFER_BYTES;
    const { buffers } = options;
    if (buffers !== undefined) res.once('close', () => buffers.closed(this));
  }

  /** Bytes waiting in this stream's buffers: node's queue and the coalesced values. */
  get bufferedBytes(): number {
    return this.res.writableLength + this.pendingBytes;
  }

  /** Closes the stream to free its buffers (the memory budget's choice, §22.2), as an overflow would. */
  shed(): void {
    this.options.buffers?.closed(this);
    if (this.open) this.overflow(false);
  }

  /** Tells the budget what this stream holds now. */
  private report(): void {
    const { buffers } = this.options;
    if (buffers !== undefined && this.open) buffers.resized(this, this.options.principal ?? '', this.bufferedBytes);
  }

  /** Still writable: not ended, not destroyed (by the client or for overflow). */
  get open(): boolean {
    return !this.res.writableEnded && !this.res.destroyed;
  }

  /** True once the stream was closed for passing its bound. */
  get overflowed(): boolean {
    return this.closedForOverflow;
  }

  /** The client is behind: a write returned false and no `'drain'` came yet. */
  get behind(): boolean {
    return this.waitingForDrain;
  }

  /** Writes `text` after any coalesced values; closes the stream instead when it would pass the bound. */
  write(text: string): boolean {
    if (!this.open) return false;
    if (!this.flushPending()) return false;
    return this.push(text);
  }

  /** Writes `text`, or, while the client is behind, keeps it as the newest value of `key` until `'drain'`. */
  writeLatest(key: string, text: string): void {
    if (!this.open) return;
    if (!this.waitingForDrain) {
      this.push(text);
      return;
    }
    // A replaced value keeps its place: a newer progress never moves behind a message sent after the older one.
    const replaced = this.pending.get(key);
    if (replaced !== undefined) {
      this.options.onCoalesced?.();
      this.pendingBytes -= Buffer.byteLength(replaced);
    }
    this.pending.set(key, text);
    this.pendingBytes += Buffer.byteLength(text);
    if (this.options.boundPending && this.res.writableLength + this.pendingBytes > this.maxBufferedBytes) {
      this.overflow();
      return;
    }
    this.report();
  }

  /**
   * Ends the response, after any coalesced values, with `text` when given. The last message is not held to the bound:
   * it is a response already capped (`TASKRELAY_MAX_RESULT_BYTES`), and nothing follows it.
   */
  end(text?: string): void {
    if (!this.open) return;
    if (!this.flushPending()) return;
    if (text === undefined) this.res.end();
    else this.res.end(text);
  }

  private push(text: string): boolean {
    const waiting = this.res.writableLength;
    if (waiting > 0 && waiting + Buffer.byteLength(text) > this.maxBufferedBytes) {
      this.overflow();
      return false;
    }
    if (!this.res.write(text)) {
      this.awaitDrain();
      this.report();
    }
    return true;
  }

  /** Writes the coalesced values; false if that closed the stream. */
  private flushPending(): boolean {
    if (this.pending.size === 0) return true;
    const texts = [...this.pending.values()];
    this.pending.clear();
    this.pendingBytes = 0;
    for (const text of texts) if (!this.push(text)) return false;
    return true;
  }

  private awaitDrain(): void {
    if (this.waitingForDrain) return;
    this.waitingForDrain = true;
    this.res.once('drain', () => {
      this.waitingForDrain = false;
      if (this.open) this.flushPending();
      this.report();
    });
  }

  /** Closes the stream to free its buffers; `ownBound`: it passed its own bound (counted as an overflow). */
  private overflow(ownBound = true): void {
    this.options.buffers?.closed(this);
    this.closedForOverflow = true;
    this.pending.clear();
    this.pendingBytes = 0;
    const lastWords = this.options.lastWords;
    if (lastWords === undefined) {
      // destroy, not end: end would wait for the client to read what is queued, keeping it in memory.
      this.res.destroy();
    } else {
      // Said, then ended; what waits is at most the bound plus these words, until the client reads or the timer.
      this.res.end(lastWords());
      const timer = setTimeout(() => this.res.destroy(), this.options.lastWordsMs ?? 5000).unref();
      this.res.once('close', () => clearTimeout(timer));
    }
    if (ownBound) this.options.onOverflow?.();
  }
}

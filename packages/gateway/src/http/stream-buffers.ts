/**
 * What every SSE stream of the gateway holds in its send buffers, by principal (PROTOCOL.md §22.2): counted in the
 * memory budget, and shed from the largest consumer first when the budget is passed. Each stream's own bound (§22.1)
 * keeps one slow client from holding more than it; this keeps a thousand of them from holding a thousand times it.
 *
 * Hand-written: node exposes each response's queued bytes (`writableLength`) but nothing that sums them per owner.
 */

/** A stream the registry can shed: closing it frees its buffers (a resumable client replays what it missed). */
export interface SheddableStream {
  shed(): void;
}

interface Entry {
  principal: string;
  bytes: number;
}

export class StreamBuffers {
  private readonly entries = new Map<SheddableStream, Entry>();
  private total = 0;

  /** @param onGrow called when a stream's buffered bytes grew: the owner checks its budget. */
  constructor(private readonly onGrow: () => void = () => undefined) {}

  /** Bytes waiting in every stream's buffers right now (as last reported). */
  get bytes(): number {
    return this.total;
  }

  get streams(): number {
    return this.entries.size;
  }

  /** A stream's buffered bytes are now `bytes`. */
  resized(stream: SheddableStream, principal: string, bytes: number): void {
    const entry = this.entries.get(stream);
    const before = entry?.bytes ?? 0;
    if (entry === undefined) {
      if (bytes === 0) return;
      this.entries.set(stream, { principal, bytes });
    } else if (bytes === 0) {
      this.entries.delete(stream);
    } else {
      entry.bytes = bytes;
    }
    this.total += bytes - before;
    if (bytes > before) this.onGrow();
  }

  /** A stream ended: it holds nothing any more. */
  closed(stream: SheddableStream): void {
    const entry = this.entries.get(stream);
    if (entry === undefined) return;
    this.total -= entry.bytes;
    this.entries.delete(stream);
  }

  /** What each principal's streams hold in their buffers. */
  byPrincipal(): Map<string, number> {
    const held = new Map<string, number>();
    for (const { principal, bytes } of this.entries.values()) held.set(principal, (held.get(principal) ?? 0) + bytes);
    return held;
  }

  /** The largest stream buffer of `principal`, if its streams hold any. */
  largestOf(principal: string): { stream: SheddableStream; bytes: number } | undefined {
    let found: { stream: SheddableStream; bytes: number } | undefined;
    for (const [stream, entry] of this.entries) {
      if (entry.principal === principal && (found === undefined || entry.bytes > found.bytes)) {
        found = { stream, bytes: entry.bytes };
      }
    }
    return found;
  }

  /**
   * The stream to shed first: the largest buffer of the principal whose streams hold the most, so the largest
   * consumer gives way before anyone else's streams or idle sessions do.
   */
  largest(): { stream: SheddableStream; principal: string; bytes: number } | undefined {
    const perPrincipal = new Map<string, number>();
    for (const { principal, bytes } of this.entries.values()) {
      perPrincipal.set(principal, (perPrincipal.get(principal) ?? 0) + bytes);
    }
    let heaviest: string | undefined;
    for (const [principal, bytes] of perPrincipal) {
      if (heaviest === undefined || bytes > (perPrincipal.get(heaviest) ?? 0)) heaviest = principal;
    }
    let found: { stream: SheddableStream; principal: string; bytes: number } | undefined;
    for (const [stream, entry] of this.entries) {
      if (entry.principal === heaviest && (found === undefined || entry.bytes > found.bytes)) {
        found = { stream, principal: entry.principal, bytes: entry.bytes };
      }
    }
    return found;
  }
}

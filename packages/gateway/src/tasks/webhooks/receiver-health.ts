/**
 * What one gateway knows of each webhook receiver (PROTOCOL.md §27.3): a circuit per receiver, as Stripe and Svix back
 * off an endpoint rather than only an event. A receiver whose try failed (no answer, a refused connection, 408, 425,
 * 429, 5xx) is *suspected*: its circuit is open for a backoff that doubles with each further failure, during which its
 * due events are not sent (the claim defers them); after it, one probe at a time, with a short deadline. Any answer
 * that is not a failure closes it. A receiver that has not answered this gateway yet (new, or suspected since) gets
 * one try at a time until it does (slow start): before, the first round of tries to a receiver that hangs took up to
 * a principal's 4 slots, and when many such rounds timed out together, the claims in between handed receivers whose
 * failure was not counted yet several more (a 16-principal test saw 4 tries to one hanging receiver where the design
 * allows 2). Held in memory only: a restarted gateway learns again from one try per receiver.
 */
/** A suspected receiver's try ends after this long (or the configured timeout, when shorter). */
export const SUSPECT_TIMEOUT_MS = 2_000;
/** Receivers remembered at most; idle healthy ones and long-closed circuits are dropped first. */
const MAX_RECEIVERS = 10_000;

export { receiverOf } from '@taskrelay/shared';

interface Circuit {
  /** Failed tries in a row. */
  failures: number;
  /** No try before this (ms); 0 when closed. */
  openUntil: number;
  /** Tries in flight on this gateway. */
  inFlight: number;
  /** The last failure, for the deferred events' reason. */
  lastError: string;
  /** It answered this gateway since its last failure: it may take several tries at once. */
  answered: boolean;
}

export class ReceiverHealth {
  private readonly circuits = new Map<string, Circuit>();

  constructor(
    private readonly policy: { timeoutMs: number; retryMaxMs: number },
    private readonly backoffMs: (failures: number) => number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Deadline of the next try to `receiver`: short while it is suspected. */
  timeoutFor(receiver: string): number {
    const c = this.circuits.get(receiver);
    return c && c.failures > 0 ? Math.min(this.policy.timeoutMs, SUSPECT_TIMEOUT_MS) : this.policy.timeoutMs;
  }

  /** Tries in flight to suspected receivers (the deliverer caps them). */
  suspectInFlight(): number {
    let n = 0;
    for (const c of this.circuits.values()) if (c.failures > 0) n += c.inFlight;
    return n;
  }

  /**
   * Receivers not tried as usual, for the claim (ClaimFairness.blocked): the time its circuit closes while it is open
   * (the claim defers their due events to then), -1 when it is half open (one probe), 0 while that probe is in flight
   * or while a receiver that has not answered yet has its one try in flight (their events stay due, untouched).
   */
  blocked(): Record<string, number> {
    const now = this.now();
    const out: Record<string, number> = {};
    for (const [receiver, c] of this.circuits) {
      if (c.failures === 0) {
        if (!c.answered && c.inFlight > 0) out[receiver] = 0;
        continue;
      }
      out[receiver] = c.openUntil > now ? c.openUntil : c.inFlight > 0 ? 0 : -1;
    }
    return out;
  }

  /** Receivers that may take several tries in one claim (ClaimFairness.trusted): answered, with a try in flight. */
  trusted(): Set<string> {
    const out = new Set<string>();
    for (const [receiver, c] of this.circuits) if (c.failures === 0 && c.answered && c.inFlight > 0) out.add(receiver);
    return out;
  }

  /** The reason an event deferred by an open circuit records. */
  lastError(receiver: string): string {
    return this.circuits.get(receiver)?.lastError ?? 'earlier tries failed';
  }

  started(receiver: string): void {
    const c = this.circuits.get(receiver) ?? { failures: 0, openUntil: 0, inFlight: 0, lastError: '', answered: false };
    c.inFlight += 1;
    this.circuits.set(receiver, c);
  }

  /**
   * A try ended: `answered` when the receiver gave an answer that is not a failure; `failed` with why, when it failed
   * in a way worth backing off; `neither` when the try says nothing of the receiver (stopped by the drain, refused
   * before it was sent). The tries that were in flight together when the circuit opened count as one failure, so one
   * round of concurrent timeouts does not multiply the backoff.
   */
  ended(receiver: string, outcome: { kind: 'answered' | 'neither' } | { kind: 'failed'; why: string }): void {
    const c = this.circuits.get(receiver);
    if (!c) return;
    c.inFlight = Math.max(0, c.inFlight - 1);
    const now = this.now();
    if (outcome.kind === 'answered') {
      c.failures = 0;
      c.openUntil = 0;
      c.lastError = '';
      c.answered = true;
    } else if (outcome.kind === 'failed') {
      c.lastError = outcome.why;
      c.answered = false;
      if (c.openUntil <= now) {
        c.failures += 1;
        c.openUntil = now + this.backoffMs(c.failures);
      }
    }
    if (this.circuits.size > MAX_RECEIVERS) this.prune();
  }

  private prune(): void {
    const now = this.now();
    for (const [receiver, c] of this.circuits) {
      if (c.inFlight > 0) continue;
      if (c.failures === 0 || c.openUntil + this.policy.retryMaxMs < now) this.circuits.delete(receiver);
    }
  }
}

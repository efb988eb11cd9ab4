/**
 * The 2025-11-25 sessions this gateway holds (PROTOCOL.md §9, §16.1): by id, counted per principal, swept when idle,
 * and closed together when the gateway stops. A session is usable only by the principal that opened it.
 */
import { SESSION_COST_BYTES } from './memory-budget.js';
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { Logger } from '@taskrelay/shared';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { SessionEventStore } from '../transports/session/event-store.js';
import type { SessionTransport } from '../transports/session/session-transport.js';

export interface Session {
  transport: SessionTransport;
  server: Server;
  /** SSE events kept for Last-Event-ID resumption; released when the session closes. */
  events: SessionEventStore;
  principal: string;
  /** Last time a request for this session arrived or one of its streams closed. */
  lastSeenAt: number;
  /** HTTP responses (SSE streams, requests in flight) open right now. */
  openResponses: number;
}

export interface SessionRegistryOptions {
  /** A session with no open response and no request for this long is closed (TASKRELAY_SESSION_IDLE_MS). */
  idleMs: number;
  /** Open sessions per principal (TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL); 0: no cap. */
  maxPerPrincipal: number;
  metrics: GatewayMetrics;
  log: Logger;
  /** Called once per closed session, after it left the registry (the router retires its routes). */
  onClosed: (sessionId: string) => void;
}

export class SessionRegistry {
  private readonly sessions = new Map<string, Session>();
  private readonly perPrincipal = new Map<string, number>();
  private sweep: NodeJS.Timeout | undefined;

  constructor(private readonly options: SessionRegistryOptions) {}

  get size(): number {
    return this.sessions.size;
  }

  /** The session, for this principal only: another principal's session is as unknown as a missing one. */
  get(sessionId: string, principal: string): Session | undefined {
    const session = this.sessions.get(sessionId);
    return session && session.principal === principal ? session : undefined;
  }

  /** Whether the principal may open one more session. */
  hasRoomFor(principal: string): boolean {
    const cap = this.options.maxPerPrincipal;
    return cap <= 0 || (this.perPrincipal.get(principal) ?? 0) < cap;
  }

  heldBy(principal: string): number {
    return this.perPrincipal.get(principal) ?? 0;
  }

  add(sessionId: string, session: Session): void {
    this.sessions.set(sessionId, session);
    this.perPrincipal.set(session.principal, (this.perPrincipal.get(session.principal) ?? 0) + 1);
    this.options.metrics.sessions.set(this.sessions.size);
    this.options.log.debug({ sessionId, principal: session.principal }, 'session opened');
  }

  /** Forgets the session and releases its event store; idempotent. Its transport is the caller's to close. */
  close(sessionId: string): void {
    const session = this.sessions.get(sessionId);
    if (!session) return;
    this.sessions.delete(sessionId);
    const left = (this.perPrincipal.get(session.principal) ?? 1) - 1;
    if (left > 0) this.perPrincipal.set(session.principal, left);
    else this.perPrincipal.delete(session.principal);
    session.events.release();
    this.options.onClosed(sessionId);
    this.options.metrics.sessions.set(this.sessions.size);
    this.options.log.debug({ sessionId }, 'session closed');
  }

  /**
   * Closes idle sessions (no open response) until `fits()` (the memory budget, PROTOCOL.md §22.2): each time one of
   * the principal that holds the most (its sessions and their event stores), its least recently seen first. So under
   * pressure the largest consumer gives way before anyone else's idle sessions do; before, one least-recently-seen
   * order across principals let carol's and dave's new sessions evict 156 of alice's and bob's 200 idle ones. Their
   * tasks go on; a client finds its session gone (404) and opens another. Returns whether it fits in the end.
   */
  evictIdle(fits: () => boolean): boolean {
    while (!fits()) {
      const victim = this.nextToEvict();
      if (victim === undefined) break;
      const [sessionId, session] = victim;
      this.options.log.info(
        { sessionId, principal: session.principal },
        'memory budget reached: closing an idle session of the principal that holds the most',
      );
      this.options.metrics.sessionsEvicted.inc();
      this.close(sessionId);
      void session.transport.close().catch(() => undefined);
    }
    return fits();
  }

  /** What each principal's sessions hold: a fixed cost per session plus its event store's bytes (§22.2). */
  heldByPrincipal(): Map<string, number> {
    const held = new Map<string, number>();
    for (const session of this.sessions.values()) {
      held.set(session.principal, (held.get(session.principal) ?? 0) + SESSION_COST_BYTES + session.events.bytes);
    }
    return held;
  }

  /**
   * Frees something `principal`'s sessions hold (the memory budget, PROTOCOL.md §22.2): its least recently seen idle
   * session is closed; with none idle, the largest event store of its sessions drops its older half (a resume
   * replays less). Returns false when the principal's sessions hold nothing more to free.
   */
  relieveFrom(principal: string): boolean {
    let idle: [string, Session] | undefined;
    let largest: Session | undefined;
    for (const entry of this.sessions) {
      const [, session] = entry;
      if (session.principal !== principal) continue;
      if (session.openResponses === 0 && (idle === undefined || session.lastSeenAt < idle[1].lastSeenAt)) idle = entry;
      if (largest === undefined || session.events.bytes > largest.events.bytes) largest = session;
    }
    if (idle !== undefined) {
      const [sessionId, session] = idle;
      this.options.log.info(
        { sessionId, principal },
        'memory budget reached: closing an idle session of the principal that holds the most',
      );
      this.options.metrics.sessionsEvicted.inc();
      this.close(sessionId);
      void session.transport.close().catch(() => undefined);
      return true;
    }
    if (largest === undefined || largest.events.bytes === 0) return false;
    const bytes = largest.events.bytes;
    largest.events.trimTo(bytes < 64 * 1024 ? 0 : Math.floor(bytes / 2));
    this.options.metrics.eventStoresTrimmed.inc();
    return true;
  }

  /** The least recently seen idle session of the principal that holds the most bytes among those with one. */
  private nextToEvict(): [string, Session] | undefined {
    const held = new Map<string, number>();
    for (const session of this.sessions.values()) {
      held.set(session.principal, (held.get(session.principal) ?? 0) + SESSION_COST_BYTES + session.events.bytes);
    }
    let best: [string, Session] | undefined;
    for (const entry of this.sessions) {
      const [, session] = entry;
      if (session.openResponses !== 0) continue;
      if (best === undefined) {
        best = entry;
        continue;
      }
      const [, current] = best;
      const mine = held.get(session.principal) ?? 0;
      const theirs = held.get(current.principal) ?? 0;
      if (mine > theirs || (mine === theirs && session.lastSeenAt < current.lastSeenAt)) best = entry;
    }
    return best;
  }

  /** Starts the idle sweep: clients that vanish without DELETE would otherwise keep their session for ever. */
  startSweep(): void {
    const { idleMs, log } = this.options;
    this.sweep = setInterval(
      () => {
        const cutoff = Date.now() - idleMs;
        for (const [sessionId, session] of this.sessions) {
          session.events.prune();
          if (session.openResponses > 0 || session.lastSeenAt > cutoff) continue;
          log.info({ sessionId, idleMs }, 'closing idle session');
          this.close(sessionId);
          void session.transport.close().catch(() => undefined);
        }
      },
      Math.min(60_000, Math.max(250, Math.floor(idleMs / 4))),
    ).unref();
  }

  stopSweep(): void {
    clearInterval(this.sweep);
    this.sweep = undefined;
  }

  /** Closes every session's transport (the gateway is stopping). */
  async closeAll(): Promise<void> {
    this.stopSweep();
    await Promise.allSettled([...this.sessions.values()].map((s) => s.transport.close()));
  }
}

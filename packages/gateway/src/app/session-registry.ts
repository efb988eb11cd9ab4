/**
 * The 2025-11-25 sessions this gateway holds (PROTOCOL.md §9, §16.1): by id, counted per principal, swept when idle,
 * and closed together when the gateway stops. A session is usable only by the principal that opened it.
 */
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { Logger } from '@taskrelay/shared';
import type { GatewayMetrics } from '../ops/metrics.js';
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
   * Closes the sessions with no open response, least recently seen first, until `fits()` (the memory budget,
   * PROTOCOL.md §22.2). Their tasks go on; a client finds its session gone (404) and opens another. Returns
   * whether it fits in the end.
   */
  evictIdle(fits: () => boolean): boolean {
    if (fits()) return true;
    const idle = [...this.sessions]
      .filter(([, session]) => session.openResponses === 0)
      .sort(([, a], [, b]) => a.lastSeenAt - b.lastSeenAt);
    for (const [sessionId, session] of idle) {
      if (fits()) break;
      this.options.log.info({ sessionId }, 'memory budget reached: closing the least recently seen idle session');
      this.options.metrics.sessionsEvicted.inc();
      this.close(sessionId);
      void session.transport.close().catch(() => undefined);
    }
    return fits();
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

/**
 * The gateway's express app (PROTOCOL.md §16): probes, the /mcp guards, routing each /mcp request to its transport
 * (a 2025-era session or the sessionless 2026-07-28 endpoint), the operator pages and the JSON error handler.
 */
import { randomUUID } from 'node:crypto';
import express, { type Request, type Response } from 'express';
import { SUPPORTED_PROTOCOL_VERSIONS, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC, type GatewayConfig, type Logger, type RedisClient } from '@taskrelay/shared';
import type { Authenticator } from '../http/auth/authenticate.js';
import {
  chain,
  hostGuard,
  httpErrorHandler,
  jsonBody,
  jsonRpcError,
  originGuard,
  requireJsonContent,
} from '../http/http-guards.js';
import type { RequestLimits } from '../http/limits.js';
import { sanitizeOutgoing } from '../http/safe-errors.js';
import type { AdminQueries } from '../admin/queries.js';
import { createAdminRouter } from '../admin/router.js';
import type { WebhookOutbox } from '../tasks/webhooks/outbox.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { InflightCalls } from '../protocol/inflight-calls.js';
import { ANONYMOUS_PRINCIPAL } from '../protocol/request-meta.js';
import type { TaskRouter } from '../tasks/task-router.js';
import type { TaskService } from '../tasks/task-service.js';
import { SessionEventStore } from '../transports/session/event-store.js';
import { McpMethods } from '../protocol/methods.js';
import { answersAtOnce, createSessionServer } from '../transports/session/mcp-session.js';
import { SessionTransport } from '../transports/session/session-transport.js';
import type { RequestStateSigner } from '../protocol/request-state.js';
import { MODERN_PROTOCOL_VERSION, createModernEndpoint } from '../transports/sessionless/modern-endpoint.js';
import { MemoryBudget, SESSION_COST_BYTES } from './memory-budget.js';
import { StreamBuffers } from '../http/stream-buffers.js';
import type { Session, SessionRegistry } from './session-registry.js';

/**
 * How long a plain call or a waiting `tasks/result` may stay a JSON answer before its response becomes an SSE stream
 * (PROTOCOL.md §9.5): long enough for a quick tool's result to be one body, short enough that a long call gets its
 * resumable stream (the priming event) almost at once.
 */
const SSE_AFTER_MS = 100;

/** What a refused new session is told to wait before it tries again. */
const MEMORY_RETRY_AFTER_S = 30;

/** The versions spoken on 2025-era sessions (SDK 1.32.2); any other `MCP-Protocol-Version` is sessionless. */
const SESSION_PROTOCOL_VERSIONS: ReadonlySet<string> = new Set(SUPPORTED_PROTOCOL_VERSIONS);

type AuthedRequest = Request & { auth?: { clientId: string } };

export interface HttpAppDeps {
  options: GatewayConfig;
  version: string;
  log: Logger;
  metrics: GatewayMetrics;
  /** The command connection: `/readyz` pings it. */
  redis: RedisClient;
  auth: Authenticator;
  limits: RequestLimits;
  service: TaskService;
  router: TaskRouter;
  admin: AdminQueries;
  /** The webhook outbox, shown on the dashboard (PROTOCOL.md §27.6). */
  webhooks: WebhookOutbox;
  inflight: InflightCalls;
  /** Signs the `requestState` of 2026-07-28 input rounds (PROTOCOL.md §17.2). */
  requestState: RequestStateSigner;
  sessions: SessionRegistry;
  /** Aborted when the drain starts: pending `tasks/result` waits end. */
  drainSignal: AbortSignal;
  /** False once the gateway drains: every answer then closes its connection, and only the probes are served. */
  accepting: () => boolean;
  /** /mcp POST responses not yet finished (the drain waits for them); `settled` is called as each one closes. */
  posts: Set<Response>;
  settled: () => void;
}

/** A stream is shed for the budget only when this far behind (§22.2): its client is not reading it. */
const SHED_STREAM_MIN_BYTES = 256 * 1024;

export function createHttpApp(deps: HttpAppDeps): express.Express {
  const { options, log, metrics, auth, limits, service, router, inflight, sessions } = deps;
  const authEnabled = auth.enabled;
  const principalOf = (req: AuthedRequest) => req.auth?.clientId ?? ANONYMOUS_PRINCIPAL;

  /** Sessions, event stores, routes and listen streams under one bound (PROTOCOL.md §22.2). */
  // What every SSE stream holds in its send buffers, shed from the largest consumer first past the budget (§22.2).
  let shedQueued = false;
  const buffers = new StreamBuffers(() => {
    if (shedQueued || budget.fits()) return;
    shedQueued = true;
    // Not inside the stream's own write: shedding closes streams, possibly the one writing.
    setImmediate(() => {
      shedQueued = false;
      relieve();
    });
  });
  const budget = new MemoryBudget({
    budgetBytes: options.memoryBudgetBytes,
    sessions: () => sessions.size,
    routes: () => router.activeRoutes,
    streamBytes: () => buffers.bytes,
  });
  metrics.watchMemoryBudget(budget);
  /**
   * Past the budget (§22.2), again and again until the rest fit: the principal whose sessions and streams hold the most
   * gives way first — its largest stream buffer (when at least 256 KiB behind) is closed, else its least recently seen
   * idle session, else its largest event store drops its older half. So one principal's unread streams or floods never
   * cost anyone else first.
   */
  const relieve = () => {
    while (!budget.fits()) {
      const held = sessions.heldByPrincipal();
      for (const [principal, bytes] of buffers.byPrincipal()) held.set(principal, (held.get(principal) ?? 0) + bytes);
      const heaviest = [...held].sort((a, b) => b[1] - a[1]).map(([principal]) => principal);
      let freed = false;
      for (const principal of heaviest) {
        const stream = buffers.largestOf(principal);
        // A stream that far behind has a client not reading it; a reader's few unsent kilobytes are left alone.
        if (stream !== undefined && stream.bytes >= SHED_STREAM_MIN_BYTES) {
          metrics.streamsShed.inc();
          log.info(
            { principal, bufferedBytes: stream.bytes, budgetBytes: budget.budgetBytes },
            'SSE stream closed: the memory budget is reached and its principal holds the most',
          );
          stream.stream.shed();
          freed = true;
        } else {
          freed = sessions.relieveFrom(principal);
        }
        if (freed) break;
      }
      if (!freed) break;
    }
  };
  let evictionQueued = false;
  const onEventsResized = (delta: number) => {
    metrics.sseEventBytes.inc(delta);
    budget.eventsResized(delta);
    // Not inside the store's own write: relieving closes sessions, possibly the one writing.
    if (delta > 0 && !evictionQueued && !budget.fits()) {
      evictionQueued = true;
      setImmediate(() => {
        evictionQueued = false;
        relieve();
      });
    }
  };

  const app = express();
  app.disable('x-powered-by');
  // POST /mcp, the hot path, as one layer ahead of all others: the same guards in the same order as the routes below,
  // without express matching each of their paths on every request.
  app.use((req, res, next) => {
    if (req.method !== 'POST' || req.path !== '/mcp') return next();
    mcpPost(req, res, next);
  });
  // Once draining, only connections kept alive from before get here: every answer closes its connection.
  const drainGuard: express.RequestHandler = (req, res, next) => {
    if (deps.accepting()) return next();
    res.setHeader('Connection', 'close');
    if (req.path === '/healthz') return next();
    if (req.path === '/readyz') {
      res.status(503).json({ status: 'shutting down' });
      return;
    }
    jsonRpcError(res, 503, JSON_RPC.SERVER_ERROR, 'Gateway is shutting down');
  };
  app.use(drainGuard);
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res) => {
    const ready = await Promise.race([
      deps.redis.ping().then(
        () => true,
        () => false,
      ),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 1000).unref()),
    ]);
    // Memory pressure does not take the gateway out of rotation (its sessions live here), but says so (§22.2).
    res.status(ready ? 200 : 503).json({ status: ready ? 'ready' : 'redis unavailable', memory: budget.use() });
  });
  // Everything below the probes must be addressed to this gateway by name (DNS rebinding). Probes stay reachable by
  // whatever address the orchestrator uses (a pod IP).
  const checkHost = hostGuard(options.allowedHosts, options.host);
  app.use(checkHost);
  /** With authentication on, a valid token; mount it on any route that is not a probe (/admin/*, /metrics). */
  const requireAuth = auth.requireAuth;
  // The /mcp guards first and as one layer: they run on every request. Authentication before the body is read: an
  // anonymous caller costs no parsing.
  const mcpGuards = chain([
    originGuard(options.allowedOrigins),
    ...(authEnabled ? [requireAuth] : []),
    requireJsonContent,
    jsonBody({ maxBodyBytes: options.maxBodyBytes, maxJsonDepth: options.maxJsonDepth }),
  ]);
  app.use('/mcp', mcpGuards);
  /** The POST handler behind the guards: rate limits and sizes, then the request. */
  const handlePost = chain([limits.middleware(principalOf), (req, res, next) => void post(req, res).catch(next)]);
  const mcpPost = chain([drainGuard, checkHost, mcpGuards, handlePost]);
  /** Every SSE stream's bound and its counters (PROTOCOL.md §22.1). */
  const streamBounds = {
    buffers,
    maxBufferedBytes: options.maxStreamBufferBytes,
    onOverflow: () => {
      metrics.streamOverflows.inc();
      log.info({ maxBufferedBytes: options.maxStreamBufferBytes }, 'SSE stream closed: its client is not reading');
    },
    onCoalesced: () => metrics.streamCoalesced.inc(),
  };
  /** The MCP methods, once for both transports (PROTOCOL.md §16). */
  const methods = new McpMethods({
    service,
    metrics,
    inflight,
    requestState: deps.requestState,
    log,
    version: deps.version,
    maxResultBytes: options.maxResultBytes,
    authEnabled,
    operators: new Set(options.operators ?? []),
  });
  const modern = createModernEndpoint({
    methods,
    service,
    log,
    inflight,
    streams: streamBounds,
    listens: { opened: () => budget.listenOpened(), closed: () => budget.listenClosed() },
  });

  /** The session of a request, or an answer: 400 without a session id, 404 for an unknown or foreign one. */
  const sessionOf = (req: AuthedRequest, res: Response): Session | undefined => {
    const sessionId = req.header('mcp-session-id');
    if (!sessionId) {
      jsonRpcError(res, 400, JSON_RPC.SERVER_ERROR, 'Bad Request: Mcp-Session-Id header is required');
      return undefined;
    }
    const session = sessions.get(sessionId, principalOf(req));
    if (!session) {
      jsonRpcError(res, 404, JSON_RPC.SESSION_NOT_FOUND, 'Session not found');
      return undefined;
    }
    session.lastSeenAt = Date.now();
    session.openResponses++;
    res.on('close', () => {
      session.openResponses--;
      session.lastSeenAt = Date.now();
    });
    return session;
  };

  const openSession = async (req: AuthedRequest, res: Response) => {
    if (!isInitializeRequest(req.body)) {
      jsonRpcError(res, 400, JSON_RPC.SERVER_ERROR, 'Bad Request: no valid session id; send initialize first');
      return;
    }
    const principal = principalOf(req);
    if (!sessions.hasRoomFor(principal)) {
      log.info({ principal, sessions: sessions.heldBy(principal) }, 'session cap reached');
      jsonRpcError(
        res,
        429,
        JSON_RPC.SERVER_ERROR,
        `Too many open sessions for this principal (at most ${options.maxSessionsPerPrincipal}): close one (DELETE /mcp) or reuse it`,
      );
      return;
    }
    if (!sessions.evictIdle(() => budget.fits(SESSION_COST_BYTES))) {
      log.warn(budget.use(), 'memory budget reached: new session refused');
      metrics.sessionsRefused.inc();
      res.setHeader('Retry-After', String(MEMORY_RETRY_AFTER_S));
      jsonRpcError(
        res,
        503,
        JSON_RPC.SERVER_ERROR,
        `Gateway memory budget reached (TASKRELAY_MEMORY_BUDGET_BYTES): no new session now; retry in ${MEMORY_RETRY_AFTER_S} s or on another gateway`,
      );
      return;
    }
    const sessionId = randomUUID();
    const events = new SessionEventStore({ ttlMs: options.eventTtlMs, onResize: onEventsResized });
    const transport = new SessionTransport({
      sessionId,
      events,
      onsessioninitialized: (id) =>
        sessions.add(id, { transport, server, events, principal, lastSeenAt: Date.now(), openResponses: 0 }),
      onsessionclosed: (id) => sessions.close(id),
      filter: (message) => sanitizeOutgoing(message, log, sessionId),
      answersAtOnce: (request) => answersAtOnce(request, (taskId) => router.recentlyEnded(taskId) !== undefined),
      sseAfterMs: SSE_AFTER_MS,
      maxStreamBufferBytes: streamBounds.maxBufferedBytes,
      onStreamOverflow: streamBounds.onOverflow,
      onProgressCoalesced: streamBounds.onCoalesced,
      streamBuffers: buffers,
      principal,
    });
    transport.onclose = () => sessions.close(sessionId);
    const server = createSessionServer({
      methods,
      service,
      authEnabled,
      version: deps.version,
      drainSignal: deps.drainSignal,
    });
    server.onerror = (error) => log.debug({ err: error, sessionId }, 'mcp server error');
    await server.connect(transport);
    await transport.handleRequest(req, res, req.body);
  };

  const post = async (req: AuthedRequest, res: Response) => {
    deps.posts.add(res);
    metrics.requestsInFlight.set(deps.posts.size);
    res.on('close', () => {
      deps.posts.delete(res);
      metrics.requestsInFlight.set(deps.posts.size);
      deps.settled();
    });
    // 2026-07-28 (and any version no 2025-era session speaks): sessionless, one request per POST (PROTOCOL.md §14).
    const version = req.header('mcp-protocol-version')?.trim();
    if (version !== undefined && !SESSION_PROTOCOL_VERSIONS.has(version)) {
      await modern(req, res, principalOf(req));
      return;
    }
    if (req.header('mcp-session-id') === undefined) {
      await openSession(req, res);
      return;
    }
    const session = sessionOf(req, res);
    if (!session) return;
    // On 2025-11-25 a closed response stream is no cancel: the client may resume it with Last-Event-ID (§14).
    await session.transport.handleRequest(req, res, req.body);
  };
  // Reached only by paths the first layer leaves to express (`/mcp/`).
  app.post('/mcp', handlePost);

  const sessionRequest = async (req: AuthedRequest, res: Response) => {
    // No GET stream or DELETE without a session, and none at all on the sessionless 2026-07-28 transport.
    const version = req.header('mcp-protocol-version')?.trim();
    const sessionless = version !== undefined && !SESSION_PROTOCOL_VERSIONS.has(version);
    if (sessionless || req.header('mcp-session-id') === undefined) {
      res.setHeader('Allow', 'POST');
      jsonRpcError(
        res,
        405,
        JSON_RPC.SERVER_ERROR,
        sessionless
          ? `Method Not Allowed: ${req.method} /mcp is not part of the ${version ?? MODERN_PROTOCOL_VERSION} transport`
          : `Method Not Allowed: ${req.method} /mcp needs a session; send initialize first`,
      );
      return;
    }
    const session = sessionOf(req, res);
    if (session) await session.transport.handleRequest(req, res);
  };
  app.get('/mcp', (req: AuthedRequest, res: Response) => {
    metrics.streams.inc();
    res.on('close', () => metrics.streams.dec());
    return sessionRequest(req, res);
  });
  app.delete('/mcp', sessionRequest);
  // Any other method or path under /mcp (PUT, PATCH, OPTIONS, /mcp/x): a JSON-RPC error, never express's HTML 404 or
  // its text/plain OPTIONS answer.
  app.use('/mcp', (req, res) => {
    if (req.path !== '/') {
      jsonRpcError(res, 404, JSON_RPC.SERVER_ERROR, 'Not Found: the MCP endpoint is /mcp');
      return;
    }
    res.setHeader('Allow', 'GET, POST, DELETE');
    jsonRpcError(
      res,
      405,
      JSON_RPC.SERVER_ERROR,
      `Method Not Allowed: ${req.method.slice(0, 20)} /mcp (use GET, POST or DELETE)`,
    );
  });

  app.use(auth.metadataRouter);
  // Operators only (the metrics and pages describe every principal's work), behind the same Host and Origin checks as
  // /mcp; with auth off those loopback rules are all there is.
  const operatorOnly = [originGuard(options.allowedOrigins), requireAuth, auth.requireOperator];
  app.get('/metrics', ...operatorOnly, async (_req, res) => {
    res.setHeader('Content-Type', metrics.registry.contentType);
    res.send(await metrics.registry.metrics());
  });
  app.use('/admin', ...operatorOnly, createAdminRouter({ queries: deps.admin, log, webhooks: deps.webhooks }));

  // Malformed JSON and oversized bodies get JSON-RPC errors, never HTML.
  app.use(
    httpErrorHandler((error) => log.error({ err: error }, 'unhandled request error'), {
      maxBodyBytes: options.maxBodyBytes,
    }),
  );
  return app;
}

/**
 * The gateway process: express + the SDK's Streamable HTTP transport, one MCP server per session, and the shared
 * Redis machinery (task store, catalog, job dispatcher, the single progress/status subscriber).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import express, { type Request, type Response } from 'express';
import { SUPPORTED_PROTOCOL_VERSIONS, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  FAIL_FAST_REDIS_OPTIONS,
  RedisTaskStore,
  isLoopbackHost,
  createKeys,
  createLogger,
  createRedis,
  requireRedisUrl,
  waitForRedis,
  type GatewayConfig,
  type Logger,
} from '@taskrelay/shared';
import { ToolCatalog } from '../tasks/catalog.js';
import { SessionEventStore } from '../transports/session/event-store.js';
import { SessionTransport } from '../transports/session/session-transport.js';
import { waitEndedByShutdown } from '../wire/errors.js';
import { createAuthenticator } from '../http/auth/authenticate.js';
import {
  chain,
  hostGuard,
  httpErrorHandler,
  jsonBody,
  jsonRpcError,
  originGuard,
  requireJsonContent,
} from '../http/http-guards.js';
import { OpenTaskLimit, RequestLimits } from '../http/limits.js';
import { sanitizeOutgoing } from '../http/safe-errors.js';
import { JobDispatcher } from '../tasks/job-dispatcher.js';
import { MODERN_PROTOCOL_VERSION, createModernEndpoint } from '../transports/sessionless/modern-endpoint.js';
import { answersAtOnce, createSessionServer } from '../transports/session/mcp-session.js';
import { InflightCalls } from '../protocol/inflight-calls.js';
import { ANONYMOUS_PRINCIPAL } from '../protocol/request-meta.js';
import { AdminQueries } from '../ops/admin/queries.js';
import { createAdminRouter } from '../ops/admin/router.js';
import { GatewayMetrics } from '../ops/metrics.js';
import { Reaper } from '../tasks/reaper.js';
import { TaskRouter } from '../tasks/task-router.js';
import { TaskService } from '../tasks/task-service.js';
import { checkAnswer } from '../wire/input-answers.js';

export const GATEWAY_VERSION = '0.1.0';

/** The versions spoken on 2025-era sessions (SDK 1.32.2); any other `MCP-Protocol-Version` is sessionless. */
const SESSION_PROTOCOL_VERSIONS: ReadonlySet<string> = new Set(SUPPORTED_PROTOCOL_VERSIONS);

/** After the drain ended the calls still running, how long they get to send their error before connections close. */
const ENDED_CALLS_ANSWER_MS = 5_000;

export interface StartGatewayOptions extends GatewayConfig {
  /** Default: a pino logger at `logLevel`. */
  logger?: Logger;
  /** Identifies this process's progress channel. Default: random. */
  gatewayId?: string;
  /** How long the catalog of live tools is cached. Default 1000 ms. */
  catalogCacheMs?: number;
}

export interface GatewayHandle {
  /** `http://host:port/mcp` */
  readonly url: string;
  readonly port: number;
  readonly gatewayId: string;
  /**
   * Drains, then stops (PROTOCOL.md §11): accepts nothing new (the listener closes; a request on a kept-alive
   * connection gets 503), ends pending `tasks/result` waits at once (their tasks go on), lets plain calls in flight
   * finish for `shutdownGraceMs`, then cancels those still running with `GATEWAY_SHUTDOWN` and answers them with an
   * error. Tasks are never cancelled by a drain. Idempotent.
   */
  close(): Promise<void>;
}

interface Session {
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

type AuthedRequest = Request & { auth?: { clientId: string } };

export async function startGateway(options: StartGatewayOptions): Promise<GatewayHandle> {
  const log = options.logger ?? createLogger('gateway', { level: options.logLevel });
  const gatewayId = options.gatewayId ?? randomBytes(8).toString('hex');
  const redisUrl = requireRedisUrl(options);
  const keys = createKeys(options.prefix);
  // Commands fail fast while Redis is away (a JSON-RPC error within ~2 s, never a hung request); the subscriber waits
  // it out. BullMQ gets a connection of its own, so its scripts and traffic stay off the command connection.
  const redis = createRedis(redisUrl, FAIL_FAST_REDIS_OPTIONS);
  const queueRedis = createRedis(redisUrl, FAIL_FAST_REDIS_OPTIONS);
  const subscriber = createRedis(redisUrl);
  const connections = { redis, queue: queueRedis, subscriber };
  // Until every connection is up, connection errors belong to the one-line startup error, not to the log.
  const quiet = () => undefined;
  for (const client of Object.values(connections)) client.on('error', quiet);
  try {
    await Promise.all(Object.values(connections).map((client) => waitForRedis(client)));
  } catch (error) {
    for (const client of Object.values(connections)) client.disconnect();
    throw error;
  }
  const metrics = new GatewayMetrics();
  for (const [connection, client] of Object.entries(connections)) {
    client.off('error', quiet).on('error', (error) => {
      metrics.redisErrors.inc({ connection });
      log.warn({ err: error, connection }, 'redis error');
    });
    client.on('reconnecting', () => metrics.redisReconnects.inc({ connection }));
  }
  const admin = new AdminQueries(redis, queueRedis, keys);
  metrics.watchFleet(admin);
  // A principal's index outlives every task in it: the longest ttl after the longest run.
  const indexTtlMs = options.maxTtlMs + options.queueTimeoutMs + options.maxToolTimeoutMs;
  const store = new RedisTaskStore(redis, keys, { reaperIntervalMs: options.reaperIntervalMs, indexTtlMs });
  const catalogOptions = options.catalogCacheMs === undefined ? {} : { cacheMs: options.catalogCacheMs };
  const catalog = new ToolCatalog(redis, keys, log, catalogOptions);
  const dispatcher = new JobDispatcher(queueRedis, keys, log);
  const router = new TaskRouter(
    subscriber,
    (channel, message) => redis.publish(channel, message),
    store,
    keys,
    log,
    metrics,
    {
      gatewayId,
      progressIntervalMs: options.progressIntervalMs,
    },
  );
  await router.start();
  const auth = createAuthenticator(options, log);
  const authEnabled = auth.enabled;
  const service = new TaskService(store, catalog, dispatcher, router, metrics, log, {
    gatewayId,
    defaultTtlMs: options.defaultTtlMs,
    maxTtlMs: options.maxTtlMs,
    pollIntervalMs: options.pollIntervalMs,
    maxToolTimeoutMs: options.maxToolTimeoutMs,
    queueTimeoutMs: options.queueTimeoutMs,
    checkAnswer,
    // Per-principal caps need principals told apart: with auth off every caller is the one loopback user.
    ...(authEnabled ? { openTasks: new OpenTaskLimit(redis, keys, options.maxOpenTasks, indexTtlMs) } : {}),
  });
  const reaper = new Reaper(store, log, metrics, { holder: gatewayId, intervalMs: options.reaperIntervalMs });
  reaper.start();
  // The drain waits, without polling, for the requests and plain calls in flight to settle.
  let onSettled: (() => void) | undefined;
  const settled = () => onSettled?.();
  const inflight = new InflightCalls(settled);
  /** /mcp POST responses not yet finished: the requests in flight. */
  const posts = new Set<Response>();
  let draining = false;
  const drain = new AbortController();
  const sessions = new Map<string, Session>();
  /** Open sessions per principal (TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL). */
  const sessionCounts = new Map<string, number>();
  if (!authEnabled && !isLoopbackHost(options.host)) {
    log.warn(
      { host: options.host },
      'serving WITHOUT authentication on a non-loopback address (TASKRELAY_ALLOW_UNAUTHENTICATED): anyone who can reach it can run tools and see every task',
    );
  }
  const limits = new RequestLimits(redis, keys, log, {
    callsPerWindow: authEnabled ? options.rateLimitCalls : 0,
    taskOpsPerWindow: authEnabled ? options.rateLimitTaskOps : 0,
    windowMs: options.rateLimitWindowMs,
    maxArgumentBytes: options.maxArgumentBytes,
    maxProgressTokenBytes: options.maxProgressTokenBytes,
  });

  const principalOf = (req: AuthedRequest) => req.auth?.clientId ?? ANONYMOUS_PRINCIPAL;

  const closeSession = (sessionId: string) => {
    const session = sessions.get(sessionId);
    if (!session) return;
    sessions.delete(sessionId);
    const left = (sessionCounts.get(session.principal) ?? 1) - 1;
    if (left > 0) sessionCounts.set(session.principal, left);
    else sessionCounts.delete(session.principal);
    session.events.release();
    router.retireSession(sessionId);
    metrics.sessions.set(sessions.size);
    log.debug({ sessionId }, 'session closed');
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
    if (!draining) return next();
    res.setHeader('Connection', 'close');
    if (req.path === '/healthz') return next();
    if (req.path === '/readyz') {
      res.status(503).json({ status: 'shutting down' });
      return;
    }
    jsonRpcError(res, 503, -32000, 'Gateway is shutting down');
  };
  app.use(drainGuard);
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res) => {
    const ready = await Promise.race([
      redis.ping().then(
        () => true,
        () => false,
      ),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 1000).unref()),
    ]);
    res.status(ready ? 200 : 503).json({ status: ready ? 'ready' : 'redis unavailable' });
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
  const modern = createModernEndpoint({
    service,
    metrics,
    log,
    version: GATEWAY_VERSION,
    inflight,
    maxResultBytes: options.maxResultBytes,
  });

  /** The session of a request, or an answer: 400 without a session id, 404 for an unknown or foreign one. */
  const sessionOf = (req: AuthedRequest, res: Response): Session | undefined => {
    const sessionId = req.header('mcp-session-id');
    if (!sessionId) {
      jsonRpcError(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
      return undefined;
    }
    const session = sessions.get(sessionId);
    // A session is usable only by the principal that opened it; anyone else is told it does not exist.
    if (!session || session.principal !== principalOf(req)) {
      jsonRpcError(res, 404, -32001, 'Session not found');
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

  // Clients that vanish without DELETE would otherwise keep their session (transport, server) forever.
  const idleSweep = setInterval(
    () => {
      const cutoff = Date.now() - options.sessionIdleMs;
      for (const [sessionId, session] of sessions) {
        session.events.prune();
        if (session.openResponses > 0 || session.lastSeenAt > cutoff) continue;
        log.info({ sessionId, idleMs: options.sessionIdleMs }, 'closing idle session');
        closeSession(sessionId);
        void session.transport.close().catch(() => undefined);
      }
    },
    Math.min(60_000, Math.max(250, Math.floor(options.sessionIdleMs / 4))),
  ).unref();

  const post = async (req: AuthedRequest, res: Response) => {
    posts.add(res);
    metrics.requestsInFlight.set(posts.size);
    res.on('close', () => {
      posts.delete(res);
      metrics.requestsInFlight.set(posts.size);
      settled();
    });
    // 2026-07-28 (and any version no 2025-era session speaks): sessionless, one request per POST (PROTOCOL.md §14).
    const version = req.header('mcp-protocol-version')?.trim();
    if (version !== undefined && !SESSION_PROTOCOL_VERSIONS.has(version)) {
      await modern(req, res, principalOf(req));
      return;
    }
    if (req.header('mcp-session-id') === undefined) {
      if (!isInitializeRequest(req.body)) {
        jsonRpcError(res, 400, -32000, 'Bad Request: no valid session id; send initialize first');
        return;
      }
      const principal = principalOf(req);
      const held = sessionCounts.get(principal) ?? 0;
      if (options.maxSessionsPerPrincipal > 0 && held >= options.maxSessionsPerPrincipal) {
        log.info({ principal, sessions: held }, 'session cap reached');
        jsonRpcError(
          res,
          429,
          -32000,
          `Too many open sessions for this principal (at most ${options.maxSessionsPerPrincipal}): close one (DELETE /mcp) or reuse it`,
        );
        return;
      }
      const sessionId = randomUUID();
      const events = new SessionEventStore({
        ttlMs: options.eventTtlMs,
        onResize: (delta) => metrics.sseEventBytes.inc(delta),
      });
      const transport = new SessionTransport({
        sessionId,
        events,
        onsessioninitialized: (id) => {
          sessions.set(id, { transport, server, events, principal, lastSeenAt: Date.now(), openResponses: 0 });
          sessionCounts.set(principal, (sessionCounts.get(principal) ?? 0) + 1);
          metrics.sessions.set(sessions.size);
          log.debug({ sessionId: id, principal }, 'session opened');
        },
        onsessionclosed: (id) => closeSession(id),
        filter: (message) => sanitizeOutgoing(message, log, sessionId),
        answersAtOnce: (request) => answersAtOnce(request, (taskId) => router.recentlyEnded(taskId) !== undefined),
      });
      transport.onclose = () => closeSession(sessionId);
      const server = createSessionServer({
        service,
        metrics,
        authEnabled,
        version: GATEWAY_VERSION,
        inflight,
        drainSignal: drain.signal,
        maxResultBytes: options.maxResultBytes,
      });
      server.onerror = (error) => log.debug({ err: error, sessionId }, 'mcp server error');
      await server.connect(transport);
      await transport.handleRequest(req, res, req.body);
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
        -32000,
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

  app.use(auth.metadataRouter);
  app.get('/metrics', requireAuth, async (_req, res) => {
    res.setHeader('Content-Type', metrics.registry.contentType);
    res.send(await metrics.registry.metrics());
  });
  // The operator pages: behind the same Host, Origin and authentication checks as /mcp.
  app.use('/admin', originGuard(options.allowedOrigins), requireAuth, createAdminRouter({ queries: admin, log }));

  // Malformed JSON and oversized bodies get JSON-RPC errors, never HTML.
  app.use(
    httpErrorHandler((error) => log.error({ err: error }, 'unhandled request error'), {
      maxBodyBytes: options.maxBodyBytes,
    }),
  );

  const http = await listen(app, options.host, options.port);
  const port = (http.address() as AddressInfo).port;
  const hostForUrl = options.host.includes(':') ? `[${options.host}]` : options.host;
  const url = `http://${hostForUrl}:${port}/mcp`;
  log.info({ url, gatewayId, auth: authEnabled }, 'gateway listening');

  /** Resolves true once no request or plain call is in flight, false if `ms` pass first. */
  const settle = (ms: number) =>
    new Promise<boolean>((resolve) => {
      const finish = (done: boolean) => {
        clearTimeout(timer);
        onSettled = undefined;
        resolve(done);
      };
      const timer = setTimeout(() => finish(false), ms);
      onSettled = () => {
        if (posts.size === 0 && inflight.size === 0) finish(true);
      };
      onSettled();
    });

  let closing: Promise<void> | undefined;
  return {
    url,
    port,
    gatewayId,
    close: () =>
      (closing ??= (async () => {
        draining = true;
        clearInterval(idleSweep);
        await reaper.stop();
        const closed = new Promise<void>((resolve) => http.close(() => resolve()));
        http.closeIdleConnections();
        log.info(
          { gatewayId, graceMs: options.shutdownGraceMs, calls: inflight.size, requests: posts.size },
          'draining: accepting no new requests',
        );
        // A tasks/result wait could last as long as its task: it ends now, and the client asks another gateway.
        drain.abort(waitEndedByShutdown());
        if (!(await settle(options.shutdownGraceMs))) {
          log.info({ calls: inflight.size }, 'grace period over; ending the calls still running (GATEWAY_SHUTDOWN)');
        }
        // Even with none left: from here on a closing stream or transport is not a client's cancel.
        await inflight.endAll();
        if (!(await settle(ENDED_CALLS_ANSWER_MS))) {
          log.warn({ calls: inflight.size, requests: posts.size }, 'requests still open after the drain; closing them');
        }
        await Promise.allSettled([...sessions.values()].map((s) => s.transport.close()));
        http.closeAllConnections();
        await closed;
        router.close();
        await admin.close();
        await dispatcher.close();
        await Promise.all([redis, queueRedis].map((client) => client.quit().catch(() => client.disconnect())));
        log.info({ gatewayId }, 'gateway stopped');
      })()),
  };
}

/** Longer than the idle timeouts of common clients and load balancers (60 s), so the server is not the one closing. */
const KEEP_ALIVE_TIMEOUT_MS = 65_000;

function listen(app: express.Express, host: string, port: number): Promise<HttpServer> {
  return new Promise((resolve, reject) => {
    const server = app.listen(port, host, (error?: Error) => (error ? reject(error) : resolve(server)));
    // Node closes an idle keep-alive connection after 5 s, racing clients that reuse it at that moment (ECONNRESET
    // on their next request, seen in the soak). Keep idle connections longer than clients and proxies usually do.
    server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS;
    server.headersTimeout = KEEP_ALIVE_TIMEOUT_MS + 1_000;
  });
}

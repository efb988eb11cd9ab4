/**
 * The gateway's HTTP front (PROTOCOL.md §16): probes, the /mcp guards, routing each /mcp request to its transport
 * (a 2025-era session or the sessionless 2026-07-28 endpoint), the operator pages and the JSON error handler. POST
 * /mcp runs its guards without express's router; everything else is the express app.
 */
import { IncomingMessage, ServerResponse, type RequestListener } from 'node:http';
import express, { type Request, type Response } from 'express';
import {
  JSON_RPC,
  setWriteCoalescing,
  type AuditLog,
  type GatewayConfig,
  type Keys,
  type Logger,
  type RedisClient,
  type TaskStore,
  type TaskSearch,
  type WebhookOutbox,
} from '@taskrelay/shared';
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
import type { AdminQueries } from '../admin/queries.js';
import { createAdminRouter } from '../admin/router.js';
import { createLoginRouter } from '../admin/login.js';
import { AdminSessions, sessionOrBearer } from '../http/auth/admin-sessions.js';
import { adminWriteGuard } from '../http/auth/admin-writes.js';
import { createScheduleApi } from '../admin/schedule-api.js';
import { logsHandler, searchHandler } from '../admin/task-api.js';
import type { Schedules } from '../tasks/schedules/schedules.js';
import type { TaskReplay } from '../tasks/replay.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { InflightCalls } from '../protocol/inflight-calls.js';
import { ANONYMOUS_PRINCIPAL } from '../protocol/request-meta.js';
import type { TaskRouter } from '../tasks/task-router.js';
import type { TaskService } from '../tasks/task-service.js';
import type { TaskResources } from '../protocol/resources.js';
import { McpMethods } from '../protocol/methods.js';
import type { RequestStateSigner } from '../protocol/request-state.js';
import { createModernEndpoint } from '../transports/sessionless/modern-endpoint.js';
import { createMemoryRelief, type MemoryRelief } from './memory-relief.js';
import { waitpointRouter } from './waitpoint-route.js';
import type { WaitpointCallbacks } from '../tasks/waitpoints.js';
import { SESSION_PROTOCOL_VERSIONS, createSessionEndpoint, type AuthedRequest } from './session-endpoint.js';
import type { SessionRegistry } from './session-registry.js';

export interface HttpAppDeps {
  options: GatewayConfig;
  version: string;
  log: Logger;
  metrics: GatewayMetrics;
  /** The command connection: `/readyz` pings it; dashboard sessions live on it. */
  redis: RedisClient;
  keys: Keys;
  auth: Authenticator;
  limits: RequestLimits;
  service: TaskService;
  router: TaskRouter;
  admin: AdminQueries;
  /** The webhook outbox, shown on the dashboard (PROTOCOL.md §27.6). */
  webhooks: WebhookOutbox;
  /** Search and replay of tasks, and their kept log lines (PROTOCOL.md §30.2–§30.4). */
  search: TaskSearch;
  store: Pick<TaskStore, 'records' | 'logs'>;
  /** Task output as resources (PROTOCOL.md §34). */
  resources?: TaskResources;
  /** Operators' actions (PROTOCOL.md §30.5). */
  audit: AuditLog;
  replay: TaskReplay;
  /** Waitpoint callbacks (PROTOCOL.md §32.4). */
  waitpoints: WaitpointCallbacks;
  /** Schedules (PROTOCOL.md §33.2), managed by operators and by each principal for its own. */
  schedules: Schedules;
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

/** What the gateway's HTTP server is made of (`http.createServer(front.options, front.listener)`). */
export interface HttpFront {
  /** POST `/mcp`, the hot path, goes straight to its guards and its transport; every other request to the express app. */
  listener: RequestListener;
  /** The request and response classes: node's, with express's methods on their prototypes (see `expressClasses`). */
  options: { IncomingMessage: typeof IncomingMessage; ServerResponse: typeof ServerResponse };
}

export function createHttpApp(deps: HttpAppDeps): HttpFront {
  const { options, log, metrics, auth, limits, router, sessions } = deps;
  const principalOf = (req: AuthedRequest) => req.auth?.clientId ?? ANONYMOUS_PRINCIPAL;

  const relief = createMemoryRelief({ log, metrics, sessions, router, options });

  const app = express();
  app.disable('x-powered-by');
  const drainGuard = mountProbes(app, deps, relief.budget);
  // Everything below the probes must be addressed to this gateway by name (DNS rebinding). Probes stay reachable by
  // whatever address the orchestrator uses (a pod IP).
  const checkHost = hostGuard(options.allowedHosts, options.host);
  app.use(checkHost);
  // The /mcp guards first and as one layer: they run on every request. Authentication before the body is read: an
  // anonymous caller costs no parsing.
  const mcpGuards = chain([
    originGuard(options.allowedOrigins),
    ...(auth.enabled ? [auth.requireAuth] : []),
    requireJsonContent,
    jsonBody({ maxBodyBytes: options.maxBodyBytes, maxJsonDepth: options.maxJsonDepth }),
  ]);
  app.use('/mcp', mcpGuards);
  const { post, sessionRequest } = createMcpTransports(deps, relief, principalOf);
  /** The POST handler behind the guards: rate limits and sizes, then the request. */
  const handlePost = chain([limits.middleware(principalOf), (req, res, next) => void post(req, res).catch(next)]);
  const mcpPost = chain([drainGuard, checkHost, mcpGuards, handlePost]);
  // Reached only by the paths `servePost` leaves to express (`/mcp/`, `/MCP`).
  app.post('/mcp', handlePost);

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
  // No credentials: the token in the path is the authority (PROTOCOL.md §32.4).
  app.use('/waitpoints', waitpointRouter(deps.waitpoints, options.waitpointMaxBytes, log));
  mountOperatorRoutes(app, deps, principalOf);

  // Malformed JSON and oversized bodies get JSON-RPC errors, never HTML.
  const onError = httpErrorHandler((error) => log.error({ err: error }, 'unhandled request error'), {
    maxBodyBytes: options.maxBodyBytes,
  });
  app.use(onError);
  const servePost = expressPost(app, mcpPost, onError, log);
  return {
    listener: (req, res) => {
      if (req.method === 'POST' && isMcpPath(req.url)) servePost(req as Request, res as Response);
      else app(req, res);
    },
    options: expressClasses(app),
  };
}

/**
 * Node's request and response classes with express's methods on their prototypes, once: express's own `handle` sets
 * each request's and response's prototype instead (`Object.setPrototypeOf`, about 2.5% of the gateway's busy time in
 * an SDK task cycle once the rest of its dispatch was gone; issue 46). Requests express routes still get that from
 * express, which changes nothing they can see.
 */
function expressClasses(app: express.Express): HttpFront['options'] {
  class ExpressRequest extends IncomingMessage {}
  Object.setPrototypeOf(ExpressRequest.prototype, app.request);
  class ExpressResponse<R extends IncomingMessage = IncomingMessage> extends ServerResponse<R> {}
  Object.setPrototypeOf(ExpressResponse.prototype, app.response);
  return { IncomingMessage: ExpressRequest, ServerResponse: ExpressResponse };
}

/** `/mcp`, with or without a query: what express's routes above match for POST, case and trailing slash aside. */
function isMcpPath(url: string | undefined): boolean {
  return url === '/mcp' || (url !== undefined && url.startsWith('/mcp?'));
}

/**
 * POST `/mcp` without express's router: the same guards, in the same order, as the routes would run, and errors to the
 * same handler. Hand-written because express's dispatch (its `handle`, the router matching each layer's path,
 * `parseurl`) was about 4% of the gateway's busy time in an SDK task cycle (issue 46, docs/PERFORMANCE.md) for a path
 * that is always served the same way. The request and response have express's methods from their classes
 * (`expressClasses`: `res.status().json()`, `req.header()`, `req.is()`, which the guards and the transports use); this
 * sets the rest of what express's own `handle` sets.
 */
function expressPost(
  app: express.Express,
  handle: express.RequestHandler,
  onError: ReturnType<typeof httpErrorHandler>,
  log: Logger,
): (req: Request, res: Response) => void {
  return (req, res) => {
    req.res = res;
    res.req = req;
    res.locals = Object.create(null) as Response['locals'];
    req.originalUrl = req.url;
    req.baseUrl = '';
    // The chain answers every request itself; an error goes to the error handler, as from express's router.
    const last = (error?: unknown): void => {
      if (error === undefined || error === null) {
        onError(new Error('POST /mcp was not answered'), req, res, last);
        return;
      }
      if (!res.headersSent) return onError(error, req, res, last);
      // What express's final handler does once an answer is under way.
      log.error({ err: error }, 'request error after its answer started');
      res.destroy();
    };
    handle(req, res, last);
  };
}

/**
 * The drain guard and the probes, ahead of every other route: answered whatever Host they name. Returns the drain
 * guard, which the POST /mcp hot path runs too.
 */
function mountProbes(app: express.Express, deps: HttpAppDeps, budget: MemoryRelief['budget']): express.RequestHandler {
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
  return drainGuard;
}

/**
 * The MCP methods once, and the two transports that frame them (PROTOCOL.md §16): `post` routes one /mcp POST to the
 * sessionless 2026-07-28 endpoint or to a 2025-era session; `sessionRequest` serves a session's GET and DELETE.
 */
function createMcpTransports(
  deps: HttpAppDeps,
  relief: MemoryRelief,
  principalOf: (req: AuthedRequest) => string,
): {
  post: (req: AuthedRequest, res: Response) => Promise<void>;
  sessionRequest: (req: AuthedRequest, res: Response) => Promise<void>;
} {
  const { options, log, metrics, service, inflight } = deps;
  const { budget } = relief;
  /** Every SSE stream's bound and its counters (PROTOCOL.md §22.1). */
  const streamBounds = {
    buffers: relief.buffers,
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
    authEnabled: deps.auth.enabled,
    operators: new Set(options.operators ?? []),
    maxStartDelayMs: options.maxStartDelayMs,
    ...(deps.resources ? { resources: deps.resources } : {}),
  });
  const modern = createModernEndpoint({
    methods,
    service,
    log,
    inflight,
    streams: streamBounds,
    listens: { opened: () => budget.listenOpened(), closed: () => budget.listenClosed() },
  });

  const sessionEndpoint = createSessionEndpoint({
    options,
    log,
    metrics,
    sessions: deps.sessions,
    router: deps.router,
    service,
    methods,
    budget,
    onEventsResized: relief.onEventsResized,
    streams: streamBounds,
    principalOf,
    authEnabled: deps.auth.enabled,
    version: deps.version,
    drainSignal: deps.drainSignal,
  });
  const { sessionOf, openSession, sessionRequest } = sessionEndpoint;

  const inFlightChanged = () => {
    metrics.requestsInFlight.set(deps.posts.size);
    // Several requests at once: the script calls of one event-loop turn go to Redis as one write (PROTOCOL.md
    // §21.2.2); a lone request's go at once.
    setWriteCoalescing(deps.redis, deps.posts.size > 1);
  };
  const post = async (req: AuthedRequest, res: Response) => {
    deps.posts.add(res);
    inFlightChanged();
    res.on('close', () => {
      deps.posts.delete(res);
      inFlightChanged();
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
  return { post, sessionRequest };
}

/**
 * The operator's routes and the caller's own task search. Operators only (the metrics and pages describe every
 * principal's work), behind the same Host and Origin checks as /mcp; with auth off those loopback rules are all there
 * is.
 */
function mountOperatorRoutes(
  app: express.Express,
  deps: HttpAppDeps,
  principalOf: (req: AuthedRequest) => string,
): void {
  const { options, log, metrics, auth, service } = deps;
  const requireAuth = auth.requireAuth;
  // The dashboard's login (docs/OPERATIONS.md): a session cookie stands for a bearer header on the operator routes,
  // and every write there passes one guard (same origin; JSON, or the session's CSRF token).
  const operatorSessions = new AdminSessions(deps.redis, deps.keys, options.adminSessionTtlMs);
  const operatorAuth = auth.enabled
    ? sessionOrBearer({ sessions: operatorSessions, requireAuth, loginPath: '/admin/login', log })
    : requireAuth;
  const operatorOnly = [originGuard(options.allowedOrigins), operatorAuth, auth.requireOperator, adminWriteGuard];
  const operators = new Set(options.operators ?? []);
  app.use(
    '/admin',
    originGuard(options.allowedOrigins),
    createLoginRouter({ auth, sessions: operatorSessions, operators, audit: deps.audit, log }),
  );
  app.get('/metrics', ...operatorOnly, async (_req, res) => {
    res.setHeader('Content-Type', metrics.registry.contentType);
    res.send(await metrics.registry.metrics());
  });
  const isOperator = (req: AuthedRequest) => !auth.enabled || operators.has(principalOf(req));
  const ownScope = (req: AuthedRequest) => (isOperator(req) ? {} : { principal: principalOf(req) });
  // Schedules (PROTOCOL.md §33.2): an operator's routes for every principal's, and everyone's for their own.
  const scheduleApi = (scope: (req: AuthedRequest) => { principal?: string }) =>
    createScheduleApi({ schedules: deps.schedules, scope, by: principalOf, audit: deps.audit, log });
  app.use(
    '/admin/api/schedules',
    ...operatorOnly,
    scheduleApi(() => ({})),
  );
  app.use('/api/schedules', originGuard(options.allowedOrigins), requireAuth, adminWriteGuard, scheduleApi(ownScope));
  app.use(
    '/admin',
    ...operatorOnly,
    createAdminRouter({
      queries: deps.admin,
      log,
      webhooks: deps.webhooks,
      tasks: {
        search: deps.search,
        replay: deps.replay,
        store: deps.store,
        cancel: (taskId) => service.cancelAsOperator(taskId),
        by: principalOf,
      },
      audit: deps.audit,
    }),
  );
  // Anyone's own tasks, searched as operators search theirs (PROTOCOL.md §30.2); an operator sees every principal's.
  app.get('/api/tasks', originGuard(options.allowedOrigins), requireAuth, searchHandler(deps.search, ownScope));
  app.get('/api/tasks/:id/logs', originGuard(options.allowedOrigins), requireAuth, logsHandler(deps.store, ownScope));
}

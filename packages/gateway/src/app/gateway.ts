/**
 * The composition root of the gateway process (PROTOCOL.md §16.1): wires the Redis connections, the task layer, the
 * session registry and the HTTP app, and owns the lifecycle. A start that fails midway undoes what it started.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Response } from 'express';
import {
  FAIL_FAST_REDIS_OPTIONS,
  AuditLog,
  ConfigError,
  oneLine,
  TaskStore,
  TaskSearch,
  WaitpointTokens,
  announcePublicUrl,
  isLoopbackHost,
  createKeys,
  keyLayoutOf,
  createLogger,
  createRedis,
  requireRedisUrl,
  waitForRedis,
  publishOn,
  resolveGatewayOptions,
  StoreRunner,
  TaskOutputStore,
  BlobObjects,
  WebhookOutbox,
  type GatewayConfig,
  type GatewayOptions,
  type Keys,
  type Logger,
} from '@taskrelay/shared';
import { createAuthenticator } from '../http/auth/authenticate.js';
import { RequestLimits } from '../http/limits.js';
import { OpenTaskLimit } from '../tasks/open-task-limit.js';
import { AdminQueries } from '../admin/queries.js';
import { GatewayMetrics } from '../metrics/gateway-metrics.js';
import { InflightCalls } from '../protocol/inflight-calls.js';
import { RequestStateSigner } from '../protocol/request-state.js';
import { ToolCatalog, VERSION_SCAN_LIMIT } from '../tasks/catalog.js';
import { JsonSchemaValidator } from '../tasks/json-schema.js';
import { JobDispatcher } from '../tasks/job-dispatcher.js';
import { Reaper } from '../tasks/reaper.js';
import { TaskReplay } from '../tasks/replay.js';
import { readSchedulesFile } from '../tasks/schedules/schedule-file.js';
import { Schedules } from '../tasks/schedules/schedules.js';
import { ChannelBacklog } from '../tasks/channel-backlog.js';
import { GatewayChannels } from '../tasks/gateway-channels.js';
import { TaskRouter } from '../tasks/task-router.js';
import { TaskService } from '../tasks/task-service.js';
import { WaitpointCallbacks } from '../tasks/waitpoints.js';
import { ResourceFeed } from '../tasks/resource-feed.js';
import { TaskResources } from '../protocol/resources.js';
import { WebhookDeliverer } from '../tasks/webhooks/deliverer.js';
import { WebhookIntake } from '../tasks/webhooks/intake.js';
import { WebhookSigner } from '../tasks/webhooks/signer.js';
import { WebhookPolicy } from '../tasks/webhooks/url-policy.js';
import { waitEndedByShutdown } from '../wire/errors.js';
import { checkAnswer } from '../wire/input-answers.js';
import { createHttpApp, type HttpFront } from './http-app.js';
import { SessionRegistry } from './session-registry.js';
import { GATEWAY_VERSION } from './version.js';

export { GATEWAY_VERSION } from './version.js';

/** After the drain ended the calls still running, how long they get to send their error before connections close. */
const ENDED_CALLS_ANSWER_MS = 5_000;

/**
 * The gateway's lifecycle: `starting` until it listens, `ready` while it serves, `draining` from `close()` until the
 * last connection is gone, then `closed`. A failed start goes from `starting` to `closed` (everything undone).
 */
export type GatewayState = 'starting' | 'ready' | 'draining' | 'closed';

/**
 * `startGateway`'s options: only what differs from the documented defaults (docs/CONFIGURATION.md), `redisUrl` at
 * least; `resolveGatewayOptions` applies the rest, as an empty environment would.
 */
export interface StartGatewayOptions extends GatewayOptions {
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
  /** Where the gateway is in its lifecycle (PROTOCOL.md §16.1). */
  readonly state: GatewayState;
  /**
   * Drains, then stops (PROTOCOL.md §11): accepts nothing new (the listener closes; a request on a kept-alive
   * connection gets 503), ends pending `tasks/result` waits at once (their tasks go on), lets plain calls in flight
   * finish for `shutdownGraceMs`, then cancels those still running with `GATEWAY_SHUTDOWN` and answers them with an
   * error. Tasks are never cancelled by a drain. Idempotent.
   */
  close(): Promise<void>;
}

/** What a start has opened so far, undone in reverse order when a later step fails. */
class Undo {
  private readonly steps: Array<() => Promise<unknown> | void> = [];

  push(step: () => Promise<unknown> | void): void {
    this.steps.push(step);
  }

  async run(): Promise<void> {
    for (const step of this.steps.reverse())
      await Promise.resolve()
        .then(step)
        .catch(() => undefined);
    this.steps.length = 0;
  }
}

export async function startGateway(options: StartGatewayOptions): Promise<GatewayHandle> {
  const undo = new Undo();
  try {
    return await start({ ...options, ...resolveGatewayOptions(options) }, undo);
  } catch (error) {
    await undo.run();
    throw error;
  }
}

/** A result over this many bytes is read apart from the task's other fields (PROTOCOL.md §22.5). */
const LARGE_RESULT_BYTES = 1024 * 1024;
/** Connections that read large results, one read at a time each. */
const LARGE_READ_CONNECTIONS = 4;
/** How long one large read may take (16 MiB on a busy Redis), where other commands fail fast. */
const LARGE_READ_TIMEOUT_MS = 30_000;

async function start(options: GatewayConfig & StartGatewayOptions, undo: Undo): Promise<GatewayHandle> {
  let state: GatewayState = 'starting';
  const log = options.logger ?? createLogger('gateway', { level: options.logLevel });
  // One debug line per move, so a lifecycle test (and an operator at LOG_LEVEL=debug) sees each state once, in order.
  const enter = (next: GatewayState) => {
    log.debug({ from: state, to: next }, 'gateway state');
    state = next;
  };
  const gatewayId = options.gatewayId ?? randomBytes(8).toString('hex');
  const keys = createKeys(options.prefix, keyLayoutOf(options.redisUrl, options.prefix, options.keyLayout));
  const connections = await openConnections(requireRedisUrl(options), undo, log, keys.layout === 'sharded');
  const { redis, metrics } = connections;
  const auth = createAuthenticator(options, log);
  const tasks = await startTaskLayer({ options, connections, keys, gatewayId, authEnabled: auth.enabled, log, undo });
  // The drain waits, without polling, for the requests and plain calls in flight to settle.
  const settling: Settling = new Settling(() => posts.size === 0 && inflight.size === 0);
  const inflight = new InflightCalls(settling.settled);
  /** /mcp POST responses not yet finished: the requests in flight. */
  const posts = new Set<Response>();
  const drain = new AbortController();
  const sessions = new SessionRegistry({
    idleMs: options.sessionIdleMs,
    maxPerPrincipal: options.maxSessionsPerPrincipal,
    metrics,
    log,
    onClosed: (sessionId) => tasks.router.retireSession(sessionId),
  });
  sessions.startSweep();
  undo.push(() => sessions.closeAll());
  if (!auth.enabled && !isLoopbackHost(options.host)) {
    log.warn(
      { host: options.host },
      'serving WITHOUT authentication on a non-loopback address (TASKRELAY_ALLOW_UNAUTHENTICATED): anyone who can reach it can run tools and see every task',
    );
  }
  const limits = new RequestLimits(redis, keys, log, {
    callsPerWindow: auth.enabled ? options.rateLimitCalls : 0,
    taskOpsPerWindow: auth.enabled ? options.rateLimitTaskOps : 0,
    windowMs: options.rateLimitWindowMs,
    maxArgumentBytes: options.maxArgumentBytes,
    maxProgressTokenBytes: options.maxProgressTokenBytes,
  });
  // One key for every replica: the retry of an input round may land on any of them (PROTOCOL.md §17.2).
  const requestState = await RequestStateSigner.create({
    secret: options.requestStateSecret,
    redis,
    key: keys.requestStateKey,
  });
  const app = createHttpApp({
    options,
    requestState,
    version: GATEWAY_VERSION,
    log,
    metrics,
    redis,
    keys,
    auth,
    limits,
    service: tasks.service,
    router: tasks.router,
    admin: tasks.admin,
    webhooks: tasks.webhooks.outbox,
    search: tasks.search,
    replay: tasks.replay,
    schedules: tasks.schedules,
    store: tasks.store,
    waitpoints: tasks.waitpoints,
    resources: tasks.resources,
    audit: new AuditLog(redis, keys),
    inflight,
    sessions,
    drainSignal: drain.signal,
    accepting: () => state === 'ready',
    posts,
    settled: settling.settled,
  });

  const http = await listen(app, options.host, options.port);
  const port = (http.address() as AddressInfo).port;
  const hostForUrl = options.host.includes(':') ? `[${options.host}]` : options.host;
  const url = `http://${hostForUrl}:${port}/mcp`;
  // Workers put this in front of a waitpoint's token (PROTOCOL.md §32.2).
  const publicUrl = options.publicUrl ?? `http://localhost:${port}`;
  await announcePublicUrl(redis, keys, publicUrl, options.publicUrl !== undefined);
  enter('ready');
  log.info({ url, gatewayId, auth: auth.enabled, publicUrl }, 'gateway listening');

  const running: Running = { options, log, gatewayId, connections, tasks, sessions, inflight, posts, drain, settling };
  let closing: Promise<void> | undefined;
  return {
    url,
    port,
    gatewayId,
    get state() {
      return state;
    },
    close: () => (closing ??= drainAndStop(running, http, enter)),
  };
}

/** What a started gateway runs, as its drain stops it. */
interface Running {
  options: GatewayConfig;
  log: Logger;
  gatewayId: string;
  connections: Connections;
  tasks: TaskLayer;
  sessions: SessionRegistry;
  inflight: InflightCalls;
  /** /mcp POST responses not yet finished. */
  posts: Set<Response>;
  /** Aborted when the drain starts: pending `tasks/result` waits end. */
  drain: AbortController;
  settling: Settling;
}

/** `GatewayHandle.close`: the drain (PROTOCOL.md §11), then everything the start opened, closed. */
async function drainAndStop(r: Running, http: HttpServer, enter: (next: GatewayState) => void): Promise<void> {
  const { options, log, gatewayId, tasks, sessions, inflight, posts } = r;
  enter('draining');
  sessions.stopSweep();
  await tasks.reaper.stop();
  // Firings go to the gateways that stay (PROTOCOL.md §33.2); the schedules API still answers until the end.
  await tasks.schedules.stopFiring();
  // Tries in flight are handed back at once: another gateway (or this one's successor) makes them.
  await tasks.webhooks.stopDeliverer();
  const closed = new Promise<void>((resolve) => http.close(() => resolve()));
  http.closeIdleConnections();
  log.info(
    { gatewayId, graceMs: options.shutdownGraceMs, calls: inflight.size, requests: posts.size },
    'draining: accepting no new requests',
  );
  // A tasks/result wait could last as long as its task: it ends now, and the client asks another gateway.
  r.drain.abort(waitEndedByShutdown());
  if (!(await r.settling.within(options.shutdownGraceMs))) {
    log.info({ calls: inflight.size }, 'grace period over; ending the calls still running (GATEWAY_SHUTDOWN)');
  }
  // Even with none left: from here on a closing stream or transport is not a client's cancel.
  await inflight.endAll();
  if (!(await r.settling.within(ENDED_CALLS_ANSWER_MS))) {
    log.warn({ calls: inflight.size, requests: posts.size }, 'requests still open after the drain; closing them');
  }
  await sessions.closeAll();
  http.closeAllConnections();
  await closed;
  tasks.router.close();
  await tasks.admin.close();
  await tasks.schedules.close();
  await tasks.dispatcher.close();
  const { redis, queueRedis } = r.connections;
  await Promise.all([redis, queueRedis].map((client) => client.quit().catch(() => client.disconnect())));
  enter('closed');
  log.info({ gatewayId }, 'gateway stopped');
}

/** The drain's wait for the requests and plain calls in flight to settle: woken as each ends, never polling. */
class Settling {
  private onSettled: (() => void) | undefined;

  /** `idle`: true when nothing is in flight. */
  constructor(private readonly idle: () => boolean) {}

  /** Called as each request or plain call ends. */
  readonly settled = (): void => this.onSettled?.();

  /** Resolves true once no request or plain call is in flight, false if `ms` pass first. */
  within(ms: number): Promise<boolean> {
    return new Promise<boolean>((resolve) => {
      const finish = (done: boolean) => {
        clearTimeout(timer);
        this.onSettled = undefined;
        resolve(done);
      };
      const timer = setTimeout(() => finish(false), ms);
      this.onSettled = () => {
        if (this.idle()) finish(true);
      };
      this.onSettled();
    });
  }
}

type TaskLayer = Awaited<ReturnType<typeof startTaskLayer>>;

/**
 * The task layer and what reads it (PROTOCOL.md §16): the store, the operator's queries, the catalog, the dispatcher,
 * the router (subscribed before the gateway serves), the webhooks, the service, the reaper, search and replay.
 */
async function startTaskLayer(w: {
  options: GatewayConfig & StartGatewayOptions;
  connections: Connections;
  keys: Keys;
  gatewayId: string;
  authEnabled: boolean;
  log: Logger;
  undo: Undo;
}) {
  const { options, keys, gatewayId, log, undo } = w;
  const { redis, queueRedis, subscriber, metrics } = w.connections;
  const { store, keptMs, indexTtlMs } = await openStore(options, w.connections, keys, log);
  // One JSON Schema validator for tool arguments and input answers alike.
  const jsonSchemas = new JsonSchemaValidator(log);
  const catalog = new ToolCatalog(redis, keys, log, {
    jsonSchemas,
    retentionMs: options.catalogRetentionMs,
    // Pools whose tool versions live tasks last ran are kept (PROTOCOL.md §24.9).
    versionsInUse: () => store.records.liveToolVersions(VERSION_SCAN_LIMIT),
    // In the sharded layout a tool's controls are its shards' together (PROTOCOL.md §3.3).
    ...(store.placement === undefined ? {} : { shardsOf: (queues) => store.placement!.placedMany(queues) }),
    ...(options.catalogCacheMs === undefined ? {} : { cacheMs: options.catalogCacheMs }),
  });
  const admin = new AdminQueries(redis, queueRedis, keys, store, catalog);
  undo.push(() => admin.close());
  metrics.watchFleet(admin);
  const dispatcher = new JobDispatcher(queueRedis, keys, log);
  undo.push(() => dispatcher.close());
  // Acks to other gateways: `SPUBLISH` on their home channel in the sharded layout (PROTOCOL.md §1.2).
  const publish = (channel: string, message: string) => publishOn(redis, keys, channel, message);
  // The sharded layout's channels: this gateway's on every placed shard, and on shards placed later (§1.2).
  const channels =
    store.placement === undefined ? undefined : new GatewayChannels(subscriber, keys, gatewayId, store.placement, log);
  // Before the subscriber: the budget is in place, and the count at 0, when the first tool message is published.
  const backlog = new ChannelBacklog(redis, keys, gatewayId, log, (channel) => channels?.shardOfEvents(channel));
  await backlog.start();
  channels?.onShards((codes) => {
    backlog.addShards(codes).catch((error: unknown) => log.warn({ err: error }, 'could not set a shard backlog'));
  });
  const router = new TaskRouter(subscriber, publish, store, keys, log, metrics, {
    gatewayId,
    progressIntervalMs: options.progressIntervalMs,
    backlog,
    ...(channels === undefined ? {} : { channels }),
  });
  undo.push(() => router.close());
  await router.start();
  const webhooks = startWebhooks(options, store.runner, metrics, log, gatewayId, undo);
  const service = new TaskService(store, catalog, dispatcher, router, metrics, log, {
    gatewayId,
    defaultTtlMs: options.defaultTtlMs,
    maxTtlMs: options.maxTtlMs,
    pollIntervalMs: options.pollIntervalMs,
    maxToolTimeoutMs: options.maxToolTimeoutMs,
    queueTimeoutMs: options.queueTimeoutMs,
    checkAnswer: (request, raw) => checkAnswer(request, raw, jsonSchemas),
    webhooks: webhooks.intake,
    // Per-principal caps need principals told apart: with auth off every caller is the one loopback user.
    ...(w.authEnabled ? { openTasks: new OpenTaskLimit(store.runner, options.maxOpenTasks, indexTtlMs) } : {}),
  });
  // In the sharded layout the operators' search reads every placed shard's index (PROTOCOL.md §30.2).
  const search = new TaskSearch(store.runner);
  const reaper = new Reaper(store, log, metrics, {
    holder: gatewayId,
    intervalMs: options.reaperIntervalMs,
    // An id older than any retention or ttl could keep is checked for a task that is gone (PROTOCOL.md §30.2).
    pruneIndex: () => search.prune(Date.now() - keptMs),
  });
  reaper.start();
  undo.push(() => reaper.stop());
  const replay = new TaskReplay(store, search, service, log);
  // One key for every gateway and worker: a worker seals a waitpoint's token, any gateway opens it (PROTOCOL.md §32).
  const tokens = await WaitpointTokens.create({ secret: options.waitpointSecret, redis, keys });
  const waitpoints = new WaitpointCallbacks(tokens, store.waitpoints, dispatcher, log);
  const schedules = await startSchedules(options, w.connections, keys, store, service, webhooks.intake, log, undo);
  // Task output as resources (PROTOCOL.md §34): wake-ups on the subscriber; stored values read in ranges over a
  // large-read connection, so a 16 MiB value's chunks never queue on the command connection.
  const feed = new ResourceFeed(subscriber, keys, log, channels);
  undo.push(() => feed.close());
  await feed.start();
  const objects = options.blobStore.kind === 's3' ? new BlobObjects(options.blobStore) : undefined;
  if (objects) undo.push(() => objects.close());
  const largeReads = w.connections.largeReads[0];
  const outputs = new TaskOutputStore(
    largeReads ? new StoreRunner(largeReads, keys) : store.runner,
    undefined,
    objects,
  );
  const resources = new TaskResources(outputs, feed);
  return {
    admin,
    dispatcher,
    router,
    webhooks,
    service,
    search,
    reaper,
    replay,
    store,
    schedules,
    waitpoints,
    resources,
  };
}

/**
 * Schedules (PROTOCOL.md §33.2): the file's, set as the gateway starts (a bad file or entry stops it with one line),
 * then this gateway's share of the firings.
 */
async function startSchedules(
  options: GatewayConfig,
  connections: Connections,
  keys: Keys,
  store: TaskStore,
  service: TaskService,
  intake: WebhookIntake,
  log: Logger,
  undo: Undo,
): Promise<Schedules> {
  const fromFile = options.schedulesFile === undefined ? [] : await readSchedulesFile(options.schedulesFile);
  const schedules = new Schedules(connections.redis, connections.queueRedis, keys, store.records, service, log, {
    redisUrl: requireRedisUrl(options),
    webhooks: intake,
  });
  undo.push(() => schedules.close());
  for (const { spec, principal } of fromFile) {
    await schedules.upsert(spec, principal, 'file').catch((error: unknown) => {
      throw new ConfigError(
        `Invalid TASKRELAY_SCHEDULES_FILE ${options.schedulesFile ?? ''}: schedule ${spec.id}: ${oneLine(error)}`,
      );
    });
  }
  await schedules.start();
  return schedules;
}

/**
 * The task store, on the command connection (large results on their own, PROTOCOL.md §22.5), with how long ended
 * tasks and the principals' indexes are kept; the scripts' generation and the retention per status announced.
 */
async function openStore(options: GatewayConfig, connections: Connections, keys: Keys, log: Logger) {
  // The longest an ended task is kept: its ttl, or its status' retention (PROTOCOL.md §30.1).
  const keptMs = Math.max(
    options.maxTtlMs,
    options.retainCompletedMs ?? 0,
    options.retainFailedMs ?? 0,
    options.retainCancelledMs ?? 0,
  );
  // A principal's index outlives every task in it: the longest keep after the longest run.
  const indexTtlMs = keptMs + options.queueTimeoutMs + options.maxToolTimeoutMs;
  const store = new TaskStore(connections.redis, keys, {
    reaperIntervalMs: options.reaperIntervalMs,
    indexTtlMs,
    largeReads: {
      connections: connections.largeReads,
      inlineMaxBytes: LARGE_RESULT_BYTES,
      perPrincipal: options.maxLargeReadsPerPrincipal,
    },
  });
  // Workers in other languages check that they run the scripts of this deployment (PROTOCOL.md §29.2).
  const scriptsGeneration = await store.announceScriptsGeneration();
  log.debug({ scriptsGeneration }, 'task-store scripts generation announced');
  await store.records.setRetention({
    completed: options.retainCompletedMs,
    failed: options.retainFailedMs,
    cancelled: options.retainCancelledMs,
  });
  return { store, keptMs, indexTtlMs };
}

type Connections = Awaited<ReturnType<typeof openConnections>>;

/**
 * The gateway's Redis connections, each up before the gateway goes on, with their metrics. Commands fail fast while
 * Redis is away (a JSON-RPC error within ~2 s, never a hung request); the subscriber waits it out. BullMQ gets a
 * connection of its own, so its scripts and traffic stay off the command connection.
 */
async function openConnections(redisUrl: string, undo: Undo, log: Logger, sharded: boolean) {
  const redis = createRedis(redisUrl, FAIL_FAST_REDIS_OPTIONS);
  const queueRedis = createRedis(redisUrl, FAIL_FAST_REDIS_OPTIONS);
  // In the sharded layout a Cluster's subscriber keeps one connection per master for `SSUBSCRIBE` (§1.2).
  const subscriber = createRedis(redisUrl, { shardedSubscribers: sharded });
  // Large results are read over connections of their own (PROTOCOL.md §22.5), so a 16 MiB reply never holds the one
  // every other command waits on; they get longer than the fail-fast bound to arrive.
  const largeReads = Array.from({ length: LARGE_READ_CONNECTIONS }, () =>
    createRedis(redisUrl, { ...FAIL_FAST_REDIS_OPTIONS, commandTimeout: LARGE_READ_TIMEOUT_MS }),
  );
  const connections = {
    redis,
    queue: queueRedis,
    subscriber,
    ...Object.fromEntries(largeReads.map((client, i) => [`largeRead${i}`, client])),
  };
  undo.push(() => {
    for (const client of Object.values(connections)) client.disconnect();
  });
  // Until every connection is up, connection errors belong to the one-line startup error, not to the log.
  const quiet = () => undefined;
  for (const client of Object.values(connections)) client.on('error', quiet);
  await Promise.all(Object.values(connections).map((client) => waitForRedis(client)));
  const metrics = new GatewayMetrics();
  for (const [connection, client] of Object.entries(connections)) {
    client.off('error', quiet);
    metrics.watchRedis(client, connection, log);
  }
  return { redis, queueRedis, subscriber, largeReads, metrics };
}

/**
 * Completion webhooks (PROTOCOL.md §27): checked at creation, delivered from the outbox by every gateway that can sign
 * (one without the secret refuses webhooks and leaves the outbox to the others).
 */
function startWebhooks(
  options: GatewayConfig,
  runner: StoreRunner,
  metrics: GatewayMetrics,
  log: Logger,
  gatewayId: string,
  undo: Undo,
) {
  const webhookPolicy = new WebhookPolicy({
    secretSet: options.webhooks.secret !== undefined,
    allowedHosts: options.webhooks.allowedHosts,
  });
  // Over the task store's runner: in the sharded layout, every placed shard's outbox (PROTOCOL.md §1.1).
  const outbox = new WebhookOutbox(runner);
  metrics.watchWebhooks(() => outbox.counts());
  const intake = new WebhookIntake(webhookPolicy, outbox, options.webhooks.maxPendingPerPrincipal);
  let stopDeliverer: () => Promise<void> = () => Promise.resolve();
  if (options.webhooks.secret !== undefined) {
    const deliverer = new WebhookDeliverer(
      outbox,
      webhookPolicy,
      new WebhookSigner(options.webhooks.secret),
      metrics,
      log,
      { ...options.webhooks, gatewayId, userAgent: `taskrelay-gateway/${GATEWAY_VERSION} (webhooks)` },
    );
    deliverer.start();
    undo.push(() => deliverer.stop());
    stopDeliverer = () => deliverer.stop();
  }
  return { outbox, intake, stopDeliverer: () => stopDeliverer() };
}

/** Longer than the idle timeouts of common clients and load balancers (60 s), so the server is not the one closing. */
const KEEP_ALIVE_TIMEOUT_MS = 65_000;

function listen(front: HttpFront, host: string, port: number): Promise<HttpServer> {
  return new Promise((resolve, reject) => {
    const server = createServer(front.options, front.listener);
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve(server);
    });
    // Node closes an idle keep-alive connection after 5 s, racing clients that reuse it at that moment (ECONNRESET
    // on their next request, seen in the soak). Keep idle connections longer than clients and proxies usually do.
    server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS;
    server.headersTimeout = KEEP_ALIVE_TIMEOUT_MS + 1_000;
  });
}

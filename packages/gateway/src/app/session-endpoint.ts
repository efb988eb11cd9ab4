/**
 * The 2025-era session side of /mcp (PROTOCOL.md §9, §16): opening a session on `initialize` (within the principal's
 * cap and the memory budget), finding the session of a request, and its GET stream and DELETE.
 */
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { Request, Response } from 'express';
import {
  SUPPORTED_PROTOCOL_VERSIONS,
  isInitializeRequest,
  type JSONRPCMessage,
  type JSONRPCRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC, type GatewayConfig, type Logger } from '@taskrelay/shared';
import { jsonRpcError } from '../http/http-guards.js';
import { writeStreamedRead } from '../http/resource-body.js';
import { sanitizeOutgoing } from '../http/safe-errors.js';
import { toWireErrorObject } from '../wire/errors.js';
import type { StreamBuffers } from '../http/stream-buffers.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { McpMethods } from '../protocol/methods.js';
import type { TaskRouter } from '../tasks/task-router.js';
import type { TaskService } from '../tasks/task-service.js';
import { SessionEventStore } from '../transports/session/event-store.js';
import { answersAtOnce, createSessionServer } from '../transports/session/mcp-session.js';
import { SessionTransport } from '../transports/session/session-transport.js';
import { MODERN_PROTOCOL_VERSION } from '../transports/sessionless/modern-endpoint.js';
import { SESSION_COST_BYTES, type MemoryBudget } from './memory-budget.js';
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
export const SESSION_PROTOCOL_VERSIONS: ReadonlySet<string> = new Set(SUPPORTED_PROTOCOL_VERSIONS);

export type AuthedRequest = Request & { auth?: { clientId: string } };

export interface SessionEndpointDeps {
  options: GatewayConfig;
  log: Logger;
  metrics: GatewayMetrics;
  sessions: SessionRegistry;
  router: TaskRouter;
  service: TaskService;
  methods: McpMethods;
  budget: MemoryBudget;
  onEventsResized: (delta: number) => void;
  /** Every SSE stream's bound and its counters (PROTOCOL.md §22.1). */
  streams: {
    buffers: StreamBuffers;
    maxBufferedBytes: number;
    onOverflow: () => void;
    onCoalesced: () => void;
  };
  principalOf: (req: AuthedRequest) => string;
  authEnabled: boolean;
  version: string;
  /** Aborted when the drain starts: pending `tasks/result` waits end. */
  drainSignal: AbortSignal;
}

export function createSessionEndpoint(deps: SessionEndpointDeps) {
  const { options, log, metrics, sessions, router, service, methods, budget, onEventsResized, principalOf } = deps;
  const { authEnabled, streams: streamBounds } = deps;
  const buffers = streamBounds.buffers;
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
      streamedRead: (request, res, headers) =>
        streamedRead(methods, log, { request, res, headers, principal, sessionId }),
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
  return { sessionOf, openSession, sessionRequest };
}

/** A session's `resources/read` of a stored value, written as it is read (PROTOCOL.md §34.3); undefined: not one. */
function streamedRead(
  methods: McpMethods,
  log: Logger,
  r: {
    request: JSONRPCRequest;
    res: ServerResponse;
    headers: Record<string, string>;
    principal: string;
    sessionId: string;
  },
): Promise<void> | undefined {
  const { request, res, headers, principal, sessionId } = r;
  const uri = request.params?.['uri'];
  if (!methods.streamsRead(uri)) return undefined;
  const answer = (message: JSONRPCMessage) => {
    res.writeHead(200, { ...headers, 'Content-Type': 'application/json' });
    res.end(JSON.stringify(sanitizeOutgoing(message, log, sessionId)));
  };
  return (async () => {
    try {
      const read = await methods.readResource({ principal, era: '2025-11-25' }, uri);
      if (read.kind === 'stream') await writeStreamedRead(res, request.id, read.value, {}, headers);
      else answer({ jsonrpc: '2.0', id: request.id, result: read.result });
    } catch (error) {
      if (res.headersSent) return;
      answer({
        jsonrpc: '2.0',
        id: request.id,
        error: toWireErrorObject(error),
      });
    }
  })();
}

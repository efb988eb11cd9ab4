/**
 * Per-principal limits (the MCP tasks specification, security considerations: rate limits on task operations, a cap on concurrent tasks, a maximum ttl):
 * request rates counted in Redis with `rate-limiter-flexible` so they hold across gateways, and the size checks on what a request carries. Sessions per principal are counted by the gateway that holds them.
 */
import type { Request, Response, NextFunction, RequestHandler } from 'express';
import { JSON_RPC, type RedisClient, type Keys, type Logger } from '@taskrelay/shared';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { jsonBytes } from '../wire/result-cap.js';
import { jsonRpcError } from './http-guards.js';

export interface RequestLimitsOptions {
  /** `tools/call` requests per principal per window; 0 = no limit. */
  callsPerWindow: number;
  /** `tasks/*` requests per principal per window; 0 = no limit. */
  taskOpsPerWindow: number;
  windowMs: number;
  maxArgumentBytes: number;
  maxProgressTokenBytes: number;
}

type Message = { method?: unknown; id?: unknown; params?: unknown };

/** The rate limit and size checks on a parsed /mcp POST body, before the SDK sees it. */
export class RequestLimits {
  private readonly calls: RateLimiterRedis | undefined;
  private readonly taskOps: RateLimiterRedis | undefined;

  constructor(
    redis: RedisClient,
    keys: Keys,
    private readonly log: Logger,
    private readonly options: RequestLimitsOptions,
  ) {
    this.calls = limiter(redis, keys.rateLimitPrefix('calls'), options.callsPerWindow, options.windowMs);
    this.taskOps = limiter(redis, keys.rateLimitPrefix('task-ops'), options.taskOpsPerWindow, options.windowMs);
  }

  /** Express middleware for POST /mcp, after authentication and body parsing. */
  middleware(principalOf: (req: Request) => string): RequestHandler {
    return (req: Request, res: Response, next: NextFunction) => {
      const body: unknown = req.body;
      const messages: unknown[] = Array.isArray(body) ? body : [body];
      if (messages.length === 0)
        return jsonRpcError(res, 400, JSON_RPC.INVALID_REQUEST, 'Invalid Request: empty batch');
      let calls = 0;
      let taskOps = 0;
      for (const m of messages) {
        if (typeof m !== 'object' || m === null || Array.isArray(m)) {
          return jsonRpcError(res, 400, JSON_RPC.INVALID_REQUEST, 'Invalid Request: not a JSON-RPC message object');
        }
        const msg = m as Message;
        const id = typeof msg.id === 'string' || typeof msg.id === 'number' ? msg.id : null;
        const problem = this.sizeProblem(msg);
        if (problem) return jsonRpcError(res, problem.status, JSON_RPC.INVALID_PARAMS, problem.message, id);
        if (msg.method === 'tools/call') calls++;
        // Opening a listen stream is a task op too (PROTOCOL.md §18.3): each one follows up to 100 tasks.
        else if (
          typeof msg.method === 'string' &&
          (msg.method.startsWith('tasks/') || msg.method === 'subscriptions/listen')
        )
          taskOps++;
      }
      // Without limiters (authentication off) there is nothing to count: no promise hop on the request path.
      if ((calls === 0 && taskOps === 0) || (!this.calls && !this.taskOps)) return next();
      const principal = principalOf(req);
      void Promise.all([consume(this.calls, principal, calls), consume(this.taskOps, principal, taskOps)]).then(
        ([a, b]) => {
          const retryMs = Math.max(a ?? 0, b ?? 0);
          if (retryMs === 0) return next();
          this.log.info({ principal, calls, taskOps }, 'rate limit reached');
          res.setHeader('Retry-After', String(Math.max(1, Math.ceil(retryMs / 1000))));
          jsonRpcError(
            res,
            429,
            JSON_RPC.INVALID_REQUEST,
            `Too many requests: rate limit for this principal reached; retry after ${Math.ceil(retryMs / 1000)} s`,
          );
        },
        next,
      );
    };
  }

  private sizeProblem(msg: Message): { status: number; message: string } | undefined {
    const params = msg.params;
    if (typeof params !== 'object' || params === null) return undefined;
    const { arguments: args, _meta: meta } = params as { arguments?: unknown; _meta?: unknown };
    const token =
      typeof meta === 'object' && meta !== null ? (meta as { progressToken?: unknown }).progressToken : undefined;
    if (token !== undefined && jsonBytes(token) > this.options.maxProgressTokenBytes) {
      return {
        status: 400,
        message: `Invalid params: _meta.progressToken is longer than ${this.options.maxProgressTokenBytes} bytes`,
      };
    }
    if (msg.method === 'tools/call' && args !== undefined && jsonBytes(args) > this.options.maxArgumentBytes) {
      return {
        status: 413,
        message: `Invalid params: arguments are larger than ${this.options.maxArgumentBytes} bytes`,
      };
    }
    return undefined;
  }
}

function limiter(
  redis: RedisClient,
  keyPrefix: string,
  points: number,
  windowMs: number,
): RateLimiterRedis | undefined {
  if (points === 0) return undefined;
  const duration = Math.max(1, Math.round(windowMs / 1000));
  return new RateLimiterRedis({
    storeClient: redis,
    keyPrefix,
    points,
    duration,
    // While Redis is away each gateway counts alone, rather than letting everything through or failing requests.
    insuranceLimiter: new RateLimiterMemory({ keyPrefix, points, duration }),
  });
}

/** ms until the principal may retry, 0 when the points were granted. */
async function consume(rl: RateLimiterRedis | undefined, key: string, points: number): Promise<number> {
  if (!rl || points === 0) return 0;
  try {
    await rl.consume(key, points);
    return 0;
  } catch (rejection) {
    if (rejection instanceof RateLimiterRes) return Math.max(1, rejection.msBeforeNext);
    throw rejection;
  }
}

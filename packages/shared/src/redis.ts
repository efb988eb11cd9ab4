import { Redis, type RedisOptions } from 'ioredis';
import { TaskrelayError } from './errors.js';

export { Redis } from 'ioredis';

/**
 * Creates an ioredis client from a URL. `maxRetriesPerRequest: null` is what BullMQ needs for blocking connections
 * and lets commands wait through a reconnect instead of failing.
 */
export function createRedis(url: string, options: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, enableReadyCheck: true, ...options });
}

/**
 * Options for a connection whose callers must never hang while Redis is away (the gateway's command connections): a
 * command queued during a reconnect fails after one retry, and no command waits longer than `commandTimeout` for its
 * reply (a host that vanished without closing the socket), so a request gets a clear error within ~2 s. Reconnects
 * back off to at most 1 s, so service resumes within a second of Redis returning. Not for blocking commands or
 * subscribers.
 */
export const FAIL_FAST_REDIS_OPTIONS = {
  maxRetriesPerRequest: 1,
  commandTimeout: 2_000,
  retryStrategy: (times: number) => Math.min(times * 50, 1_000),
} as const satisfies RedisOptions;

const UNAVAILABLE_ERRNOS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
]);

const UNAVAILABLE_MESSAGES = [
  /^Command timed out/, // commandTimeout
  /^Connection is closed/, // ioredis and BullMQ, after a disconnect or once reconnecting gave up
  /^Stream isn't writeable/, // enableOfflineQueue: false
  /^Reached the max retries per request limit/, // MaxRetriesPerRequestError
  /^(LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN) /, // a server that is up but cannot serve yet
];

/**
 * True when `error` (or any error in its `cause` chain, or in an AggregateError) means Redis could not be reached or
 * did not answer, as opposed to an error Redis answered with: what the gateway reports as "task store unavailable".
 */
export function isRedisUnavailableError(error: unknown): boolean {
  const seen = new Set<unknown>();
  const pending: unknown[] = [error];
  while (pending.length > 0 && seen.size < 16) {
    const e = pending.pop();
    if (e === null || typeof e !== 'object' || seen.has(e)) continue;
    seen.add(e);
    if (e instanceof TaskrelayError && e.code === 'REDIS_UNAVAILABLE') return true;
    const { name, code, message, cause, errors } = e as {
      name?: unknown;
      code?: unknown;
      message?: unknown;
      cause?: unknown;
      errors?: unknown;
    };
    if (name === 'MaxRetriesPerRequestError') return true;
    if (typeof code === 'string' && UNAVAILABLE_ERRNOS.has(code)) return true;
    if (typeof message === 'string' && UNAVAILABLE_MESSAGES.some((pattern) => pattern.test(message))) return true;
    pending.push(cause);
    if (Array.isArray(errors)) pending.push(...(errors as unknown[]));
  }
  return false;
}

/**
 * Waits until the client is ready, or fails with one clear line (used at start: an entry point must not hang or print
 * a stack when Redis is unreachable).
 */
export async function waitForRedis(client: Redis, timeoutMs = 5_000): Promise<void> {
  if (client.status === 'ready') return;
  let lastError: unknown;
  const onError = (error: unknown) => {
    lastError = error;
  };
  client.on('error', onError);
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        client.off('ready', onReady);
        const cause = lastError instanceof Error ? `: ${lastError.message}` : '';
        reject(new TaskrelayError('REDIS_UNAVAILABLE', `Redis is unreachable at ${describe(client)}${cause}`));
      }, timeoutMs);
      const onReady = () => {
        clearTimeout(timer);
        resolve();
      };
      client.once('ready', onReady);
    });
  } finally {
    client.off('error', onError);
  }
}

function describe(client: Redis): string {
  const { host, port } = client.options;
  return `${host ?? '127.0.0.1'}:${port ?? 6379}`;
}

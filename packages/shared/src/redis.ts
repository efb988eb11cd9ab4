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

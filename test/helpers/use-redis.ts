/**
 * One Redis for a test file's own use and a client of it: started before the file's tests, stopped after them. The
 * set-up the integration tests of the stores each wrote out before.
 */
import { afterAll, beforeAll } from 'vitest';
import { Redis } from 'ioredis';
import { startRedis, type TestRedis } from './redis.js';

export interface UsedRedis {
  /** The client (set once the file's `beforeAll` ran). */
  readonly redis: Redis;
  readonly server: TestRedis;
}

export function useRedis(): UsedRedis {
  const used = {} as { redis: Redis; server: TestRedis };
  beforeAll(async () => {
    used.server = await startRedis();
    used.redis = new Redis(used.server.url);
  });
  afterAll(async () => {
    used.redis?.disconnect();
    await used.server?.stop();
  });
  return used;
}

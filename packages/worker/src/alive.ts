#!/usr/bin/env node
/**
 * Liveness probe of a worker container (`node dist/alive.js`, bin `taskrelay-worker-alive`; deploy/k8s): exits 1
 * only when Redis answers and no worker of this host has a live heartbeat (worker ids start with the hostname, which
 * is the pod's name), so a wedged worker is restarted. It exits 0 while one does, and also when Redis cannot be
 * reached: a Redis outage is not this container's fault, and restarting every worker would not end it.
 * Reads the same environment as the worker (REDIS_URL / REDIS_CLUSTER_NODES / REDIS_SENTINELS, TASKRELAY_PREFIX).
 */
import { hostname } from 'node:os';
import {
  FAIL_FAST_REDIS_OPTIONS,
  createKeys,
  keyLayoutOf,
  createRedis,
  isRedisUnavailableError,
  loadWorkerConfig,
  requireRedisUrl,
  waitForRedis,
} from '@taskrelay/shared';

const PROBE_TIMEOUT_MS = 3_000;

async function probe(): Promise<number> {
  const config = loadWorkerConfig();
  const keys = createKeys(config.prefix, keyLayoutOf(config.redisUrl, config.prefix, config.keyLayout));
  const redis = createRedis(requireRedisUrl(config), { ...FAIL_FAST_REDIS_OPTIONS, retryStrategy: () => null });
  redis.on('error', () => undefined);
  try {
    await waitForRedis(redis, PROBE_TIMEOUT_MS);
    const live = await redis.zrangebyscore(keys.workers, Date.now(), '+inf');
    const mine = `${hostname()}-`;
    if (live.some((id) => id.startsWith(mine))) return 0;
    process.stderr.write(`taskrelay-worker-alive: no live heartbeat from a worker of ${hostname()}\n`);
    return 1;
  } catch (error) {
    if (isRedisUnavailableError(error)) return 0;
    process.stderr.write(`taskrelay-worker-alive: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  } finally {
    redis.disconnect();
  }
}

process.exitCode = await probe();

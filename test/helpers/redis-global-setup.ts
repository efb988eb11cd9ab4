/**
 * Global setup of the projects that share one Redis per run (integration, e2e, browser, terminal): starts it once
 * (`TEST_REDIS_URL` / `REDIS_URL` if set, else a spawned `redis-server`, else testcontainers) and hands its URL to the
 * test files through `provide`, which `startRedis()` reads with `inject`. Files share the server under their own key
 * prefixes (`uniquePrefix`), so nothing ever flushes it. Suites that kill or restart their Redis ask for their own.
 */
import type { TestProject } from 'vitest/node';
import { startRedisServer } from './redis.js';

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const redis = await startRedisServer();
  project.provide('redisUrl', redis.url);
  return () => redis.stop();
}

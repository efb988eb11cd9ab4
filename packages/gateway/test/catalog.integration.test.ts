import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createKeys, createLogger, toolPool, type ToolDescriptor, type WorkerCatalog } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { ToolCatalog } from '../src/tasks/catalog.js';

let server: TestRedis;
let redis: Redis;
const log = createLogger('test', { level: 'silent' });

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

const descriptor = (name: string, description = name): ToolDescriptor => ({
  name,
  description,
  inputSchema: { type: 'object' },
  taskSupport: 'optional',
});

/** Publishes a worker's catalog as a heartbeat does (PROTOCOL.md §3.1). */
async function heartbeat(
  keys: ReturnType<typeof createKeys>,
  workerId: string,
  tools: ToolDescriptor[],
  at = Date.now(),
) {
  const catalog: WorkerCatalog = {
    workerId,
    queue: toolPool(
      'default',
      tools.map((t) => t.name),
    ),
    tools,
    heartbeatAt: at,
  };
  await redis.set(keys.workerCatalog(workerId), JSON.stringify(catalog), 'PX', 60_000);
  await redis.zadd(keys.workers, Date.now() + 60_000, workerId);
  return catalog.queue;
}

describe('§3.2 the catalog routes each call to a pool that serves its tool', () => {
  it('sends a tool served by one pool only there, and spreads a shared tool over its pools by live workers', async () => {
    const keys = createKeys(uniquePrefix('catalog'));
    const demo = await heartbeat(keys, 'w1', [descriptor('build_report'), descriptor('shared')]);
    const custom = await heartbeat(keys, 'w2', [descriptor('count_to'), descriptor('shared')]);
    await heartbeat(keys, 'w3', [descriptor('count_to'), descriptor('shared', 'newer')], Date.now() + 1);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 60_000 });

    for (let i = 0; i < 50; i++) {
      expect((await catalog.find('build_report'))?.queue).toBe(demo);
      expect((await catalog.find('count_to'))?.queue).toBe(custom);
    }
    const picks = new Map<string, number>();
    for (let i = 0; i < 600; i++) {
      const queue = (await catalog.find('shared'))?.queue ?? '';
      picks.set(queue, (picks.get(queue) ?? 0) + 1);
    }
    expect([...picks.keys()].sort()).toEqual([demo, custom].sort());
    // Two of the three live workers serving it are in the custom pool.
    expect(picks.get(custom) ?? 0).toBeGreaterThan(picks.get(demo) ?? 0);
    // The newest heartbeat's descriptor is listed.
    expect((await catalog.list()).find((t) => t.name === 'shared')?.description).toBe('newer');
    expect(await catalog.find('missing')).toBeUndefined();
  });

  it('says why a queued task waits when its pool has no live worker, and nothing while one lives', async () => {
    const keys = createKeys(uniquePrefix('catalog'));
    const pool = await heartbeat(keys, 'w1', [descriptor('echo')]);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0 });
    expect(await catalog.unservedReason('echo', pool)).toBeUndefined();
    expect(await catalog.unservedReason('echo', 'default.000000000000')).toMatch(
      /no live worker consumes pool default\.000000000000.*served by another pool/,
    );
    await redis.zrem(keys.workers, 'w1');
    expect(await catalog.unservedReason('echo', pool)).toMatch(/no live worker serves tool echo/);
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import {
  TaskStore,
  createKeys,
  createLogger,
  toolPool,
  toolQueue,
  type PoolCatalog,
  type ToolDescriptor,
  type WorkerCatalog,
} from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { ToolCatalog, retirePool, type ToolVersion } from '../src/tasks/catalog.js';

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

/** Publishes a worker's catalog as a heartbeat does (PROTOCOL.md §3.1, §24). */
async function heartbeat(
  keys: ReturnType<typeof createKeys>,
  workerId: string,
  tools: ToolDescriptor[],
  at = Date.now(),
  queueName = 'default',
) {
  const catalog: WorkerCatalog = {
    workerId,
    queue: toolPool(
      queueName,
      tools.map((t) => t.name),
    ),
    queueName,
    tools,
    heartbeatAt: at,
  };
  await redis.set(keys.workerCatalog(workerId), JSON.stringify(catalog), 'PX', 60_000);
  await redis.zadd(keys.workers, Date.now() + 60_000, workerId);
  const pool: PoolCatalog = { pool: catalog.queue, queueName, tools, lastSeenAt: at };
  await redis.hset(keys.pools, catalog.queue, JSON.stringify(pool));
  return catalog.queue;
}

describe('§3.2 the catalog routes each call to the queue of its tool', () => {
  it('sends every call of a tool to its one queue, whichever tool sets serve it; TASKRELAY_QUEUE splits by workers', async () => {
    const keys = createKeys(uniquePrefix('catalog'));
    await heartbeat(keys, 'w1', [descriptor('build_report'), descriptor('shared')]);
    await heartbeat(keys, 'w2', [descriptor('count_to'), descriptor('shared')]);
    // Clearly the newest heartbeat, and clearly an older one, however slowly these lines run.
    await heartbeat(keys, 'w3', [descriptor('count_to'), descriptor('shared', 'newer')], Date.now() + 60_000);
    await heartbeat(keys, 'w4', [descriptor('shared')], Date.now() - 60_000, 'team');
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 60_000 });

    for (let i = 0; i < 50; i++) {
      expect((await catalog.find('build_report'))?.queue).toBe(toolQueue('default', 'build_report'));
      expect((await catalog.find('count_to'))?.queue).toBe(toolQueue('default', 'count_to'));
    }
    const picks = new Map<string, number>();
    for (let i = 0; i < 800; i++) {
      const queue = (await catalog.find('shared'))?.queue ?? '';
      picks.set(queue, (picks.get(queue) ?? 0) + 1);
    }
    // Two tool sets, one queue: the three `default` workers; the `team` worker has a queue of its own.
    expect([...picks.keys()].sort()).toEqual([toolQueue('default', 'shared'), toolQueue('team', 'shared')].sort());
    expect(picks.get(toolQueue('default', 'shared')) ?? 0).toBeGreaterThan(picks.get(toolQueue('team', 'shared')) ?? 0);
    // The newest heartbeat's descriptor is listed.
    expect((await catalog.list()).find((t) => t.name === 'shared')?.description).toBe('newer');
    expect(await catalog.find('missing')).toBeUndefined();
  });

  it('finds a tool whose worker started after the cached read, while the cache still lists what it read', async () => {
    const keys = createKeys(uniquePrefix('catalog'));
    await heartbeat(keys, 'w1', [descriptor('echo')]);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 60_000 });
    expect(await catalog.find('echo')).toBeDefined();
    expect(await catalog.find('later')).toBeUndefined();
    // A worker serving `later` starts: a call for it is served at once, not a cache period later.
    await heartbeat(keys, 'w2', [descriptor('later')]);
    await new Promise((resolve) => setTimeout(resolve, 60));
    expect((await catalog.find('later'))?.queue).toBe(toolQueue('default', 'later'));
    // A hit is still answered from the cache: a tool its worker no longer serves stays until the cache expires.
    await redis.del(keys.workerCatalog('w1'));
    await redis.zrem(keys.workers, 'w1');
    await redis.hdel(keys.pools, toolPool('default', ['echo']));
    expect(await catalog.find('echo')).toBeDefined();
  });

  it('says why a queued task waits when no live worker consumes its queue, and nothing while one does', async () => {
    const keys = createKeys(uniquePrefix('catalog'));
    await heartbeat(keys, 'w1', [descriptor('echo')]);
    const queue = toolQueue('default', 'echo');
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0 });
    expect(await catalog.unservedReason('echo', queue)).toBeUndefined();
    expect(await catalog.unservedReason('echo', toolQueue('team', 'echo'))).toMatch(
      /no live worker consumes queue team~echo.*served under another TASKRELAY_QUEUE/,
    );
    await redis.zrem(keys.workers, 'w1');
    expect(await catalog.unservedReason('echo', queue)).toMatch(/no live worker serves tool echo/);
  });
});

/** A pool's remembered catalog, as a heartbeat writes it beside the worker's own (PROTOCOL.md §24). */
async function remember(
  keys: ReturnType<typeof createKeys>,
  tools: ToolDescriptor[],
  lastSeenAt: number,
  queueName = 'default',
) {
  // As a worker names its pool: its tools at their versions (§24.9).
  const pool = toolPool(
    queueName,
    tools.map((t) => ({ name: t.name, ...(t.version === undefined ? {} : { version: t.version }) })),
  );
  const record: PoolCatalog = { pool, queueName, tools, lastSeenAt };
  await redis.hset(keys.pools, pool, JSON.stringify(record));
  return pool;
}

describe('§24 catalog retention: a pool scaled to zero keeps its tools listed', () => {
  it('lists the tools of a pool whose last worker left within the retention, routed to that pool', async () => {
    const keys = createKeys(uniquePrefix('retain'));
    const pool = await remember(keys, [descriptor('build_report')], Date.now() - 60_000);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0, retentionMs: 3_600_000 });
    expect((await catalog.list()).map((t) => t.name)).toEqual(['build_report']);
    expect(pool).toMatch(/^default\./);
    const queue = toolQueue('default', 'build_report');
    expect((await catalog.find('build_report'))?.queue).toBe(queue);
    expect(await catalog.unservedReason('build_report', queue)).toMatch(/no live worker serves tool build_report/);
  });

  it('forgets a pool past the retention, and with a retention of 0 at once', async () => {
    const keys = createKeys(uniquePrefix('retain'));
    await remember(keys, [descriptor('old_tool')], Date.now() - 7_200_000);
    await remember(keys, [descriptor('recent_tool')], Date.now() - 1_000);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0, retentionMs: 3_600_000 });
    expect((await catalog.list()).map((t) => t.name)).toEqual(['recent_tool']);
    expect(await catalog.find('old_tool')).toBeUndefined();
    // The gateway deletes what is past the retention.
    await waitFor(async () => (await redis.hlen(keys.pools)) === 1, { timeoutMs: 5_000 });
    const none = new ToolCatalog(redis, keys, log, { cacheMs: 0, retentionMs: 0 });
    expect(await none.list()).toEqual([]);
  });

  it('drops a tool a newer pool of the same queue name no longer serves, but keeps a separate tool set', async () => {
    const keys = createKeys(uniquePrefix('retain'));
    const now = Date.now();
    // A deploy went from {build_report, dropped} to {build_report}; then the new pool scaled to zero too.
    await remember(keys, [descriptor('build_report'), descriptor('dropped')], now - 120_000);
    const current = await remember(keys, [descriptor('build_report')], now - 60_000);
    // Another service on the same queue name with its own tools, scaled to zero earlier still.
    const other = await remember(keys, [descriptor('count_to')], now - 600_000);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0, retentionMs: 3_600_000 });
    expect((await catalog.list()).map((t) => t.name).sort()).toEqual(['build_report', 'count_to']);
    // A remembered pool's calls go to its tools' queues (§3.2).
    expect(current).not.toBe(other);
    expect((await catalog.find('build_report'))?.queue).toBe(toolQueue('default', 'build_report'));
    expect((await catalog.find('count_to'))?.queue).toBe(toolQueue('default', 'count_to'));
  });

  it('prefers a live worker over a remembered pool, and a retired pool is forgotten at once', async () => {
    const keys = createKeys(uniquePrefix('retain'));
    const gone = await remember(keys, [descriptor('build_report'), descriptor('only_remembered')], Date.now() - 1_000);
    const live = await heartbeat(keys, 'w1', [descriptor('build_report')]);
    const catalog = new ToolCatalog(redis, keys, log, { cacheMs: 0, retentionMs: 3_600_000 });
    expect((await catalog.find('build_report'))?.queue).toBe(toolQueue('default', 'build_report'));
    // Superseded by the live pool of the same queue name that shares build_report.
    expect(await catalog.find('only_remembered')).toBeUndefined();

    const separate = await remember(keys, [descriptor('count_to')], Date.now() - 1_000, 'gpu');
    expect((await catalog.find('count_to'))?.queue).toBe(toolQueue('gpu', 'count_to'));
    expect(await retirePool(redis, keys, live)).toBe('live');
    expect(await retirePool(redis, keys, separate)).toBe('retired');
    expect(await retirePool(redis, keys, separate)).toBe('unknown');
    expect(await catalog.find('count_to')).toBeUndefined();
    expect(gone).not.toBe(live);
  });
});

describe('§24.9 a pool is kept while live tasks last ran its tool versions', () => {
  const versioned = (name: string, version: string): ToolDescriptor => ({ ...descriptor(name), version });

  /** A live task that last ran `tool` at `version`, as `startRun` leaves it (two fields are what the read needs). */
  async function liveTask(keys: ReturnType<typeof createKeys>, taskId: string, tool: string, version: string) {
    await redis.hset(keys.task(taskId), { taskId, tool, toolVersion: version, status: 'input_required' });
    await redis.zadd(keys.live, Date.now(), taskId);
  }

  it('reads the versions live tasks last ran through the store, each pair once', async () => {
    const keys = createKeys(uniquePrefix('versions'));
    await liveTask(keys, 't1', 'x', 'v1');
    await liveTask(keys, 't2', 'x', 'v1');
    await liveTask(keys, 't3', 'y', 'v7');
    const store = new TaskStore(redis, keys);
    expect((await store.records.liveToolVersions(100)).sort((a, b) => a.tool.localeCompare(b.tool))).toEqual([
      { tool: 'x', version: 'v1' },
      { tool: 'y', version: 'v7' },
    ]);
  });

  it('a deploy of a new version supersedes the old pool, unless tasks that last ran the old version wait', async () => {
    const keys = createKeys(uniquePrefix('versions'));
    const now = Date.now();
    // Build 1 served {x@v1, gone@v1}; build 2 serves {x@v2} and has scaled to zero too.
    const old = await remember(keys, [versioned('x', 'v1'), versioned('gone', 'v1')], now - 7_200_000);
    await remember(keys, [versioned('x', 'v2')], now - 1_000);
    expect(old).not.toBe(toolPool('default', ['x', 'gone']));

    let inUse: ToolVersion[] = [{ tool: 'x', version: 'v1' }];
    const keeping = new ToolCatalog(redis, keys, log, {
      cacheMs: 0,
      retentionMs: 3_600_000,
      versionsInUse: () => Promise.resolve(inUse),
    });
    // The newer pool still wins x; the kept pool lists only the version in use, not the tool build 2 dropped.
    expect((await keeping.list()).map((t) => [t.name, t.version])).toEqual([['x', 'v2']]);
    // Past its retention, build 1's pool is not deleted while a task that last ran x v1 waits.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await redis.hexists(keys.pools, old)).toBe(1);
    expect(await retirePool(redis, keys, old, { inUse })).toBe('kept');

    // With build 2 gone too, x v1 stays listed for its waiting task, though build 1 is past its retention.
    await redis.hdel(keys.pools, toolPool('default', [{ name: 'x', version: 'v2' }]));
    expect((await keeping.list()).map((t) => [t.name, t.version])).toEqual([['x', 'v1']]);

    // Once no live task last ran it, the next housekeeping round forgets the pool.
    inUse = [];
    const next = new ToolCatalog(redis, keys, log, {
      cacheMs: 0,
      retentionMs: 3_600_000,
      versionsInUse: () => Promise.resolve(inUse),
    });
    expect(await next.list()).toEqual([]);
    await waitFor(async () => (await redis.hexists(keys.pools, old)) === 0, { timeoutMs: 5_000 });
  });

  it('retires a kept pool when forced', async () => {
    const keys = createKeys(uniquePrefix('versions'));
    const old = await remember(keys, [versioned('x', 'v1')], Date.now() - 1_000);
    const inUse = [{ tool: 'x', version: 'v1' }];
    expect(await retirePool(redis, keys, old, { inUse })).toBe('kept');
    expect(await retirePool(redis, keys, old, { inUse, force: true })).toBe('retired');
  });
});

/**
 * Fault suite, PROTOCOL.md §1.2 and §22.4 (issue 48 F4) on the sharded layout of a 3-master Redis Cluster: a gateway
 * has one subscriber connection per master (ioredis `shardedSubscribers`), and each master's pub/sub output limit is
 * per connection. The scripts charge the backlog hash of the task's shard, so the gateway keeps one per shard it
 * subscribes to, with `max` = its budget ÷ its shards on that master: what waits for it on one master stays within
 * the budget. 10 calls of a tool with six shards (two per master) log 200 messages of 60 KB each while the gateway is
 * stopped for 2 s: no subscriber connection is cut, every call completes, and the callers hear how many were dropped.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { Cluster } from 'ioredis';
import { createKeys, masterOfSlot, slotOfCode } from '@taskrelay/shared';
import { clusterMasters, type TestCluster } from '../helpers/redis-cluster.js';
import { useStack } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT, type GatewayProcess } from '../helpers/processes.js';

const TOOLS = `${ROOT}/test/fixtures/shard-flood-tools.mjs`;
/** `pubsub 2mb 512kb 10`: a budget of 256 KiB per subscriber connection (half the soft limit). */
const LIMIT = 'pubsub 2mb 512kb 10';
const BUDGET = 256 * 1024;

// No braces: the sharded layout.
const stack = useStack({
  name: 'f-shard-backlog',
  cluster: { braces: false },
  env: { TASKRELAY_TOOLS: TOOLS, TASKRELAY_PROGRESS_INTERVAL_MS: '0' },
  workers: [{ WORKER_CONCURRENCY: '10' }],
  hookTimeoutMs: 120_000,
});
let cluster: TestCluster;
let prefix: string;
let gateway: GatewayProcess;
let client: Client;
let redis: Cluster;

beforeAll(async () => {
  ({ cluster, prefix, gateway } = stack);
  redis = new Cluster(cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
  for (const port of cluster.ports) await cluster.node(port).config('SET', 'client-output-buffer-limit', LIMIT);
  client = await stack.client();
  await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'shard_flood'), {
    message: 'the tool never reached the gateway',
  });
});

afterAll(() => redis?.disconnect());

/** The ids of every sharded-subscriber connection, on every master: a cut one comes back with a new id. */
async function shardSubscriberIds(): Promise<string[]> {
  const ids: string[] = [];
  for (const port of cluster.ports) {
    const list = String(await cluster.node(port).call('CLIENT', 'LIST', 'TYPE', 'pubsub'));
    for (const line of list.split('\n')) {
      if (/\bname=\S*ssubscriber/.test(line)) ids.push(`${port}:${/\bid=(\d+)/.exec(line)?.[1] ?? '?'}`);
    }
  }
  return ids.sort();
}

/** Task hashes whose run started (`attempt` set), on every master. */
async function runningTasks(): Promise<number> {
  let n = 0;
  for (const port of cluster.ports) {
    const node = cluster.node(port);
    for (const key of await node.keys(`${prefix}:{*}:task:*`)) if ((await node.hget(key, 'attempt')) !== null) n++;
  }
  return n;
}

describe("the gateway's sharded subscribers (PROTOCOL.md §1.2, §22.4)", () => {
  it('keeps one backlog hash per shard, the budget split over the shards of each master', async () => {
    const keys = createKeys(prefix, 'sharded');
    const registry = Object.values(await redis.hgetall(keys.placement));
    expect(registry).toHaveLength(6);
    const slots = await clusterMasters(cluster);
    const perMaster = new Map<string, number>();
    for (const code of registry) {
      const master = masterOfSlot(slots, slotOfCode(code)) ?? '';
      perMaster.set(master, (perMaster.get(master) ?? 0) + 1);
    }
    expect([...perMaster.values()]).toEqual([2, 2, 2]);
    await waitFor(
      async () => {
        for (const code of registry) {
          const master = Number(masterOfSlot(slots, slotOfCode(code)));
          const [key] = await cluster.node(master).keys(`${prefix}:{${code}}:gateway:*:backlog`);
          if (key === undefined || Number(await cluster.node(master).hget(key, 'max')) !== BUDGET / 2) return false;
        }
        return true;
      },
      { timeoutMs: 30_000, message: 'every shard did not get half the budget' },
    );
  });

  it('stays connected through 10 calls of 60 KB log messages on six shards, and the callers are told what was dropped', async () => {
    await client.setLoggingLevel('debug');
    // The gateway's and the worker's (its cancels, §1.2): one per master each.
    const before = await shardSubscriberIds();
    expect(before).toHaveLength(6);
    const logs: Array<{ logger?: string; level: string; data: unknown }> = [];
    client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void logs.push(n.params));
    const calls = Array.from({ length: 10 }, () =>
      client.callTool(
        { name: 'shard_flood', arguments: { count: 200, bytes: 60_000, stepMs: 20 } },
        CallToolResultSchema,
        { timeout: 180_000 },
      ),
    );
    // Every call's task running before the stop: a create in flight across a 2 s stop would time out in the gateway
    // (its commands fail fast, §22), which is not what this test is about.
    await waitFor(async () => (await runningTasks()) === 10, { message: 'the 10 calls never all ran' });
    await waitFor(() => logs.length > 0, { message: 'no log message at all' });
    process.kill(gateway.pid, 'SIGSTOP');
    try {
      await new Promise((resolve) => setTimeout(resolve, 2_000));
    } finally {
      process.kill(gateway.pid, 'SIGCONT');
    }
    const results = await Promise.all(calls);
    for (const result of results) expect(result.isError).toBeFalsy();
    // No master cut the gateway's subscriber on it: the same connections, none reconnected.
    expect(await shardSubscriberIds()).toEqual(before);
    const notices = logs.filter((l) => l.logger === 'taskrelay');
    expect(notices.length).toBeGreaterThan(0);
    expect(notices[0]).toMatchObject({ level: 'warning', data: { dropped: expect.any(Number) } });
    const flood = logs.filter((l) => l.logger === 'shard_flood').length;
    const dropped = notices.reduce((n, l) => n + Number((l.data as { dropped: number }).dropped), 0);
    console.log(`F4 sharded: ${flood} log messages delivered, ${dropped} dropped and told`);
    expect(flood + dropped).toBeLessThanOrEqual(2_000);
  }, 240_000);

  it('gets a cut sharded subscriber back from ioredis, reconciles, and its callers hear their later messages', async () => {
    const before = await shardSubscriberIds();
    const logs: number[] = [];
    client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
      const data = n.params.data as { i?: number };
      if (n.params.logger === 'shard_flood' && typeof data.i === 'number') logs.push(data.i);
    });
    const call = client.callTool(
      { name: 'shard_flood', arguments: { count: 80, bytes: 100, stepMs: 50 } },
      CallToolResultSchema,
      { timeout: 120_000 },
    );
    await waitFor(() => logs.length >= 5, { message: 'no log message before the cut' });
    // Every master cuts every pub/sub client: the gateway's sharded subscribers (and the worker's).
    for (const port of cluster.ports) await cluster.node(port).call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    const cutAt = logs.length;
    await waitFor(
      async () => {
        const now = await shardSubscriberIds();
        return now.length === before.length && now.every((id) => !before.includes(id));
      },
      { message: 'the sharded subscribers did not come back' },
    );
    // ioredis said `subscribersReady`: the gateway re-read what it routes, as after a classic reconnect (§6).
    await waitFor(() => gateway.logs().some((l) => l['msg'] === 'subscriber reconnected; task routes reconciled'), {
      message: 'the gateway did not reconcile its routes after its sharded subscribers came back',
    });
    const result = await call;
    expect(result.isError).toBeFalsy();
    expect(logs.length).toBeGreaterThan(cutAt);
    expect(logs.at(-1)).toBe(80);
  }, 120_000);
});

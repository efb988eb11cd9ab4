/**
 * Issue 45 on a real 3-master Redis Cluster: with REDIS_CLUSTER_NODES and an unbraced prefix the built gateways and
 * workers use the sharded key layout (PROTOCOL.md §1.1). The placement gives three tools three masters and a tool with
 * `shards: 3` three masters; calls through one gateway fleet spread the Redis work (each master's `INFO commandstats`:
 * command counts, not timings); task ids carry their shard, so the ordinary task operations work from another
 * gateway; `tasks/list` merges every shard's index, its cursor included.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  CallToolResultSchema,
  CancelTaskResultSchema,
  ListTasksResultSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import { Cluster } from 'ioredis';
import { HOME_TAG, createKeys, masterOfSlot, slotOfCode } from '@taskrelay/shared';
import { clusterMasters, commandsPerMaster, resetCommandStats, type TestCluster } from './helpers/redis-cluster.js';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';

const TOOLS = `${ROOT}/test/fixtures/shard-tools.mjs`;

// No braces: the sharded layout. Two workers start at once: the placement lease keeps their placements apart. A third
// serves another tool only, started after them (placed between alpha's and gamma's, delta would even the counts and
// gamma would share a master: each new shard goes to the master with the fewest). The gateways start after them.
const stack = useStack({
  name: 'shards',
  cluster: { braces: false },
  // With tokens, so tasks belong to a principal and tasks/list is offered (rate limits on, as in production).
  tokens: { alice: 'alice-token' },
  gateways: [],
  workerEnv: { TASKRELAY_TOOLS: TOOLS },
  workers: [{}, {}],
  hookTimeoutMs: 120_000,
});
let cluster: TestCluster;
let prefix: string;
let gateways: GatewayProcess[];
let clients: Client[];
let redis: Cluster;

beforeAll(async () => {
  ({ cluster, prefix } = stack);
  await stack.addWorker({ TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-tools-delta.mjs` });
  gateways = await Promise.all([0, 1].map(() => stack.addGateway({ TASKRELAY_OPERATORS: 'alice' })));
  clients = await Promise.all(gateways.map((g) => stack.client(stack.auth('alice'), g.url)));
  redis = new Cluster(cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
  await waitFor(async () => (await clients[1]?.listTools())?.tools.some((t) => t.name === 'hot') === true, {
    message: 'the tools never reached the second gateway',
  });
}, 120_000);

afterAll(() => redis?.disconnect());

/** The placement registry: `<queue>~<tool>#<i>` → code. */
async function placement(): Promise<Record<string, string>> {
  return redis.hgetall(createKeys(prefix, 'sharded').placement);
}

function codeOf(registry: Record<string, string>, tool: string, index = 0): string {
  const entry = Object.entries(registry).find(([field]) => field.endsWith(`~${tool}#${index}`));
  if (!entry) throw new Error(`${tool}#${index} is not placed: ${JSON.stringify(registry)}`);
  return entry[1];
}

/** `count` plain calls of each tool, `inFlight` at once per client, alternating the two gateways. */
async function callMany(tools: string[], count: number, inFlight = 8): Promise<void> {
  const calls = tools.flatMap((tool) => Array.from({ length: count }, (_, n) => ({ tool, n })));
  let next = 0;
  const lane = async (client: Client) => {
    while (next < calls.length) {
      const call = calls[next++];
      if (!call) return;
      const result = (await client.request(
        { method: 'tools/call', params: { name: call.tool, arguments: { n: call.n } } },
        CallToolResultSchema,
      )) as CallToolResult;
      expect(result.structuredContent).toEqual({ tool: call.tool, n: call.n });
    }
  };
  await Promise.all(clients.flatMap((client) => Array.from({ length: inFlight / 2 }, () => lane(client))));
}

function busiestShare(counts: Map<number, number>): { share: number; counts: number[] } {
  const values = [...counts.values()];
  const total = values.reduce((a, b) => a + b, 0);
  return { share: Math.max(...values) / total, counts: values };
}

describe('placement on a 3-master cluster', () => {
  it('gives three tools three masters, and the three shards of a hot tool three masters', async () => {
    const registry = await placement();
    const slots = await clusterMasters(cluster);
    const masterOf = (code: string) => masterOfSlot(slots, slotOfCode(code));
    const three = ['alpha', 'beta', 'gamma'].map((tool) => masterOf(codeOf(registry, tool)));
    expect(new Set(three).size).toBe(3);
    const hot = [0, 1, 2].map((i) => masterOf(codeOf(registry, 'hot', i)));
    expect(new Set(hot).size).toBe(3);
    // Every key written so far starts with the prefix, under the home tag or a placed shard's.
    const codes = new Set(Object.values(registry));
    for (const port of cluster.ports) {
      for (const key of await cluster.node(port).keys('*')) {
        const tag = /^([^{]*)\{([^}]*)\}/.exec(key);
        expect(tag?.[1], key).toBe(`${prefix}:`);
        expect(tag?.[2] === HOME_TAG || codes.has(tag?.[2] ?? ''), key).toBe(true);
      }
    }
  });
});

describe('the work spreads over the masters', () => {
  it('three tools: the busiest master carries at most 40 % of the Redis commands', async () => {
    await callMany(['alpha'], 4);
    await resetCommandStats(cluster);
    await callMany(['alpha', 'beta', 'gamma'], 60);
    const { share, counts } = busiestShare(await commandsPerMaster(cluster));
    const spublish = [...(await commandsPerMaster(cluster, 'spublish')).values()];
    console.log(
      `3 tools: commands per master ${counts.join(' / ')}, busiest ${(share * 100).toFixed(1)} %; ` +
        `SPUBLISH per master ${spublish.join(' / ')}`,
    );
    expect(share).toBeLessThanOrEqual(0.4);
    // Every gateway event went by SPUBLISH to the master of its task's shard: none crossed the cluster bus (§1.2).
    expect([...(await commandsPerMaster(cluster, 'publish')).values()]).toEqual([0, 0, 0]);
    for (const n of spublish) expect(n).toBeGreaterThan(0);
  }, 120_000);

  it('one hot tool with shards: 3: the busiest master carries at most 45 %', async () => {
    await resetCommandStats(cluster);
    await callMany(['hot'], 180);
    const { share, counts } = busiestShare(await commandsPerMaster(cluster));
    console.log(`hot tool, 3 shards: commands per master ${counts.join(' / ')}, busiest ${(share * 100).toFixed(1)} %`);
    expect(share).toBeLessThanOrEqual(0.45);
  }, 120_000);
});

describe('the task operations through another gateway', () => {
  it('finds a task by its id alone: get, result and list from the other gateway', async () => {
    const [a, b] = clients as [Client, Client];
    const registry = await placement();
    const ids: string[] = [];
    for (const tool of ['alpha', 'beta', 'gamma', 'hot']) ids.push(await startTask(a, tool, { n: 7 }));
    for (const [i, tool] of ['alpha', 'beta', 'gamma'].entries())
      expect(ids[i]?.slice(0, 4)).toBe(codeOf(registry, tool));
    expect([0, 1, 2].map((i) => codeOf(registry, 'hot', i))).toContain(ids[3]?.slice(0, 4));
    for (const id of ids) {
      const result = await taskResult(b, id);
      expect(result.structuredContent).toMatchObject({ n: 7 });
      expect((await getTask(b, id)).status).toBe('completed');
    }
    // tasks/list merges the shards' indexes, newest first, page by page with no duplicate and no gap.
    const seen: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await b.request(
        { method: 'tasks/list', params: cursor === undefined ? {} : { cursor } },
        ListTasksResultSchema,
      );
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    expect(new Set(seen).size).toBe(seen.length);
    for (const id of ids) expect(seen).toContain(id);
  }, 60_000);

  it('cancels a running task from the other gateway, and its worker stops the tool', async () => {
    const [a, b] = clients as [Client, Client];
    const taskId = await startTask(a, 'slow', {});
    await waitFor(
      async () => (await redis.hget(createKeys(prefix, 'sharded').forTask(taskId).task(taskId), 'attempt')) === '1',
      { message: 'the slow task never started' },
    );
    // Sharded pub/sub (PROTOCOL.md §1.2): the cancel goes out once, by SPUBLISH, on the channel of the task's shard,
    // which only the two workers of `slow` subscribe to (not delta's worker); nobody listens on a home cancel channel.
    const keys = createKeys(prefix, 'sharded');
    const channel = keys.forTask(taskId).cancelChannel;
    const shardMaster = masterOfSlot(await clusterMasters(cluster), slotOfCode(taskId.slice(0, 4)));
    const subscribers = async (command: 'SHARDNUMSUB' | 'NUMSUB', name: string) => {
      let n = 0;
      for (const port of cluster.ports)
        n += Number(((await cluster.node(port).call('PUBSUB', command, name)) as [string, number])[1]);
      return n;
    };
    expect(await subscribers('SHARDNUMSUB', channel)).toBe(2);
    expect(await subscribers('NUMSUB', keys.cancelChannel)).toBe(0);
    expect(await subscribers('SHARDNUMSUB', keys.forShard(codeOf(await placement(), 'delta')).cancelChannel)).toBe(1);
    await resetCommandStats(cluster);
    const cancelled = await b.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    expect(cancelled.status).toBe('cancelled');
    expect((await getTask(a, taskId)).status).toBe('cancelled');
    // The cancel and the task's status event (to its owning gateway a, on its channel of the task's shard, §1.2) go
    // to the shard's master alone. (No ack comes back from a: the task had no progress token, §10.9.)
    const spublish = await commandsPerMaster(cluster, 'spublish');
    expect(Object.fromEntries(spublish)).toEqual(
      Object.fromEntries(cluster.ports.map((port) => [port, String(port) === shardMaster ? 2 : 0])),
    );
    expect([...(await commandsPerMaster(cluster, 'publish')).values()]).toEqual([0, 0, 0]);
  }, 60_000);

  it('shows each shard of a tool in the admin queue depths, and pauses a tool on every shard', async () => {
    const admin = (path: string, method = 'GET') =>
      fetch(`${gateways[1]!.url.replace(/\/mcp$/, '')}/admin/api/${path}`, {
        method,
        // Operator writes carry JSON (a write without it is refused 415: the CSRF rule).
        ...(method === 'GET'
          ? { headers: { authorization: 'Bearer alice-token' } }
          : { headers: { authorization: 'Bearer alice-token', 'content-type': 'application/json' }, body: '{}' }),
      }).then(async (res) => ({ status: res.status, body: (await res.json()) as Record<string, any> }));
    const registry = await placement();
    const overview = await admin('overview');
    const rows = (overview.body['queues'] as Array<{ queue: string; workers: number }>).map((q) => q.queue);
    for (const i of [0, 1, 2]) expect(rows).toContain(`default~hot@${codeOf(registry, 'hot', i)}`);
    expect((await admin('tools/hot/pause', 'POST')).status).toBe(200);
    const [a] = clients as [Client, Client];
    const ids = [await startTask(a, 'hot', { n: 1 }), await startTask(a, 'hot', { n: 2 })];
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    // Paused on every shard, and said so: the controls are read on the tool's shards, not under the home prefix.
    for (const id of ids) {
      expect(await getTask(a, id)).toMatchObject({
        status: 'working',
        statusMessage: expect.stringMatching(/tool hot is paused by an operator/),
      });
    }
    const listed = (await a.listTools()).tools.find((t) => t.name === 'hot');
    expect(listed?._meta?.['dev.taskrelay/controls']).toMatchObject({ paused: true });
    const tools = (await admin('tools')).body['tools'] as Array<{ name: string; paused: boolean; waiting: number }>;
    expect(tools.find((t) => t.name === 'hot')).toMatchObject({ waiting: 2, paused: true });
    expect((await admin('tools/hot/resume', 'POST')).status).toBe(200);
    for (const id of ids) expect((await taskResult(a, id)).structuredContent).toMatchObject({ tool: 'hot' });
  }, 60_000);

  it('answers an id that names no shard as not found', async () => {
    const [, b] = clients as [Client, Client];
    await expect(getTask(b, 'not-a-task')).rejects.toThrow(/not found/i);
    await expect(getTask(b, `ffff${'0'.repeat(32)}`)).rejects.toThrow(/not found/i);
  });
});

describe('gateway events on sharded pub/sub (PROTOCOL.md §1.2)', () => {
  /** Sums a command's calls per master port. */
  const byPort = (counts: Map<number, number>) => Object.fromEntries(counts);

  it("a call's progress, logs and result reach its caller, published by SPUBLISH on the task's master only", async () => {
    const [a, b] = clients as [Client, Client];
    const logs: unknown[] = [];
    a.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void logs.push(n.params.data));
    const code = codeOf(await placement(), 'talker');
    const shardMaster = masterOfSlot(await clusterMasters(cluster), slotOfCode(code));
    // Each gateway listens on its channel of the shard (and on its home channel, for acks): one subscriber each.
    const keys = createKeys(prefix, 'sharded');
    const shardChannels = async (pattern: string) => {
      const out: string[] = [];
      for (const port of cluster.ports)
        out.push(...((await cluster.node(port).call('PUBSUB', 'SHARDCHANNELS', pattern)) as string[]));
      return out;
    };
    expect(await shardChannels(keys.forShard(code).gatewayChannel('*'))).toHaveLength(2);
    expect(await shardChannels(keys.gatewayChannel('*'))).toHaveLength(2);
    const resources = keys.forShard(code).resourcesChannel;
    let listeners = 0;
    for (const port of cluster.ports)
      listeners += Number(((await cluster.node(port).call('PUBSUB', 'SHARDNUMSUB', resources)) as [string, number])[1]);
    expect(listeners).toBe(2);
    await resetCommandStats(cluster);
    const seen: number[] = [];
    const result = (await a.request(
      { method: 'tools/call', params: { name: 'talker', arguments: { n: 5 } } },
      CallToolResultSchema,
      { onprogress: (p) => seen.push(p.progress) },
    )) as CallToolResult;
    expect(result.structuredContent).toEqual({ tool: 'talker', n: 5 });
    expect(seen.at(-1)).toBe(3);
    await waitFor(() => logs.length === 2, { message: 'the log messages did not reach the caller' });
    expect(logs).toEqual([
      { n: 5, line: 1 },
      { n: 5, line: 2 },
    ]);
    const publish = await commandsPerMaster(cluster, 'publish');
    const spublish = await commandsPerMaster(cluster, 'spublish');
    console.log(`talker call: spublish per master ${JSON.stringify(byPort(spublish))}, shard master ${shardMaster}`);
    // No classic PUBLISH at all (it would cross the cluster bus to every node); SPUBLISH on the shard's master only:
    // at least the last progress, the two logs, the output wake-up and the terminal status.
    expect(Object.values(byPort(publish))).toEqual([0, 0, 0]);
    for (const port of cluster.ports) {
      if (String(port) === shardMaster) expect(spublish.get(port)).toBeGreaterThanOrEqual(5);
      else expect(spublish.get(port)).toBe(0);
    }
    // A task through gateway b, its output followed and its result read through gateway a: a hears the output's
    // wake-up on the shard's resources channel and the status on its events channel of the shard.
    await resetCommandStats(cluster);
    const updates: string[] = [];
    a.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updates.push(n.params.uri));
    const taskId = await startTask(b, 'talker', { n: 6, waitMs: 1_000 });
    const uri = `taskrelay://tasks/${taskId}/output`;
    await a.subscribeResource({ uri });
    expect((await taskResult(a, taskId)).structuredContent).toEqual({ tool: 'talker', n: 6 });
    await waitFor(() => updates.includes(uri), { message: 'the output wake-up did not reach the subscriber' });
    expect(Object.values(byPort(await commandsPerMaster(cluster, 'publish')))).toEqual([0, 0, 0]);
  }, 60_000);
});

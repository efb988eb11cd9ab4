/**
 * A Python worker on the sharded layout of a real 3-master Redis Cluster (PROTOCOL.md §1.2, §29): its gateway events
 * go by SPUBLISH to the master of the task's shard only, and it hears the cancels of each of its tool shards on the
 * node that owns that shard's channel (`RedisCluster.get_node_from_key` in `engine/cancel_watch.py`), with a 10 min
 * sweep, so a cancel that stops the tool within the test came on the channel.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { Cluster } from 'ioredis';
import { createKeys, masterOfSlot, slotOfCode } from '@taskrelay/shared';
import { clusterMasters, commandsPerMaster, resetCommandStats, type TestCluster } from './helpers/redis-cluster.js';
import { PYTHON, ROOT, recordingShape, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const PY_TOOLS = `${ROOT}/test/fixtures/python_cluster.py`;

if (PYTHON === undefined) console.log('python-cluster suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('a Python worker on a 3-master cluster, sharded layout', () => {
  const progress = new Map<string, number[]>();
  const logs: unknown[] = [];
  // No braces: the sharded layout. One Python worker, no Node worker.
  const stack = useStack({
    name: 'pycluster',
    cluster: { braces: false },
    workers: [],
    pythonWorkers: [{ TASKRELAY_TOOLS: PY_TOOLS, WORKER_CANCEL_SWEEP_MS: '600000' }],
    ready: { readyTimeoutMs: 60_000 },
    hookTimeoutMs: 180_000,
  });
  let cluster: TestCluster;
  let redis: Cluster;
  let prefix: string;
  let worker: ManagedProcess;
  let client: Client;

  beforeAll(async () => {
    ({ cluster, prefix } = stack);
    worker = stack.pythonWorkers[0]!;
    redis = new Cluster(cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
    client = await stack.client({}, undefined, recordingShape(progress, logs));
    await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'pc_talk'), {
      message: 'the Python tools never reached the gateway',
    });
  });

  afterAll(() => redis?.disconnect());

  it("sends a call's progress, logs and status by SPUBLISH to its shard's master only", async () => {
    const registry = await redis.hgetall(createKeys(prefix, 'sharded').placement);
    const code = Object.entries(registry).find(([field]) => field.endsWith('~pc_talk#0'))?.[1] ?? '';
    const shardMaster = masterOfSlot(await clusterMasters(cluster), slotOfCode(code));
    await resetCommandStats(cluster);
    const result = (await client.request(
      { method: 'tools/call', params: { name: 'pc_talk', arguments: { n: 4 }, _meta: { progressToken: 'talk' } } },
      CallToolResultSchema,
    )) as CallToolResult;
    expect(result.structuredContent).toEqual({ n: 4 });
    expect(progress.get('talk')?.at(-1)).toBe(2);
    await waitFor(() => logs.length === 2, { message: 'the log messages did not reach the caller' });
    const spublish = await commandsPerMaster(cluster, 'spublish');
    console.log(`pc_talk call: SPUBLISH per master ${JSON.stringify(Object.fromEntries(spublish))}`);
    expect([...(await commandsPerMaster(cluster, 'publish')).values()]).toEqual([0, 0, 0]);
    for (const port of cluster.ports) {
      if (String(port) === shardMaster) expect(spublish.get(port)).toBeGreaterThanOrEqual(5);
      else expect(spublish.get(port)).toBe(0);
    }
  });

  it("hears the cancel of a task on each of its tool's three shards, on the master that owns the channel", async () => {
    const registry = await redis.hgetall(createKeys(prefix, 'sharded').placement);
    const codes = [0, 1, 2].map((i) => registry[`default~pc_hold#${i}`]);
    const slots = await clusterMasters(cluster);
    // Three shards, three masters: whichever node a broken lookup picked, some channel would be on another one.
    expect(new Set(codes.map((code) => masterOfSlot(slots, slotOfCode(code ?? '')))).size).toBe(3);
    // Each shard's cancel channel has the worker's subscription on the master that owns it. (A subscriber on another
    // node is refused there and tries again, and each try sweeps the running tasks: the cancels below would still
    // arrive, by those sweeps, so the owner's count is what shows the lookup.)
    const keys = createKeys(prefix, 'sharded');
    await waitFor(
      async () => {
        for (const code of codes) {
          const owner = cluster.node(Number(masterOfSlot(slots, slotOfCode(code ?? ''))));
          const channel = keys.forShard(code ?? '').cancelChannel;
          const [, n] = (await owner.call('PUBSUB', 'SHARDNUMSUB', channel)) as [string, number];
          if (Number(n) !== 1) return false;
        }
        return true;
      },
      { timeoutMs: 10_000, message: 'a cancel channel has no subscriber on the master that owns it' },
    );
    // The gateway takes the shards in turn: three calls, one on each.
    const ids = [await startTask(client, 'pc_hold', { n: 1 }), await startTask(client, 'pc_hold', { n: 2 })];
    ids.push(await startTask(client, 'pc_hold', { n: 3 }));
    expect(ids.map((id) => id.slice(0, 4)).sort()).toEqual([...codes].sort());
    for (const id of ids) {
      await waitFor(() => worker.logs().some((l) => l['taskId'] === id && l['msg'] === 'tool started'), {
        message: `task ${id} never started`,
      });
    }
    for (const id of ids) expect((await client.experimental.tasks.cancelTask(id)).status).toBe('cancelled');
    for (const id of ids) {
      await waitFor(
        () =>
          worker
            .logs()
            .some(
              (l) => l['taskId'] === id && l['msg'] === 'tool signal aborted' && l['reason'] === 'CLIENT_CANCELLED',
            ),
        { message: `the cancel of ${id} (shard ${id.slice(0, 4)}) never reached its tool` },
      );
    }
  }, 60_000);
});

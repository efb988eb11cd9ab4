/**
 * Issue 33 item 1, PROTOCOL.md §1.1 and §29: a Python worker on a real 3-master Redis Cluster (REDIS_CLUSTER_NODES and
 * a `{prefix}`, as the Node processes take them) serves its tools behind the gateway: progress, a cancel and a
 * question, every key in the prefix's one slot. Without braces it runs the sharded layout (issue 45): a `shards=2`
 * tool placed on two masters, its calls on both.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ElicitRequestSchema, ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { uniquePrefix } from './helpers/redis.js';
import { PYTHON, ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const PY_TOOLS = resolve(ROOT, 'test/fixtures/python_tools.py');
const PY_SHARDED = resolve(ROOT, 'test/fixtures/python_sharded.py');

if (PYTHON === undefined) console.log('python-cluster suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('a Python worker on a Redis Cluster', () => {
  const stack = useStack({
    name: 'pycluster',
    cluster: {},
    workers: [],
    pythonWorkers: [{ TASKRELAY_TOOLS: PY_TOOLS }],
  });
  let client: Client;
  const progress: number[] = [];
  const worker = () => stack.pythonWorkers[0]!;

  beforeAll(async () => {
    client = await stack.client({}, undefined, {
      capabilities: { elicitation: {} },
      before(c) {
        c.setNotificationHandler(ProgressNotificationSchema, (n) => {
          if (n.params.progressToken === 'count') progress.push(n.params.progress);
          return Promise.resolve();
        });
        c.setRequestHandler(ElicitRequestSchema, () => Promise.resolve({ action: 'accept', content: { name: 'Ada' } }));
      },
    });
  });

  it('runs the sharded layout with an unbraced prefix: a shards=2 tool on two masters (issue 45)', async () => {
    // A fleet of its own beside the braced one: no braces, so `auto` is the sharded layout (PROTOCOL.md §1.1).
    const plain = uniquePrefix('pyshards');
    // Its cancel sweep is 10 min: the cancel below reaches the tool by SSUBSCRIBE at its channel's master, or not at all.
    const shardedWorker = await stack.addPythonWorker({
      TASKRELAY_PREFIX: plain,
      TASKRELAY_TOOLS: PY_SHARDED,
      WORKER_CANCEL_SWEEP_MS: '600000',
    });
    const shardedGateway = await stack.addGateway({ TASKRELAY_PREFIX: plain });
    const sharded = await stack.client({}, shardedGateway.url);
    const node = stack.cluster.node(stack.cluster.ports[0] ?? 0);
    const home = createKeys(plain, 'sharded').placement;
    const registry = await stack.cluster
      .node(await stack.cluster.masterOf(Number(await node.cluster('KEYSLOT', home))))
      .hgetall(home);
    const codes = [registry['default~py_spread#0'] ?? '', registry['default~py_spread#1'] ?? ''];
    // The placement put the tool's two shards on two masters, as Node's rule does.
    const masters = await Promise.all(
      codes.map(async (code) => stack.cluster.masterOf(Number(await node.cluster('KEYSLOT', code)))),
    );
    expect(new Set(masters).size).toBe(2);
    const ids = await Promise.all([1, 2, 3, 4].map((n) => startTask(sharded, 'py_spread', { n })));
    const results = await Promise.all(ids.map((id) => taskResult(sharded, id)));
    expect(results.map((r) => r.structuredContent)).toEqual([1, 2, 3, 4].map((n) => ({ n, attempt: 1 })));
    expect([...new Set(ids.map((id) => id.slice(0, 4)))].sort()).toEqual([...codes].sort());

    const held = await startTask(sharded, 'py_hold', {});
    await waitFor(() => shardedWorker.logs().some((l) => l['taskId'] === held && l['msg'] === 'tool started'));
    expect((await sharded.experimental.tasks.cancelTask(held)).status).toBe('cancelled');
    await waitFor(
      () =>
        shardedWorker
          .logs()
          .some(
            (l) => l['taskId'] === held && l['msg'] === 'tool signal aborted' && l['reason'] === 'CLIENT_CANCELLED',
          ),
      { message: 'the cancel never reached the Python worker on its shard channel' },
    );
  });

  it('runs a call with progress, a cancel and a question', async () => {
    const counted = await taskResult(
      client,
      await startTask(client, 'py_count', { n: 3, delay_ms: 20 }, { progressToken: 'count' }),
    );
    expect(counted.structuredContent).toEqual({ counted: 3, attempt: 1 });
    await waitFor(() => progress.includes(3));
    expect(progress).toEqual([...progress].sort((a, b) => a - b));

    const slow = await startTask(client, 'py_slow', { seconds: 30 });
    await waitFor(() =>
      worker()
        .logs()
        .some((l) => l['taskId'] === slow && l['msg'] === 'tool started'),
    );
    expect((await client.experimental.tasks.cancelTask(slow)).status).toBe('cancelled');
    await waitFor(() =>
      worker()
        .logs()
        .some((l) => l['taskId'] === slow && l['msg'] === 'tool signal aborted' && l['reason'] === 'CLIENT_CANCELLED'),
    );

    const asked = await taskResult(client, await startTask(client, 'py_ask', {}), 30_000);
    expect(asked.structuredContent).toEqual({ greeting: 'Hello, Ada', attempt: 2 });
  });

  it('keeps every key it wrote in the one slot of its {prefix}', async () => {
    const node = stack.cluster.node(stack.cluster.ports[0] ?? 0);
    const slot = Number(await node.cluster('KEYSLOT', stack.prefix));
    const keys = (
      await Promise.all(
        stack.cluster.ports.map(async (port) => (await stack.cluster.node(port).keys(`${stack.prefix}*`)) as string[]),
      )
    ).flat();
    expect(keys.some((k) => k.includes(':worker:'))).toBe(true);
    expect(keys.some((k) => k.includes(':q-default~py_'))).toBe(true);
    for (const key of keys) expect(Number(await node.cluster('KEYSLOT', key)), key).toBe(slot);
  });
});

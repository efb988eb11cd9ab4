/**
 * Issue 12 on a real 3-master Redis Cluster (loopback ports): the built gateway and workers with REDIS_CLUSTER_NODES
 * and a `{prefix}` run the full task path — progress, cancel, a worker killed mid-run and its job taken over, a
 * gateway restarted — and every key they write lives in the prefix's one slot. Without braces they refuse to start.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, CancelTaskResultSchema, GetTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { Cluster } from 'ioredis';
import { z } from 'zod';
import { createKeys } from '@taskrelay/shared';
import type { TestCluster } from './helpers/redis-cluster.js';
import { waitFor } from './helpers/wait-for.js';
import {
  FIXTURE_TOOLS,
  GATEWAY_MAIN,
  WORKER_MAIN,
  connectClient,
  spawnNode,
  type GatewayProcess,
  type ManagedProcess,
} from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask } from './helpers/tasks.js';

const stack = useStack({ name: 'cluster', cluster: {}, mcp: true });
let cluster: TestCluster;
let prefix: string;
let env: Record<string, string | undefined>;
let gateway: GatewayProcess;
let client: Client;
let redis: Cluster;
let demo: ManagedProcess;

beforeAll(() => {
  ({ cluster, prefix, env, gateway, mcp: client } = stack);
  [demo] = stack.workers as [ManagedProcess];
  redis = new Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: Number(n.split(':')[1]) })));
});

afterAll(() => {
  redis?.disconnect();
});

const getTask = (taskId: string, c: Client = client) =>
  c.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema);

async function waitForStatus(taskId: string, status: string, c: Client = client, timeoutMs = 20_000) {
  return waitFor(
    async () => {
      const task = await getTask(taskId, c);
      return task.status === status ? task : undefined;
    },
    { timeoutMs, message: `task ${taskId} did not become ${status}` },
  );
}

describe('configuration on a cluster', () => {
  it('refuses to start a gateway or a worker of the single layout whose prefix is not wrapped in {}, in one line', async () => {
    for (const main of [GATEWAY_MAIN, WORKER_MAIN]) {
      const proc = spawnNode(main, {
        REDIS_CLUSTER_NODES: cluster.nodes.join(','),
        TASKRELAY_PREFIX: 'plain',
        TASKRELAY_KEY_LAYOUT: 'single',
      });
      expect(await proc.exited).toBe(1);
      expect(proc.output()).toMatch(/^[^\n]*TASKRELAY_PREFIX must be wrapped in \{\}[^\n]*\n$/);
    }
  });
});

describe('the task path on a 3-master cluster', () => {
  it('runs a call with progress strictly increasing up to its result', async () => {
    const seen: number[] = [];
    const result = await client.request(
      { method: 'tools/call', params: { name: 'build_report', arguments: { report: 'c', items: 5, delayMs: 20 } } },
      CallToolResultSchema,
      { onprogress: (p) => seen.push(p.progress) },
    );
    expect(result.structuredContent).toEqual({ report: 'c', items: 5 });
    expect(seen.length).toBeGreaterThan(0);
    expect(seen.at(-1)).toBe(5);
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1] ?? -1);
  });

  it('cancels a running task, which stays cancelled', async () => {
    const taskId = await startTask(client, 'build_report', { report: 'long', items: 10_000, delayMs: 50 });
    await waitFor(async () => (await redis.hget(createKeys(prefix).task(taskId), 'attempt')) === '1');
    const cancelled = await client.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    expect(cancelled.status).toBe('cancelled');
    // The cancel reached the worker over pub/sub (through the cluster bus) and the tool stopped.
    await waitFor(
      () =>
        demo.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'cancel received; aborting tool') &&
        demo.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool stopped; task already terminal'),
      { message: 'the worker did not stop the cancelled tool' },
    );
    expect((await getTask(taskId)).status).toBe('cancelled');
  });

  it('asks its user mid-task, parks the job, and resumes on the answer (input_required on a cluster)', async () => {
    const extMeta = {
      'io.modelcontextprotocol/clientCapabilities': {
        elicitation: {},
        extensions: { 'io.modelcontextprotocol/tasks': {} },
      },
    };
    const Loose = z.looseObject({});
    const created = await client.request(
      { method: 'tools/call', params: { name: 'wait_for_approval', arguments: { question: 'Ship?' }, _meta: extMeta } },
      Loose,
    );
    const taskId = String(created['taskId']);
    const get = () => client.request({ method: 'tasks/get', params: { taskId, _meta: extMeta } }, Loose);
    const waiting = await waitFor(
      async () => ((await get())['status'] === 'input_required' ? await get() : undefined),
      {
        timeoutMs: 20_000,
        message: 'the task never asked its question',
      },
    );
    expect(waiting['inputRequests']).toMatchObject({ '1': { method: 'elicitation/create' } });
    // The job waits in BullMQ's delayed set, in the prefix's slot, held by no worker.
    const pool = (await redis.hget(createKeys(prefix).task(taskId), 'queue')) ?? '';
    expect(await redis.zscore(`${prefix}:q-${pool}:delayed`, taskId)).not.toBeNull();
    await client.request(
      {
        method: 'tasks/update',
        params: { taskId, inputResponses: { '1': { action: 'accept', content: { approved: true } } }, _meta: extMeta },
      },
      Loose,
    );
    const done = await waitFor(async () => ((await get())['status'] === 'completed' ? await get() : undefined), {
      timeoutMs: 20_000,
      message: 'the answer did not resume the task',
    });
    expect(done['result']).toMatchObject({ structuredContent: { approved: true } });
  });

  it("hands a killed worker's job to another worker, and a restarted gateway still answers for the task", async () => {
    const fixtures = { ...env, TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_LOCK_DURATION_MS: '1000' };
    const first: ManagedProcess = await stack.addWorker(fixtures);
    await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'sleepy'));
    const taskId = await startTask(client, 'sleepy', { ms: 1_500, stepMs: 100 });
    const key = createKeys(prefix).task(taskId);
    await waitFor(async () => (await redis.hget(key, 'attempt')) === '1');
    await first.kill('SIGKILL');
    await stack.addWorker(fixtures);
    const done = await waitForStatus(taskId, 'completed');
    expect(done.status).toBe('completed');
    expect(await redis.hget(key, 'attempt')).toBe('2');

    await gateway.kill('SIGTERM');
    gateway = await stack.addGateway({ PORT: String(gateway.port) });
    const other = await connectClient(gateway.url);
    try {
      expect((await getTask(taskId, other)).status).toBe('completed');
      const result = await other.request({ method: 'tasks/result', params: { taskId } }, CallToolResultSchema);
      expect(result.structuredContent).toEqual({ ms: 1_500 });
    } finally {
      await other.close();
    }
    client = await stack.client({}, gateway.url);
  });

  it('keeps every key it wrote on one master, in the one slot of its {prefix}', async () => {
    const slot = Number(await cluster.node(cluster.ports[0] ?? 0).cluster('KEYSLOT', prefix));
    const keysByNode = await Promise.all(
      cluster.ports.map(async (port) => (await cluster.node(port).keys(`${prefix}*`)) as string[]),
    );
    const holding = keysByNode.filter((keys) => keys.length > 0);
    expect(holding).toHaveLength(1);
    const keys = holding[0] ?? [];
    // Tasks, live set, workers, catalogs and BullMQ's queue keys.
    expect(keys.some((k) => k.includes(':task:'))).toBe(true);
    expect(keys.some((k) => k.includes(':q-'))).toBe(true);
    const node = cluster.node(cluster.ports[0] ?? 0);
    const k = createKeys(prefix);
    const names = [...keys, k.gatewayChannel('g'), k.cancelChannel, k.reaperLease, k.idempotency('p', 'i')];
    for (const name of names) expect(Number(await node.cluster('KEYSLOT', name)), name).toBe(slot);
  });
});

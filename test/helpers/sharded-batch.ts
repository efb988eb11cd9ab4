/**
 * What the sharded batch suites (test/batch-sharded.e2e, test/python-parent-sharded.e2e and their fault suites) share:
 * the child tool's shard codes and where each child's job sits, a count of the children's log lines, and the run of a
 * batch through SIGKILLs of its children's workers. PROTOCOL.md §26.10.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { Cluster } from 'ioredis';
import { CancelTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { createKeys, masterOfSlot, slotOfCode, toolQueue, type Keys } from '@taskrelay/shared';
import { expectExactBatch, killBusyWorker, traced } from './batch-trace.js';
import type { WorkerPool } from './faults.js';
import { ROOT, type ManagedProcess } from './processes.js';
import { clusterMasters } from './redis-cluster.js';
import type { TestStack } from './stack.js';
import { getTask, startTask, taskResult } from './tasks.js';
import { waitFor } from './wait-for.js';

/**
 * A Node worker of the child tool (test/fixtures/shard-batch-children.mjs, `shard_child`) tracing to `trace`. Its cancel
 * sweep is 10 min: only the cancel a stopped batch publishes on each child's shard stops a running child in a test.
 */
export function nodeShardChild(trace: string): Record<string, string> {
  return {
    TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-children.mjs`,
    WORKER_CONCURRENCY: '8',
    BATCH_TRACE_FILE: trace,
    WORKER_CANCEL_SWEEP_MS: '600000',
    LOG_LEVEL: 'info',
  };
}

/** The child tool the sharded batch fixtures fan out to (`shards: 3`), in both languages. */
export const CHILD_POOL = toolQueue('default', 'shard_child');

/** Waits until the gateway `client` talks to lists every tool named (its workers' catalogs reached it). */
export async function waitForTools(client: Client, ...names: string[]): Promise<void> {
  await waitFor(
    async () => {
      const listed = new Set((await client.listTools()).tools.map((t) => t.name));
      return names.every((name) => listed.has(name));
    },
    { message: `${names.join(', ')} never reached the gateway` },
  );
}

/** A cluster client of `stack`, the sharded layout's keys, and the three placed shard codes of CHILD_POOL. */
export interface ShardedBatchProbe {
  redis: Cluster;
  keys: Keys;
  codes: string[];
  /** The shards whose queue holds child `index`'s job. */
  jobShards(parentId: string, index: number): Promise<string[]>;
}

export async function probeShardedBatch(stack: TestStack): Promise<ShardedBatchProbe> {
  const redis = new Cluster(stack.cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
  const keys = createKeys(stack.prefix, 'sharded');
  const registry = await redis.hgetall(keys.placement);
  const codes = [0, 1, 2].map((i) => registry[`${CHILD_POOL}#${i}`] ?? '');
  const jobShards = async (parentId: string, index: number): Promise<string[]> => {
    const found = await Promise.all(
      codes.map(async (code) =>
        (await redis.exists(`${keys.forShard(code).bullQueueKeyPrefix}${CHILD_POOL}:${parentId}.${index}`)) === 1
          ? code
          : undefined,
      ),
    );
    return found.filter((code): code is string => code !== undefined);
  };
  return { redis, keys, codes, jobShards };
}

/** How many lines with message `msg` about parent `parentId` the processes logged. */
export function linesAbout(procs: readonly ManagedProcess[], msg: string, parentId: string): number {
  return procs.flatMap((p) => p.logs()).filter((l) => l['msg'] === msg && l['parentId'] === parentId).length;
}

/**
 * A batch of `size` children of 500 ms (`parentTool` fanning out to `shard_child`, 12 at once), with a busy children's
 * worker of `workers` SIGKILLed when `kills[i]` children are done: none may be lost or counted twice, and each child a
 * killed worker held must run again (test/helpers/batch-trace.ts). Returns the children the killed workers held.
 */
export async function batchThroughKills(o: {
  client: Client;
  redis: Cluster;
  prefix: string;
  parentTool: string;
  workers: WorkerPool;
  trace: string;
  size: number;
  kills: readonly number[];
}): Promise<number[]> {
  await waitForTools(o.client, o.parentTool, 'shard_child');
  const items = Array.from({ length: o.size }, (_v, n) => ({ n, delayMs: 500 }));
  const taskId = await startTask(
    o.client,
    o.parentTool,
    { items, concurrency: 12, tool: 'shard_child' },
    { ttl: 600_000 },
  );
  const keys = createKeys(o.prefix, 'sharded');
  const batch = keys.forTask(taskId).batch(taskId);
  const done = async () => Number((await o.redis.hget(batch.hash, 'completed')) ?? 0);

  const diedRunning: number[] = [];
  for (const at of o.kills) {
    await waitFor(async () => (await done()) >= at, { timeoutMs: 60_000, message: `${at} children done` });
    // The children are not held back (as the single layout's suite holds them with gates): the batch may be over
    // before a later kill finds a busy worker. The first kill (12 of 60 done) always finds one: expectExactBatch
    // checks it.
    diedRunning.push(...(await killBusyWorker(o.workers, o.trace, async () => (await done()) >= o.size)));
  }

  const result = await taskResult(o.client, taskId, 120_000);
  const counted = { done: await done(), outcomes: await o.redis.hlen(batch.outcomes) };
  expectExactBatch(result, o.size, counted, o.trace, diedRunning);
  // The child tool ran over three shards (child i on shard i mod 3, the e2e suites).
  const registry = await o.redis.hgetall(keys.placement);
  expect(new Set([0, 1, 2].map((i) => registry[`${CHILD_POOL}#${i}`] ?? '')).size).toBe(3);
  return diedRunning;
}

/** A parent tool of one of the sharded batch suites, and what its checks read. */
export interface ShardedParent {
  mcp: Client;
  parentTool: string;
  /** The children's trace file (test/helpers/batch-trace.ts). */
  trace: string;
  /** A gate file nobody makes: children waiting on it run until they are stopped. */
  never: string;
  jobShards: ShardedBatchProbe['jobShards'];
  codes: readonly string[];
  /** How many children of `parentId` logged that they stopped with their batch. */
  stopped: (parentId: string) => number;
}

/** Child i queues on shard i mod 3; a cancel of the parent stops every running child, each on its own shard. */
export async function expectCancelReachesEveryShard(p: ShardedParent): Promise<void> {
  const items = Array.from({ length: 9 }, (_v, i) => ({ n: 100 + i, gate: p.never }));
  const taskId = await startTask(p.mcp, p.parentTool, { items, concurrency: 9, tool: 'shard_child' });
  await waitFor(() => traced(p.trace, 'start', 100, 109).length === 9, {
    timeoutMs: 30_000,
    message: 'the 9 children never all started',
  });
  for (let i = 0; i < 9; i++) expect(await p.jobShards(taskId, i)).toEqual([p.codes[i % 3]]);
  await p.mcp.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
  await waitFor(() => p.stopped(taskId) === 9, { timeoutMs: 20_000, message: 'not every running child stopped' });
  expect(traced(p.trace, 'done', 100, 109)).toEqual([]);
  expect((await getTask(p.mcp, taskId)).status).toBe('cancelled');
  // Nothing of the batch is left queued on any shard.
  await waitFor(async () => (await Promise.all(items.map((_v, i) => p.jobShards(taskId, i)))).flat().length === 0, {
    message: 'children’s jobs left on their shards',
  });
}

/** Fail-fast: the first failure stops the running children on every shard, counted cancelled. */
export async function expectFailFastOnEveryShard(p: ShardedParent): Promise<void> {
  const items = Array.from({ length: 12 }, (_v, i) =>
    i === 5 ? { n: 200 + i, delayMs: 300, fail: true } : { n: 200 + i, gate: p.never },
  );
  const taskId = await startTask(p.mcp, p.parentTool, { items, concurrency: 12, failFast: true, tool: 'shard_child' });
  const result = await taskResult(p.mcp, taskId, 60_000);
  expect(result.structuredContent).toMatchObject({ total: 12, completed: 0, failed: 1, cancelled: 11 });
  const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
  expect(outcomes.filter((o) => o.status === 'failed').map((o) => o.index)).toEqual([5]);
  await waitFor(() => p.stopped(taskId) === 11, { timeoutMs: 20_000, message: 'not every running child stopped' });
  expect(traced(p.trace, 'done', 200, 212)).toEqual([205]);
}

/**
 * The four checks both parents' sharded batch suites make (the Node parent's and the Python parent's), registered in
 * the calling `describe`: the child tool's three shards on three masters; an exact aggregate of 30 children with 4
 * failures, each run and counted once (`aggregate` adds the suite's own checks, `big` makes child 7's result large);
 * a cancel reaching every shard; fail-fast on every shard.
 */
export function shardedParentChecks(o: {
  stack: TestStack;
  parentTool: string;
  /** The processes running the children (their log lines are counted). */
  children: () => readonly ManagedProcess[];
  trace: string;
  never: string;
  big?: boolean;
  aggregate?: (taskId: string, probe: ShardedBatchProbe) => Promise<void>;
}): void {
  let probe: ShardedBatchProbe;
  let mcp: Client;
  const lines = (msg: string, parentId: string) => linesAbout(o.children(), msg, parentId);

  beforeAll(async () => {
    mcp = o.stack.mcp;
    await waitForTools(mcp, o.parentTool, 'shard_child');
    probe = await probeShardedBatch(o.stack);
  });
  afterAll(() => {
    probe?.redis.disconnect();
  });

  it('places the child tool’s three shards on the three masters', async () => {
    expect(probe.codes.every((code) => /^[0-9a-f]{4}$/.test(code))).toBe(true);
    const masters = await clusterMasters(o.stack.cluster);
    expect(new Set(probe.codes.map((code) => masterOfSlot(masters, slotOfCode(code)))).size).toBe(3);
  });

  it('aggregates exactly: every child run and counted once, the failures listed in order, over the three shards', async () => {
    const failing = new Set([3, 10, 17, 24]);
    const items = Array.from({ length: 30 }, (_v, n) => ({
      n,
      delayMs: 30,
      fail: failing.has(n),
      ...(o.big ? { big: n === 7 ? 20_000 : 0 } : {}),
    }));
    // concurrency 8: four windows and more, so the parent's releases (and its children's, §26.3 step 4) re-add and
    // spread every window over the three shards.
    const taskId = await startTask(mcp, o.parentTool, { items, concurrency: 8, tool: 'shard_child' });
    const result = await taskResult(mcp, taskId, 90_000);
    expect(result.structuredContent).toMatchObject({ total: 30, completed: 26, failed: 4, cancelled: 0 });
    const outcomes = (result.structuredContent as { outcomes: Array<{ index: number; status: string }> }).outcomes;
    expect(outcomes.map((x) => x.index)).toEqual(items.map((_v, n) => n));
    expect(outcomes.map((x) => x.status)).toEqual(items.map((i) => (i.fail ? 'failed' : 'completed')));
    // Each child ran once (no worker died), and was counted once.
    expect(traced(o.trace, 'done', 0, 30).sort((a, b) => a - b)).toEqual(items.map((_v, n) => n));
    expect(lines('batch child started', taskId)).toBe(30);
    await o.aggregate?.(taskId, probe);
  });

  const parent = (): ShardedParent => ({
    mcp,
    parentTool: o.parentTool,
    trace: o.trace,
    never: o.never,
    jobShards: probe.jobShards,
    codes: probe.codes,
    stopped: (parentId) => lines('batch child stopped with its batch', parentId),
  });

  it('queues child i on shard i mod 3; a cancel of the parent stops every running child on its shard', () =>
    expectCancelReachesEveryShard(parent()));

  it('fail-fast: the first failure stops the running children on every shard, counted cancelled', () =>
    expectFailFastOnEveryShard(parent()));
}

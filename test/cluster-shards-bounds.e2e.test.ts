/**
 * Issue 45 item 2 and 3 on a real 3-master Redis Cluster in the sharded layout: what holds across a tool's shards,
 * exactly or within the bound docs/SCALING.md §4 states. Each tool of test/fixtures/shard-bounds-tools.mjs runs over
 * three shards and answers with when it started, so the bounds are read from the runs themselves:
 * - concurrency `limit` over N shards: at most limit + N − 1 at once (each shard ⌈limit / N⌉);
 * - a rate of `max` per `perMs` over N shards: at most (max + N − 1) starts per window of the limiters;
 * - fair share: a principal's backlog splits over the shards, and another principal's call is next on each;
 * - the per-principal open-task cap: per shard, so cap × N in all, and refused past it;
 * - idempotency keys and dedupe: exact per tool, whichever gateway is asked; the same key for another tool on
 *   another shard makes another task.
 */
import { describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CancelTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { ROOT } from './helpers/processes.js';
import { uniquePrefix } from './helpers/redis.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const TOOLS = `${ROOT}/test/fixtures/shard-bounds-tools.mjs`;
const SHARDS = 3;
const OPEN_CAP = 2;
const IDEMPOTENCY = 'dev.taskrelay/idempotency-key';
// No braces: the sharded layout (the stack's own prefix is braced, for the single layout).
const PREFIX = uniquePrefix('bounds');
const worker = { TASKRELAY_PREFIX: PREFIX, TASKRELAY_TOOLS: TOOLS, WORKER_CONCURRENCY: '16' };

const stack = useStack({
  name: 'shard-bounds',
  cluster: {},
  tokens: { alice: 'alice-token', bob: 'bob-token', carol: 'carol-token' },
  // The first gateway caps open tasks low, for the cap's test; the second keeps the default, for the others.
  gateways: [{ TASKRELAY_PREFIX: PREFIX, TASKRELAY_MAX_OPEN_TASKS: String(OPEN_CAP) }, { TASKRELAY_PREFIX: PREFIX }],
  workers: [worker, worker],
  hookTimeoutMs: 180_000,
});

interface Run {
  start: number;
  end: number;
}

async function client(principal: string, gateway = 1): Promise<Client> {
  const c = await stack.client(stack.auth(principal), stack.gateways[gateway]?.url);
  await waitFor(async () => (await c.listTools()).tools.some((t) => t.name === 'holdable'), {
    message: 'the tools never reached the gateway',
  });
  return c;
}

async function run(c: Client, tool: string, args: Record<string, unknown>): Promise<Run> {
  const taskId = await startTask(c, tool, args);
  const result = await taskResult(c, taskId, 60_000);
  return result.structuredContent as unknown as Run;
}

/** Most runs in progress at one instant. */
function mostAtOnce(runs: Run[]): number {
  const edges = runs.flatMap((r) => [
    { at: r.start, d: 1 },
    { at: r.end, d: -1 },
  ]);
  // An end before a start at the same millisecond: touching runs do not overlap.
  edges.sort((a, b) => a.at - b.at || a.d - b.d);
  let now = 0;
  let most = 0;
  for (const e of edges) most = Math.max(most, (now += e.d));
  return most;
}

describe('limits across a tool’s 3 shards (docs/SCALING.md §4)', () => {
  it('concurrency 4 over 3 shards: never more than 4 + 3 − 1 runs at once', async () => {
    const alice = await client('alice');
    const runs = await Promise.all(Array.from({ length: 18 }, (_, n) => run(alice, 'capped', { ms: 400, n })));
    const most = mostAtOnce(runs);
    expect(most).toBeLessThanOrEqual(4 + SHARDS - 1);
    expect(most).toBeGreaterThanOrEqual(2);
  });

  it('3 a second over 3 shards: at most 3 + 3 − 1 starts per second of the span', async () => {
    const alice = await client('alice');
    const runs = await Promise.all(Array.from({ length: 12 }, (_, n) => run(alice, 'rated', { ms: 0, n })));
    const starts = runs.map((r) => r.start).sort((a, b) => a - b);
    const span = (starts.at(-1) ?? 0) - (starts[0] ?? 0);
    // Each shard's limiter lets ⌈3 / 3⌉ = 1 start per window, so the span holds at most (max + N − 1) per window
    // it touches (the windows are each shard's own, so a span of k whole windows touches at most k + 1).
    expect(starts.length).toBeLessThanOrEqual((3 + SHARDS - 1) * (Math.floor(span / 1_000) + 1));
  });

  it('fair share holds on every shard: bob’s calls start next, ahead of alice’s backlog', async () => {
    const alice = await client('alice');
    const bob = await client('bob');
    // Alice's 15 calls go round the 3 shards (5 each); each shard runs one at a time.
    const aliceIds = [];
    for (let n = 0; n < 15; n++) aliceIds.push(await startTask(alice, 'fair', { ms: 300, n }));
    await new Promise((resolve) => setTimeout(resolve, 100));
    const bobAt = Date.now();
    const bobIds = [];
    for (let n = 0; n < SHARDS; n++) bobIds.push(await startTask(bob, 'fair', { ms: 300, n: 100 + n }));
    const bobRuns = await Promise.all(bobIds.map(async (id) => (await taskResult(bob, id, 60_000)).structuredContent));
    const aliceRuns = await Promise.all(
      aliceIds.map(async (id) => (await taskResult(alice, id, 60_000)).structuredContent),
    );
    const bobLast = Math.max(...bobRuns.map((r) => (r as unknown as Run).start));
    // Only the runs already under way on a shard, or starting as bob's calls arrive, can start before bob's: at most
    // one per shard. First in, first out would have started alice's whole backlog (12 more) first.
    const ahead = aliceRuns.filter((r) => {
      const start = (r as unknown as Run).start;
      return start > bobAt && start < bobLast;
    }).length;
    expect(ahead).toBeLessThanOrEqual(SHARDS);
  });
});

describe('what spans shards (docs/SCALING.md §4)', () => {
  it('the open-task cap holds per shard: cap × 3 tasks of a 3-shard tool, then refused', async () => {
    const carol = await client('carol', 0);
    const accepted: string[] = [];
    const refused: unknown[] = [];
    for (let n = 0; n < (OPEN_CAP + 1) * SHARDS; n++) {
      try {
        accepted.push(await startTask(carol, 'holdable', { ms: 600_000, n }));
      } catch (error) {
        refused.push(error);
      }
    }
    // Sent one after another through one gateway, the calls go round the shards: each shard takes the cap.
    expect(accepted).toHaveLength(OPEN_CAP * SHARDS);
    expect(refused).toHaveLength(SHARDS);
    for (const error of refused) {
      expect(error).toBeInstanceOf(McpError);
      expect((error as McpError).message).toMatch(/open tasks/i);
    }
    await Promise.all(
      accepted.map((taskId) => carol.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema)),
    );
  });

  it('an idempotency key names one task of a 3-shard tool, from either gateway; another tool makes its own', async () => {
    const [viaFirst, viaSecond] = [await client('alice', 0), await client('alice', 1)];
    const key = `bounds-${Date.now()}`;
    const first = await startTask(viaSecond, 'capped', { ms: 50 }, { meta: { [IDEMPOTENCY]: key } });
    for (let i = 0; i < 4; i++) {
      const via = i % 2 === 0 ? viaFirst : viaSecond;
      expect(await startTask(via, 'capped', { ms: 50 }, { meta: { [IDEMPOTENCY]: key } })).toBe(first);
    }
    // The documented bound: keys are kept per shard, so the same key for another tool on its own shard is not
    // refused as in the single layout; it makes a task of its own.
    const other = await startTask(viaSecond, 'single', { ms: 0 }, { meta: { [IDEMPOTENCY]: key } }).catch(
      (e: unknown) => e,
    );
    if (typeof other === 'string') expect(other).not.toBe(first);
    else expect((other as McpError).message).toMatch(/Idempotency key already used/);
  });

  it('dedupe joins a repeat of an unfinished call on a 3-shard tool, whichever gateway is asked', async () => {
    const [viaFirst, viaSecond] = [await client('bob', 0), await client('bob', 1)];
    const args = { ms: 2_000, n: Date.now() };
    const first = await startTask(viaSecond, 'deduped', args);
    expect(await startTask(viaFirst, 'deduped', args)).toBe(first);
    expect(await startTask(viaSecond, 'deduped', args)).toBe(first);
    // Other arguments are another call.
    expect(await startTask(viaSecond, 'deduped', { ...args, n: args.n + 1 })).not.toBe(first);
  });
});

/**
 * PROTOCOL.md §26.6 (issue 23, item 6): a batch is fair to others. With authentication on, one principal's batch of
 * 1,200 slow children keeps every slot of the pool busy for a minute; another principal's single task on the same
 * pool must start after at most a few more of those children (one per busy slot and one per slot taken as its job is
 * added), never behind the batch's queued window. And a batch's open children count toward its principal's open-work
 * cap (`TASKRELAY_MAX_OPEN_TASKS`): its window shrinks to what the cap leaves, the principal's next call is refused
 * while they are open, and accepted again once they are done.
 *
 * Order is read from the trace file the fixture appends to synchronously (`<pid> start <n>` before a child's work),
 * counted in starts, never in time.
 */
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { CancelTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import {
  ROOT,
  connectClient,
  startGatewayProcess,
  startWorkerProcess,
  type GatewayProcess,
} from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
/** The open-work cap a batch has when its job carries none (authentication off): the gateway's default cap. */
const DEFAULT_BATCH_OPEN_CAP = 1_000;
const TOKENS = { alice: 'alice-token', bob: 'bob-token' };
/** The pool's slots: one worker of four. */
const SLOTS = 4;
/**
 * Alice's children that may start after bob's job is in the queue and before bob's task starts: the one each slot
 * already holds (a worker traces a start a little after BullMQ hands it the job) and the one each slot may take in
 * the instant before bob's add reaches Redis (PROTOCOL.md §25's bound). Without fair share bob waits behind the
 * batch's whole queued window (64 here) and every window released after his add.
 */
const AHEAD_BOUND = 2 * SLOTS;
/** Bob's marker in the trace: children are numbered from 0. */
const BOB_N = -1;

let redis: TestRedis;
let admin: Redis;
const traceDir = mkdtempSync(join(tmpdir(), 'batch-fair-'));

interface Stack {
  gateway: GatewayProcess;
  prefix: string;
  trace: string;
}

const stacks: TestStack[] = [];

/** A stack of its own prefix on the run's Redis: a gateway (authentication on, the given open-work cap), a worker. */
async function startFairStack(name: string, maxOpenTasks: number): Promise<Stack> {
  const trace = join(traceDir, `${name}.trace`);
  const stack = await startStack({
    name,
    tokens: TOKENS,
    gateways: [{ TASKRELAY_MAX_OPEN_TASKS: String(maxOpenTasks), LOG_LEVEL: 'warn' }],
    workers: [
      {
        TASKRELAY_TOOLS: BATCH_TOOLS,
        TASKRELAY_QUEUE: 'batch',
        WORKER_CONCURRENCY: String(SLOTS),
        BATCH_TRACE_FILE: trace,
        LOG_LEVEL: 'info',
      },
    ],
  });
  stacks.push(stack);
  return { gateway: stack.gateway, prefix: stack.prefix, trace };
}

/** The trace's start lines, in the order the runs wrote them: each is the item's `n`. */
function starts(trace: string): number[] {
  if (!existsSync(trace)) return [];
  return readFileSync(trace, 'utf8')
    .split('\n')
    .map((line) => /^\d+ start (-?\d+)$/.exec(line)?.[1])
    .filter((n): n is string => n !== undefined)
    .map(Number);
}

const client = (gw: GatewayProcess, principal: string) =>
  connectClient(gw.url, { authorization: `Bearer ${principal}-token` });

beforeAll(async () => {
  redis = await startRedis();
  admin = new Redis(redis.url);
});

afterAll(async () => {
  admin?.disconnect();
  await Promise.all(stacks.map((s) => s.stop()));
  await redis?.stop();
});

describe('§26.6 a batch is fair to other principals', () => {
  it("another principal's single task starts within a few of 1,200 queued children", async () => {
    const { gateway, trace } = await startFairStack('batch-fair', 1_000);
    const alice = await client(gateway, 'alice');
    const bob = await client(gateway, 'bob');
    // 1,200 children of 200 ms on 4 slots: a minute of work, a window of 64 queued at a time.
    const items = Array.from({ length: 1_200 }, (_v, n) => ({ n, delayMs: 200 }));
    const batchId = await startTask(alice, 'fan_out', { items, concurrency: 64 });
    // The batch has filled every slot and moved through a few windows.
    await waitFor(() => starts(trace).length >= 100, { timeoutMs: 60_000, message: 'the batch did not get going' });

    // Bob's job is in the queue once his create is answered (the gateway adds it first): starts traced after this
    // point are the children that went after his add, or at most one per slot that took a job just before it.
    await startTask(bob, 'maybe_fail', { n: BOB_N, delayMs: 100 });
    const before = starts(trace).length;
    const all = await waitFor(
      () => {
        const s = starts(trace);
        return s.includes(BOB_N) ? s : undefined;
      },
      { timeoutMs: 30_000, message: "bob's task did not start" },
    );
    const bobAt = all.indexOf(BOB_N);
    // On a loaded machine bob's run may be traced before this test reads the trace after his create answered: then
    // no child of alice's went ahead of him after that point.
    const ahead = bobAt < before ? 0 : all.slice(before, bobAt).filter((n) => n >= 0).length;
    expect(ahead, "alice's children started between bob's add and bob's start").toBeLessThanOrEqual(AHEAD_BOUND);
    // Alice's batch still had most of its children to run: bob did not simply wait for it to drain.
    expect(all.filter((n) => n >= 0).length).toBeLessThan(items.length / 2);

    await alice.request({ method: 'tasks/cancel', params: { taskId: batchId } }, CancelTaskResultSchema);
    await alice.close();
    await bob.close();
  }, 120_000);

  it("a batch's children count toward its principal's open-work cap", async () => {
    const cap = 10;
    const { gateway, prefix, trace } = await startFairStack('batch-cap', cap);
    const keys = createKeys(prefix);
    const alice = await client(gateway, 'alice');
    const bob = await client(gateway, 'bob');
    // Every child waits at the gate until the test opens it, so the first window stays open while it is read.
    const gate = join(traceDir, 'batch-cap.gate');
    const items = Array.from({ length: 60 }, (_v, n) => ({ n, gate }));
    // Concurrency 64 asked for; the cap leaves the batch 9 (the parent task is alice's tenth open piece of work).
    const batchId = await startTask(alice, 'fan_out', { items, concurrency: 64 });
    const batch = keys.batch(batchId);
    await waitFor(() => starts(trace).length === SLOTS, { timeoutMs: 20_000, message: 'children did not start' });
    expect(Number(await admin.hget(batch.hash, 'window')), 'the window the cap leaves').toBe(cap - 1);
    expect(await admin.scard(batch.open), 'children queued or running').toBe(cap - 1);
    expect(await admin.zcard(keys.principalOpenTasks('alice')), "alice's open work").toBe(cap);

    // Alice is at her cap: her next call is refused; bob's is accepted (his own cap).
    const refused = await startTask(alice, 'maybe_fail', { n: -2 }).then(
      () => 'accepted',
      (error: unknown) => String(error),
    );
    expect(refused).toMatch(/Too many open tasks/);
    const bobTask = await startTask(bob, 'maybe_fail', { n: -3 });

    // The gate opens: the batch runs to its end, never with more open work than the cap.
    let most = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        most = Math.max(most, await admin.zcard(keys.principalOpenTasks('alice')));
        most = Math.max(most, (await admin.scard(batch.open)) + 1);
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    })();
    writeFileSync(gate, '');
    const result = await taskResult(alice, batchId, 90_000);
    sampling = false;
    await sampler;
    expect(result.structuredContent).toMatchObject({ total: 60, completed: 60, failed: 0 });
    expect(most, "alice's open work (the parent and its open children)").toBeLessThanOrEqual(cap);
    expect(starts(trace).filter((n) => n >= 0)).toHaveLength(60);
    expect((await taskResult(bob, bobTask, 30_000)).isError).toBeFalsy();

    // The batch is done: its children no longer count, and alice may call again.
    const again = await startTask(alice, 'maybe_fail', { n: -4 });
    expect((await taskResult(alice, again, 30_000)).isError).toBeFalsy();
    await alice.close();
    await bob.close();
  }, 150_000);
});

describe('§26.6 batches with authentication off', () => {
  it('hold the anonymous principal to the default open-work cap across its batches', async () => {
    const prefix = uniquePrefix('batch-anon');
    const keys = createKeys(prefix);
    const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: prefix };
    const gateway = await startGatewayProcess({ ...env, LOG_LEVEL: 'warn' });
    // Parents on one pool; their build_report children on the demo workers' pool, 20 s each: none ends in the test.
    await startWorkerProcess({
      ...env,
      TASKRELAY_TOOLS: BATCH_TOOLS,
      TASKRELAY_QUEUE: 'batch',
      WORKER_CONCURRENCY: '4',
    });
    await startWorkerProcess({ ...env, WORKER_CONCURRENCY: '2' });
    const anon = await connectClient(gateway.url);
    // Three batches asking for 600 children in flight each: 1,800 without a cap.
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      ids.push(await startTask(anon, 'fan_reports', { count: 700, items: 200, delayMs: 100, concurrency: 600 }));
    }
    const windows = await waitFor(
      async () => {
        // `released` moves in the release itself (the window is the concurrency until the first release).
        const hashes = await Promise.all(ids.map((id) => admin.hmget(keys.batch(id).hash, 'released', 'window')));
        return hashes.every(([released]) => Number(released) > 0) ? hashes.map(([, w]) => Number(w)) : undefined;
      },
      { timeoutMs: 30_000, message: 'every batch released its children' },
    );
    const owner = (await admin.hget(keys.batch(ids[0] as string).hash, 'owner')) ?? '';
    const openWork = keys.principalOpenTasks(owner);
    const open = await Promise.all(ids.map((id) => admin.scard(keys.batch(id).open)));
    // Released one after the other, atomically: 600, then what the cap leaves (400), then the minimum of 1.
    expect([...windows].sort((a, b) => b - a)).toEqual([DEFAULT_BATCH_OPEN_CAP - 400, 400, 1]);
    expect(open.reduce((a, b) => a + b, 0)).toBe(DEFAULT_BATCH_OPEN_CAP + 1);
    expect(await admin.zcard(openWork)).toBe(DEFAULT_BATCH_OPEN_CAP + 1);
    expect(await admin.pttl(openWork), 'the open-work set expires even with no gateway counting it').toBeGreaterThan(0);

    // Cancelled, the batches leave nothing counted.
    for (const taskId of ids) {
      await anon.request({ method: 'tasks/cancel', params: { taskId } }, CancelTaskResultSchema);
    }
    await waitFor(async () => (await admin.zcard(openWork)) === 0, {
      timeoutMs: 30_000,
      message: 'the cancelled batches left children in the open work',
    });
    await anon.close();
  }, 120_000);
});

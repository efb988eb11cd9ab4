/**
 * PROTOCOL.md §25: fair share of a pool across principals. One principal's backlog (tasks or fire-and-forget plain
 * calls) must not hold another principal's task behind it for more than about one job run per busy slot, and plain
 * calls count toward the open-work cap. Ordering is read from the task hashes' `startedAt` (what each run recorded),
 * bounded in job counts, never in time.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import {
  FIXTURE_TOOLS,
  startGatewayProcess,
  startWorkerProcess,
  stopAll,
  type GatewayProcess,
} from './helpers/processes.js';
import { initSession } from './helpers/raw-mcp.js';
import { waitFor } from './helpers/wait-for.js';

const TOKENS = 'alice:alice-token,bob:bob-token';
/** Two slots: a busy pool, where a FIFO queue would make bob wait for every job alice queued before him. */
const SLOTS = 2;
/**
 * Alice's jobs that may record their start after bob's job was added and before bob's task starts: the job each slot
 * already holds (a loaded worker records a start a little after BullMQ hands it the job), and the one each slot may
 * take in the instant before bob's add reaches Redis. A first-in-first-out pool starts her whole backlog first.
 */
const AHEAD_BOUND = 2 * SLOTS;
/** Bob's task runs long enough for its job (removed once complete) to be read while it runs. */
const BOB_TASK_MS = 3_000;

let redis: TestRedis;
let admin: Redis;

interface Stack {
  gateway: GatewayProcess;
  prefix: string;
}

async function startStack(name: string, maxOpenTasks: number): Promise<Stack> {
  const prefix = uniquePrefix(name);
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: prefix };
  const gateway = await startGatewayProcess({
    ...env,
    TASKRELAY_AUTH_TOKENS: TOKENS,
    TASKRELAY_MAX_OPEN_TASKS: String(maxOpenTasks),
    LOG_LEVEL: 'warn',
  });
  await startWorkerProcess({
    ...env,
    TASKRELAY_TOOLS: FIXTURE_TOOLS,
    WORKER_CONCURRENCY: String(SLOTS),
    LOG_LEVEL: 'info',
  });
  return { gateway, prefix };
}

type RpcBody = { result?: any; error?: { code: number; message: string; data?: any } };

async function session(gw: GatewayProcess, principal: string) {
  const auth = { authorization: `Bearer ${principal}-token` };
  const { headers } = await initSession(gw.url, auth, 'fair');
  let nextId = 1;
  return {
    /** Sends one request; resolves with its HTTP response (the body unread). */
    send(method: string, params: unknown, signal?: AbortSignal) {
      return fetch(gw.url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, method, params }),
        signal: signal ?? null,
      });
    },
    async call(method: string, params: unknown): Promise<RpcBody> {
      return rpcBody(await this.send(method, params));
    },
  };
}

async function rpcBody(res: Response): Promise<RpcBody> {
  const text = await res.text();
  if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) return JSON.parse(text) as RpcBody;
  const messages = text
    .split('\n\n')
    .map((block) =>
      block
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trim())
        .join(''),
    )
    .filter((data) => data.startsWith('{'))
    .map((data) => JSON.parse(data) as RpcBody & { id?: unknown });
  const answer = messages.find((m) => m.id !== undefined);
  if (!answer) throw new Error(`no answer in ${text}`);
  return answer;
}

const sleepyTask = (ms: number) => ({ name: 'sleepy', arguments: { ms, stepMs: ms }, task: { ttl: 120_000 } });

/**
 * When the gateway added the task's job to its pool (BullMQ's job `timestamp`), read while the job still runs. The
 * bound is counted from there, not from the create: a gateway busy with thousands of requests may take a while
 * between storing a task and adding its job, and the queue's order is what fair share decides.
 */
async function queuedAt(prefix: string, taskId: string): Promise<number> {
  const queue = await admin.hget(`${prefix}:task:${taskId}`, 'queue');
  const timestamp = await admin.hget(`${prefix}:q-${queue}:${taskId}`, 'timestamp');
  if (!timestamp) throw new Error(`no job for task ${taskId}`);
  return Number(timestamp);
}

async function startedAt(prefix: string, taskId: string): Promise<number | undefined> {
  const value = await admin.hget(`${prefix}:task:${taskId}`, 'startedAt');
  return value ? Date.parse(value) : undefined;
}

/** How many of `ids` started after `from` and before `until` (ms), from their hashes' `startedAt`. */
async function startedBetween(prefix: string, ids: string[], from: number, until: number): Promise<number> {
  const pipeline = admin.pipeline();
  for (const id of ids) pipeline.hget(`${prefix}:task:${id}`, 'startedAt');
  const values = ((await pipeline.exec()) ?? []).map(([, v]) => (typeof v === 'string' ? Date.parse(v) : NaN));
  return values.filter((t) => t > from && t < until).length;
}

beforeAll(async () => {
  redis = await startRedis();
  admin = new Redis(redis.url);
});

afterAll(async () => {
  admin?.disconnect();
  await stopAll();
  await redis?.stop();
});

describe('25. fair share of a pool across principals', () => {
  it("another principal's task starts within about one job run per slot of 300 queued tasks", async () => {
    const { gateway, prefix } = await startStack('fair-tasks', 1_000);
    const alice = await session(gateway, 'alice');
    const bob = await session(gateway, 'bob');
    const aliceIds: string[] = [];
    for (let i = 0; i < 300; i++) {
      const created = await alice.call('tools/call', sleepyTask(100));
      const taskId = created.result?.task?.taskId as string | undefined;
      expect(taskId, JSON.stringify(created)).toBeTypeOf('string');
      aliceIds.push(taskId!);
    }
    const created = await bob.call('tools/call', sleepyTask(BOB_TASK_MS));
    const bobId = created.result?.task?.taskId as string;
    expect(bobId, JSON.stringify(created)).toBeTypeOf('string');
    const bobStartedAt = await waitFor(() => startedAt(prefix, bobId), {
      timeoutMs: 40_000,
      message: "bob's task did not start",
    });
    const bobQueuedAt = await queuedAt(prefix, bobId);
    const ahead = await startedBetween(prefix, aliceIds, bobQueuedAt, bobStartedAt);
    const waiting = (await startedBetween(prefix, aliceIds, 0, Number.MAX_SAFE_INTEGER)) < aliceIds.length;
    expect(waiting, 'alice still had a backlog when bob started').toBe(true);
    expect(ahead, `alice's jobs that started while bob's task waited`).toBeLessThanOrEqual(AHEAD_BOUND);
    // Bob sees his task finish while alice's backlog is still running.
    const done = await waitFor(
      async () => {
        const r = await bob.call('tasks/get', { taskId: bobId });
        return r.result?.status === 'completed' ? r : undefined;
      },
      { timeoutMs: 20_000 },
    );
    expect(done.result.status).toBe('completed');
  });

  it(
    "3,000 fire-and-forget plain calls meet the open-work cap and do not hold another principal's task",
    {
      timeout: 240_000,
    },
    async () => {
      const cap = 100;
      const { gateway, prefix } = await startStack('fair-calls', cap);
      const alice = await session(gateway, 'alice');
      const bob = await session(gateway, 'bob');
      let refused = 0;
      let completed = 0;
      let sent = 0;
      // Fire and forget: 3,000 calls from 300 connections at once (more would overflow the listen backlog). A refused
      // call is answered at once; an accepted one holds its connection until it ends.
      const senders = Array.from({ length: 300 }, async () => {
        while (sent < 3_000) {
          sent += 1;
          const body = await alice.call('tools/call', { name: 'sleepy', arguments: { ms: 100, stepMs: 100 } });
          if (body.error?.data?.code === 'TOO_MANY_OPEN_TASKS') refused += 1;
          else if (body.result?.structuredContent?.ms === 100) completed += 1;
          else throw new Error(`unexpected answer ${JSON.stringify(body)}`);
        }
      });
      const sending = Promise.all(senders);
      sending.catch(() => undefined); // awaited below; a failed assertion before then must not leave it unhandled
      // Halfway through, alice holds as many unfinished calls as the cap lets her, and no more.
      await waitFor(() => sent >= 1_500 && refused > 0, { timeoutMs: 120_000, intervalMs: 50 });
      // Alice's calls are internal tasks, listed in her open-work set (which drops ended ones when it meets the cap).
      const openIds = await admin.zrange(`${prefix}:principal:alice:open`, 0, -1);
      const statuses = await Promise.all(openIds.map((id) => admin.hget(`${prefix}:task:${id}`, 'status')));
      const queued = openIds.filter((_id, i) => statuses[i] === 'working' || statuses[i] === 'input_required');
      const unfinished = queued.length;
      expect(unfinished, "alice's unfinished calls").toBeGreaterThan(cap / 2);
      expect(unfinished, "alice's unfinished calls").toBeLessThanOrEqual(cap);

      const created = await bob.call('tools/call', sleepyTask(BOB_TASK_MS));
      const bobId = created.result?.task?.taskId as string;
      expect(bobId, JSON.stringify(created)).toBeTypeOf('string');
      const bobStartedAt = await waitFor(() => startedAt(prefix, bobId), {
        timeoutMs: 60_000,
        message: "bob's task did not start",
      });
      const bobQueuedAt = await queuedAt(prefix, bobId);
      // Only calls unfinished before bob's task can start ahead of it (a call's hash outlives it by 10 s).
      const ahead = await startedBetween(prefix, queued, bobQueuedAt, bobStartedAt);
      expect(ahead, `alice's calls that started while bob's task waited`).toBeLessThanOrEqual(AHEAD_BOUND);

      await sending;
      expect(refused + completed).toBe(3_000);
      expect(refused).toBeGreaterThan(0);
    },
  );
});

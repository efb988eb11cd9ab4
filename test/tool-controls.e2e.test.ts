/**
 * PROTOCOL.md §3.3 (issue 30 items 2, 3, 5, 8): controls on a tool's queue, across real processes (a gateway, two
 * workers of test/fixtures/limited-tools.mjs, Redis).
 * - `concurrency: 2` holds across both workers; a queued run says what it waits for; a SIGKILLed holder's slot comes
 *   back within the lock duration.
 * - `rateLimit: { max: 2, perMs: 1000 }` holds across both workers, in any second (not only BullMQ's fixed windows).
 * - An operator's pause holds a tool's calls (accepted, queued, saying so) through a worker restart, shows in
 *   `tools/list`, `taskrelay tools`, `/admin/api/tools` and the metrics, and its calls run on resume.
 */
import { resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { Redis } from 'ioredis';
import { runCli } from './helpers/cli.js';
import { useStack } from './helpers/stack.js';
import { ROOT, readMetric, type GatewayProcess, type ManagedProcess } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { mostAtOnce, runEvents } from './helpers/run-events.js';
import { waitFor } from './helpers/wait-for.js';
import { absenceWindow } from './helpers/load.js';
import { expectStartsLogged, redisNowMs, startedTakes, takesByJob, watchStartLog } from './helpers/rate-starts.js';

const TOOLS = resolve(ROOT, 'test/fixtures/limited-tools.mjs');

const stack = useStack({
  name: 'ctl',
  redis: { owned: true },
  workerEnv: {
    TASKRELAY_TOOLS: TOOLS,
    WORKER_CONCURRENCY: '4',
    WORKER_LOCK_DURATION_MS: '2000',
    WORKER_HEARTBEAT_MS: '500',
  },
  workers: [{}, {}],
  mcp: true,
});
let r: Redis;
let prefix: string;
let gateway: GatewayProcess;
let client: Client;
let workers: ManagedProcess[];

beforeAll(() => {
  ({ r, prefix, gateway, mcp: client } = stack);
  workers = [...stack.workers];
});

const events = (tool: string) => runEvents(r, `${prefix}:ctl:events`, tool);

const statusOf = (taskId: string) => client.experimental.tasks.getTask(taskId);

describe('§3.3 a tool concurrency limit', () => {
  it('holds across the fleet; a queued run says it waits for a slot', async () => {
    const ids = await Promise.all(Array.from({ length: 8 }, () => startTask(client, 'limited', { ms: 400 })));
    // While two run, the others wait; a waiting one says why (the gateway reads the queue's state each second).
    await waitFor(
      async () => {
        const messages = await Promise.all(ids.map(async (id) => (await statusOf(id)).statusMessage ?? ''));
        return messages.some((m) => /^Waiting for a slot: tool limited runs at most 2 at once/.test(m));
      },
      { timeoutMs: 5_000, message: 'no queued run said it waits for a slot' },
    );
    for (const id of ids) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
    const list = await events('limited');
    expect(list.filter((e) => e.e === 'start')).toHaveLength(8);
    // Either worker alone could run 4 at once (WORKER_CONCURRENCY); which of them takes which run is BullMQ's.
    expect(mostAtOnce(list)).toBe(2);
  }, 60_000);

  it('gives a SIGKILLed holder’s slots back within the lock duration', async () => {
    await r.del(`${prefix}:ctl:events`);
    const [victim, other] = workers as [ManagedProcess, ManagedProcess];
    await other.kill('SIGTERM');
    // Both fleet-wide slots held by long runs on the victim.
    const held = await Promise.all([
      startTask(client, 'limited', { ms: 60_000 }),
      startTask(client, 'limited', { ms: 60_000 }),
    ]);
    const heldStarts = async () => (await events('limited')).filter((e) => e.e === 'start' && held.includes(e.taskId));
    await waitFor(async () => (await heldStarts()).length === 2);
    expect(new Set((await heldStarts()).map((e) => e.pid))).toEqual(new Set([victim.pid]));
    const survivor = await stack.addWorker();
    const third = await startTask(client, 'limited', { ms: 100 });
    await absenceWindow(500);
    expect((await events('limited')).some((e) => e.taskId === third)).toBe(false);
    await victim.kill('SIGKILL');
    // Their tasks end; their jobs still count as running until BullMQ's stall check (every lock/6) puts them back,
    // where they end at once. Then the third gets a slot.
    for (const id of held) await client.experimental.tasks.cancelTask(id);
    expect((await taskResult(client, third, 20_000)).isError).toBeFalsy();
    const thirdStart = (await events('limited')).find((e) => e.taskId === third && e.e === 'start');
    expect(thirdStart?.pid).toBe(survivor.pid);
    workers = [survivor, await stack.addWorker()];
  }, 60_000);
});

describe('§3.3 a tool rate limit', () => {
  const EVENTS = () => `${prefix}:q-default~throttled:events`;
  const takes = (ids: string[]) => startedTakes(r, EVENTS(), ids);
  /** Runs `body` while the tool's start log is watched; then checks every run's start as the limit counted it. */
  const watched = async (body: () => Promise<string[]>) => {
    const log = watchStartLog(r, prefix, 'throttled');
    let ids: string[] = [];
    try {
      ids = await body();
    } finally {
      const counted = await log.stop();
      if (ids.length > 0)
        expect(expectStartsLogged(counted, await takesByJob(r, EVENTS(), ids), 2, 1_000)).toHaveLength(ids.length);
    }
  };

  it('holds across the fleet: at most 2 starts in any second', async () => {
    await watched(async () => {
      const ids = await Promise.all(Array.from({ length: 6 }, () => startTask(client, 'throttled', { ms: 0 })));
      for (const id of ids) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
      expect((await events('throttled')).filter((e) => e.e === 'start' && ids.includes(e.taskId))).toHaveLength(6);
      return ids;
    });
  }, 60_000);

  it('holds in any second, also across BullMQ’s fixed window edge', async () => {
    // BullMQ's window opens at the first take (a); a second take 600 ms in (b) fills it; more queued at 900 ms
    // (c, d, …) would be taken two at once as the window ends at 1,000 ms: b, c and d within about 400 ms (seen 393
    // without the start log). The log lets c start then, and d only once b leaves, 1,000 ms after b.
    const started = async (id: string) =>
      waitFor(async () => (await events('throttled')).some((x) => x.e === 'start' && x.taskId === id), {
        timeoutMs: 10_000,
        message: `run of ${id} never started`,
      });
    await watched(async () => {
      const a = await startTask(client, 'throttled', { ms: 0 });
      await started(a);
      const [aTaken] = await takes([a]);
      await sleep(Math.max(0, aTaken! + 600 - (await redisNowMs(r))));
      const b = await startTask(client, 'throttled', { ms: 0 });
      await started(b);
      await sleep(300);
      const later: string[] = [];
      for (let i = 0; i < 4; i++) later.push(await startTask(client, 'throttled', { ms: 0 }));
      const all = [a, b, ...later];
      for (const id of all) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
      return all;
    });
  }, 60_000);
});

describe('§3.4 back off when the upstream says so', () => {
  it('ends the run without an attempt, says why and until when, and runs again after the wait', async () => {
    const taskId = await startTask(client, 'back_off_once', { ms: 1_500 });
    await waitFor(
      async () => /^Backing off until \S+: quota exhausted$/.test((await statusOf(taskId)).statusMessage ?? ''),
      { message: 'the backing-off task never said so' },
    );
    expect((await statusOf(taskId)).status).toBe('working');
    // attempts: 1, yet the second run completes: the back-off used none.
    const result = await taskResult(client, taskId, 20_000);
    expect(result.structuredContent).toEqual({ attempt: 2 });
    const starts = (await events('back_off_once')).filter((e) => e.taskId === taskId).map((e) => e.at);
    expect(starts).toHaveLength(2);
    expect(starts[1]! - starts[0]!).toBeGreaterThanOrEqual(1_400);
    // The back-off's message went when the next run started.
    expect((await statusOf(taskId)).statusMessage ?? '').not.toMatch(/Backing off/);
  }, 30_000);
});

describe('§3.3 pause and resume a tool', () => {
  it('holds its calls through a worker restart, says so everywhere, and runs them on resume', async () => {
    const cli = (...args: string[]) => runCli(['--url', gateway.url, ...args]);
    const paused = await cli('pause', 'free');
    expect(paused.stdout, paused.stderr).toMatch(/^free: paused/);
    expect(paused.code).toBe(0);
    const ids = await Promise.all(Array.from({ length: 3 }, () => startTask(client, 'free', { ms: 0 })));
    // Accepted and queued; nothing starts; the task says why.
    await waitFor(async () => /paused/.test((await statusOf(ids[0]!)).statusMessage ?? ''), {
      message: 'a paused tool’s task never said so',
    });
    // The pause is in Redis: a worker restart keeps it.
    const [first, second] = workers as [ManagedProcess, ManagedProcess];
    await first.kill('SIGTERM');
    workers = [second, await stack.addWorker()];
    await absenceWindow(1_000);
    expect(await events('free')).toEqual([]);
    expect((await statusOf(ids[0]!)).status).toBe('working');

    const listed = await client.listTools();
    expect(listed.tools.find((t) => t.name === 'free')?._meta?.['dev.taskrelay/controls']).toEqual({ paused: true });
    expect(listed.tools.find((t) => t.name === 'limited')?._meta?.['dev.taskrelay/controls']).toEqual({
      paused: false,
      concurrency: 2,
    });
    const tools = await cli('tools');
    expect(tools.stdout).toMatch(/^free\s+optional\s+\[paused\] Sleeps ms\./m);
    expect(tools.stdout).toMatch(/^throttled\s+optional\s+\[2 per 1000 ms\] /m);
    expect(tools.stdout).toMatch(/^urgent\s+optional\s+\[priority 2\] Sleeps ms; priority level 2\.$/m);
    const admin = (await (await fetch(gateway.url.replace(/\/mcp$/, '/admin/api/tools'))).json()) as {
      tools: Array<{ name: string; paused: boolean; waiting: number }>;
    };
    expect(admin.tools.find((t) => t.name === 'free')).toMatchObject({ paused: true, waiting: 3 });
    expect(await readMetric(gateway.url, 'taskrelay_tool_paused', { tool: 'free' })).toBe(1);
    expect(await readMetric(gateway.url, 'taskrelay_runs_waiting', { tool: 'free', reason: 'paused' })).toBe(3);

    const resumed = await cli('resume', 'free');
    expect(resumed.stdout).toMatch(/^free: resumed/);
    for (const id of ids) expect((await taskResult(client, id, 20_000)).isError).toBeFalsy();
    expect((await events('free')).filter((e) => e.e === 'start')).toHaveLength(3);
  }, 60_000);

  it('refuses an unknown tool with a clear error, and a cross-origin switch', async () => {
    const unknown = await runCli(['--url', gateway.url, 'pause', 'nope']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/^taskrelay: unknown tool nope/);
    const cross = await fetch(gateway.url.replace(/\/mcp$/, '/admin/api/tools/free/pause'), {
      method: 'POST',
      headers: { origin: 'http://evil.example' },
    });
    expect(cross.status).toBe(403);
  });
});

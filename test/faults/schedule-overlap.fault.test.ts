/**
 * Issue 48 item 7, PROTOCOL.md §33.2 (4, 5): schedules with `overlap` through a gateway kill. Two gateways share the
 * firings; one is SIGKILLed while a `queue` schedule holds a waiting firing and a `skip` schedule's run is on. The
 * firings go on on the other gateway, the runs of each schedule never overlap, and each firing makes at most one
 * task: every task a schedule made ran once, and the schedule counts each of them.
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/processes.js';
import { startStack, type TestStack } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait-for.js';
import { absenceWindow } from '../helpers/load.js';

/** Each run lasts this long; the schedules fire every second, so every firing meets a run that is on. */
const RUN_MS = 2_500;

let stack: TestStack;

const base = (i: number) => stack.gateways[i]!.url.replace(/\/mcp$/, '');

async function api(path: string, init: RequestInit = {}, gateway = 1) {
  const res = await fetch(`${base(gateway)}${path}`, {
    ...init,
    headers: { Authorization: 'Bearer ops-token', ...(init.body ? { 'content-type': 'application/json' } : {}) },
  });
  return (await res.json()) as Record<string, any>;
}

async function starts(label: string): Promise<number[]> {
  return (await stack.r.lrange(`${stack.prefix}:sched:starts:${label}`, 0, -1)).map(Number);
}

async function tasksOf(id: string): Promise<Array<Record<string, any>>> {
  return (
    (await api(`/admin/api/tasks?tag=schedule:${id}&limit=200`))['tasks'] as Array<Record<string, any>>
  ).reverse();
}

beforeAll(async () => {
  stack = await startStack({
    name: 'f-sched',
    redis: { owned: true },
    env: { TASKRELAY_AUTH_TOKENS: 'ops:ops-token', TASKRELAY_OPERATORS: 'ops' },
    gateways: [{}, {}],
    workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/schedule-tools.mjs'), WORKER_CONCURRENCY: '4' }],
  });
}, 60_000);

afterAll(async () => {
  await stack?.stop();
});

describe('schedules with overlap through a gateway kill', () => {
  it('keep firing on the other gateway, never overlap their runs, and make one task per firing', async () => {
    for (const overlap of ['queue', 'skip'] as const) {
      await api('/admin/api/schedules', {
        method: 'POST',
        body: JSON.stringify({
          id: `kill-${overlap}`,
          tool: 'tick',
          arguments: { label: overlap, ms: RUN_MS },
          cron: '* * * * * *',
          overlap,
        }),
      });
    }
    // The queue schedule holds a waiting firing, and each schedule has run: the kill lands mid-flow.
    await waitFor(
      async () =>
        (await starts('queue')).length >= 2 &&
        (await starts('skip')).length >= 2 &&
        (await stack.r.hget(`${stack.prefix}:schedule:kill-queue`, 'waiting')) !== null,
      { timeoutMs: 30_000, message: 'the schedules did not get going' },
    );
    const killedAt = Date.now();
    await stack.gateways[0]!.kill('SIGKILL');

    // A firing the killed gateway held waits for its 10 s lock; then the other gateway goes on.
    await waitFor(
      async () =>
        (await starts('queue')).filter((t) => t > killedAt).length >= 3 &&
        (await starts('skip')).filter((t) => t > killedAt).length >= 3,
      { timeoutMs: 60_000, message: 'the schedules stopped firing after the gateway kill' },
    );
    for (const overlap of ['queue', 'skip'])
      await api(`/admin/api/schedules/kill-${overlap}/pause`, { method: 'POST', body: '{}' });
    // A firing taken just before the pause may still start its run.
    await absenceWindow(1_500);
    await waitFor(async () => (await tasksOf('kill-queue')).every((t) => t['status'] !== 'working'), {
      timeoutMs: 30_000,
    });
    await waitFor(async () => (await tasksOf('kill-skip')).every((t) => t['status'] !== 'working'), {
      timeoutMs: 30_000,
    });

    for (const overlap of ['queue', 'skip']) {
      const runStarts = await starts(overlap);
      for (let i = 1; i < runStarts.length; i++) {
        expect(runStarts[i]! - runStarts[i - 1]!, `${overlap}: runs ${i - 1} and ${i} overlap`).toBeGreaterThanOrEqual(
          RUN_MS - 100,
        );
      }
      const tasks = await tasksOf(`kill-${overlap}`);
      // One run per task, and no task of a firing made twice (a duplicate would have run too, overlapping).
      expect(tasks.length, overlap).toBe(runStarts.length);
      for (const t of tasks) expect(t['status'], overlap).toBe('completed');
      const schedule = (await api(`/admin/api/schedules/kill-${overlap}`))['schedule'] as Record<string, any>;
      expect(schedule['runs'], overlap).toBe(tasks.length);
    }
  }, 180_000);
});

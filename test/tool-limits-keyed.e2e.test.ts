/**
 * PROTOCOL.md §3.5 (issue 30 items 2, 3, 4): limits per key and shared by name, admitted by the workers, across real
 * processes (a gateway, two workers of test/fixtures/keyed-tools.mjs, Redis).
 * - `concurrency: { limit: 1, key: ['tenant'] }` holds per tenant across both workers while two tenants run side by
 *   side; a waiting run says so; a SIGKILLed holder's slot comes back within the lock duration.
 * - Two tools sharing `rateLimit.name` start at most `max` in any `perMs` between them.
 * - A back-off of one tool holds the shared limit for the other.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { Redis } from 'ioredis';
import { createKeys, limitKeyDigest, principalScopedKey } from '@taskrelay/shared';
import { ROOT, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { mostAtOnce, runEvents } from './helpers/run-events.js';
import { waitFor } from './helpers/wait-for.js';

const TOOLS = resolve(ROOT, 'test/fixtures/keyed-tools.mjs');

const stack = useStack({
  name: 'keyed',
  redis: { owned: true },
  workerEnv: {
    TASKRELAY_TOOLS: TOOLS,
    // One slot each: two runs at once are on both workers, so the per-key limit is held across the fleet, not by one
    // worker that happened to win every fetch (with 4 slots each, one worker could take every job; it did in 2 of 16 runs).
    WORKER_CONCURRENCY: '1',
    WORKER_LOCK_DURATION_MS: '2000',
    WORKER_HEARTBEAT_MS: '500',
  },
  workers: [{}, {}],
  mcp: true,
});
let r: Redis;
let prefix: string;
let client: Client;
let workers: ManagedProcess[];

beforeAll(() => {
  ({ r, prefix, mcp: client } = stack);
  workers = [...stack.workers];
});

const events = (tool: string) => runEvents(r, `${prefix}:keyed:events`, tool);

const statusOf = (taskId: string) => client.experimental.tasks.getTask(taskId);

describe('§3.5 a concurrency limit per key', () => {
  it('holds per tenant across the fleet while two tenants run side by side; a waiting run says so', async () => {
    const acme = await Promise.all(
      Array.from({ length: 4 }, () => startTask(client, 'per_tenant', { tenant: 'acme', ms: 500 })),
    );
    const globex = await Promise.all(
      Array.from({ length: 3 }, () => startTask(client, 'per_tenant', { tenant: 'globex', ms: 500 })),
    );
    await waitFor(
      async () => {
        const messages = await Promise.all(acme.map(async (id) => (await statusOf(id)).statusMessage ?? ''));
        return messages.some((m) => /^Waiting for a slot: tool per_tenant runs at most 1 at once per tenant/.test(m));
      },
      { timeoutMs: 5_000, message: 'no waiting run said it waits for a slot' },
    );
    for (const id of [...acme, ...globex]) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
    const list = await events('per_tenant');
    const ofTenant = (tenant: string) => list.filter((e) => e.key === tenant);
    expect(ofTenant('acme').filter((e) => e.e === 'start')).toHaveLength(4);
    expect(mostAtOnce(ofTenant('acme'))).toBe(1);
    expect(mostAtOnce(ofTenant('globex'))).toBe(1);
    // The tenants do not wait for each other: both ran at once at some point, and on both workers between them.
    expect(mostAtOnce(list)).toBe(2);
    expect(new Set(list.map((e) => e.pid)).size).toBe(2);
  }, 60_000);

  it('gives a SIGKILLed holder’s slot back within the lock duration', async () => {
    const [victim, other] = workers as [ManagedProcess, ManagedProcess];
    await other.kill('SIGTERM');
    const held = await startTask(client, 'per_tenant', { tenant: 'initech', ms: 60_000 });
    const heldStart = async () => (await events('per_tenant')).find((e) => e.taskId === held && e.e === 'start');
    await waitFor(heldStart);
    expect((await heldStart())?.pid).toBe(victim.pid);
    const survivor = await stack.addWorker();
    const next = await startTask(client, 'per_tenant', { tenant: 'initech', ms: 0 });
    await waitFor(async () => /^Waiting for a slot/.test((await statusOf(next)).statusMessage ?? ''), {
      message: 'the second initech run did not wait',
    });
    await victim.kill('SIGKILL');
    // Its task ends (its job is re-queued by BullMQ's stall check and ends at once); the slot's lease runs out.
    await client.experimental.tasks.cancelTask(held);
    expect((await taskResult(client, next, 20_000)).isError).toBeFalsy();
    const nextStart = (await events('per_tenant')).find((e) => e.taskId === next && e.e === 'start');
    expect(nextStart?.pid).toBe(survivor.pid);
    workers = [survivor, await stack.addWorker()];
  }, 60_000);
});

describe('§3.5 the line of waiters', () => {
  it('a waiter whose task was cancelled leaves the line at the next release, and the next one is woken', async () => {
    const holder = await startTask(client, 'per_tenant', { tenant: 'umbrella', ms: 1_500 });
    await waitFor(async () => (await events('per_tenant')).some((e) => e.taskId === holder && e.e === 'start'));
    const waits = (id: string) => async () => /^Waiting for a slot/.test((await statusOf(id)).statusMessage ?? '');
    const stale = await startTask(client, 'per_tenant', { tenant: 'umbrella', ms: 0 });
    await waitFor(waits(stale), { message: 'the first waiter did not wait' });
    await client.experimental.tasks.cancelTask(stale);
    const next = await startTask(client, 'per_tenant', { tenant: 'umbrella', ms: 0 });
    await waitFor(waits(next), { message: 'the second waiter did not wait' });
    expect((await taskResult(client, next, 20_000)).isError).toBeFalsy();
    // The cancelled waiter's job is gone, so it could not be woken: the release took it out of the line.
    // Counted per principal (§3.5): with authentication off every caller is `anonymous`.
    const key = principalScopedKey('anonymous', '["umbrella"]');
    const line = createKeys(prefix).toolLimit('slots', 'per_tenant', limitKeyDigest(key)).b;
    expect(await r.zrange(line, 0, -1)).toEqual([]);
    expect((await events('per_tenant')).some((e) => e.taskId === stale && e.e === 'start')).toBe(false);
  }, 60_000);
});

describe('§3.5 a rate limit shared by name', () => {
  it('holds between the tools that share it: at most 2 starts in any second', async () => {
    // The shared log's entries are each start's admission, in Redis' clock; each stays a window long, so a poll every
    // 50 ms sees every one.
    const log = createKeys(prefix).toolLimit('rate', 'name:upstream', limitKeyDigest('')).a;
    const seen = new Map<string, number>();
    const read = async () => {
      const entries = await r.zrange(log, 0, -1, 'WITHSCORES');
      for (let i = 0; i + 1 < entries.length; i += 2) seen.set(entries[i]!, Number(entries[i + 1]));
    };
    let polling = true;
    const poll = (async () => {
      while (polling) {
        await read();
        await new Promise((done) => setTimeout(done, 50));
      }
      // The last window's starts may be younger than one poll interval: they are still in the log now.
      await read();
    })();
    const ids = await Promise.all([
      ...Array.from({ length: 3 }, () => startTask(client, 'upstream_a', { ms: 0 })),
      ...Array.from({ length: 3 }, () => startTask(client, 'upstream_b', { ms: 0 })),
    ]);
    for (const id of ids) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
    polling = false;
    await poll;
    const starts = [...seen.values()].sort((a, b) => a - b);
    expect(starts).toHaveLength(6);
    for (let i = 0; i + 2 < starts.length; i++) expect(starts[i + 2]! - starts[i]!).toBeGreaterThanOrEqual(1000);
    const started = [...(await events('upstream_a')), ...(await events('upstream_b'))].filter((e) => e.e === 'start');
    expect(started).toHaveLength(6);
  }, 60_000);

  it('a back-off of one tool holds the limit for the other', async () => {
    const first = await startTask(client, 'held_first', { ms: 1_500 });
    const firstStart = await waitFor(async () => (await events('held_first')).find((e) => e.taskId === first));
    const other = await startTask(client, 'held_other', { ms: 0 });
    await waitFor(async () => /^Waiting for rate limit held/.test((await statusOf(other)).statusMessage ?? ''), {
      message: 'the other tool did not wait for the held limit',
    });
    expect((await taskResult(client, other, 20_000)).isError).toBeFalsy();
    expect((await taskResult(client, first, 20_000)).isError).toBeFalsy();
    const otherStart = (await events('held_other')).find((e) => e.taskId === other && e.e === 'start');
    // Started no sooner than the hold allowed (a start's own time is after its admission, never before).
    expect(otherStart!.at - firstStart.at).toBeGreaterThanOrEqual(1_400);
  }, 60_000);
});

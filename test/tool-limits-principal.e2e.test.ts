/**
 * PROTOCOL.md §3.5 (issue 48 F2): a keyed limit is counted per principal unless the tool shares it across principals.
 * Before, the key was only the argument values: bob's 6 runs on tenant `acme` made alice's `acme` call wait 8.7 s, and
 * through the rate key 4.0 s. A gateway with two principals, one worker of test/fixtures/keyed-tools.mjs, Redis.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { Redis } from 'ioredis';
import { ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { runEvents } from './helpers/run-events.js';
import { waitFor } from './helpers/wait-for.js';

const TOOLS = resolve(ROOT, 'test/fixtures/keyed-tools.mjs');

const stack = useStack({
  name: 'keyed-principal',
  tokens: { alice: 'alice-token', bob: 'bob-token' },
  workers: [{ TASKRELAY_TOOLS: TOOLS, WORKER_CONCURRENCY: '4' }],
});
let r: Redis;
let prefix: string;
let alice: Client;
let bob: Client;

beforeAll(async () => {
  ({ r, prefix } = stack);
  alice = await stack.client(stack.auth('alice'));
  bob = await stack.client(stack.auth('bob'));
});

const events = (tool: string) => runEvents(r, `${prefix}:keyed:events`, tool);
const startOf = async (tool: string, taskId: string) =>
  (await events(tool)).find((e) => e.taskId === taskId && e.e === 'start');
const waits = (client: Client, taskId: string, pattern: RegExp) => async () =>
  pattern.test((await client.experimental.tasks.getTask(taskId)).statusMessage ?? '');

describe('§3.5 keyed limits are per principal', () => {
  it("bob's runs on tenant acme do not delay alice's acme call (concurrency key)", async () => {
    // Long runs, so that "before bob's second run" leaves room on a loaded machine.
    const bobs = await Promise.all(
      Array.from({ length: 6 }, () => startTask(bob, 'per_tenant', { tenant: 'acme', ms: 3_000 })),
    );
    // Which of the six reaches the worker first is not known (they are started together): any one waiting will do.
    await waitFor(
      async () => (await Promise.all(bobs.map((id) => waits(bob, id, /^Waiting for a slot/)()))).some(Boolean),
      { message: "bob's runs did not queue on his key" },
    );
    const hers = await startTask(alice, 'per_tenant', { tenant: 'acme', ms: 0 });
    expect((await taskResult(alice, hers, 30_000)).isError).toBeFalsy();
    // She started while bob's first acme run still held his slot: before any second run of his had started.
    const herStart = await startOf('per_tenant', hers);
    const bobStarts = (await events('per_tenant')).filter((e) => bobs.includes(e.taskId) && e.e === 'start');
    expect(bobStarts.length).toBeLessThanOrEqual(2);
    const secondOfBob = bobStarts.map((e) => e.at).sort((a, b) => a - b)[1];
    if (secondOfBob !== undefined) expect(herStart!.at).toBeLessThan(secondOfBob);
    for (const id of bobs) expect((await taskResult(bob, id, 60_000)).isError).toBeFalsy();
  }, 90_000);

  it("bob's start on tenant acme does not spend alice's acme rate budget (rate key)", async () => {
    // One start a minute per tenant: a call that waited for bob's budget would not end within this test.
    const first = await startTask(bob, 'rate_per_tenant', { tenant: 'acme', ms: 0 });
    expect((await taskResult(bob, first, 30_000)).isError).toBeFalsy();
    const second = await startTask(bob, 'rate_per_tenant', { tenant: 'acme', ms: 0 });
    await waitFor(waits(bob, second, /^Waiting for rate limit rate_per_tenant/), {
      message: "bob's second start did not wait for his budget",
    });
    const hers = await startTask(alice, 'rate_per_tenant', { tenant: 'acme', ms: 0 });
    expect((await taskResult(alice, hers, 30_000)).isError).toBeFalsy();
    expect(await startOf('rate_per_tenant', second)).toBeUndefined();
    await bob.experimental.tasks.cancelTask(second);
  }, 60_000);

  it('a limit shared across principals (acrossPrincipals) is one limit per key for everyone', async () => {
    const his = await startTask(bob, 'per_tenant_shared', { tenant: 'acme', ms: 1_500 });
    await waitFor(async () => (await startOf('per_tenant_shared', his)) !== undefined);
    const hers = await startTask(alice, 'per_tenant_shared', { tenant: 'acme', ms: 0 });
    await waitFor(waits(alice, hers, /^Waiting for a slot: tool per_tenant_shared/), {
      message: "alice's run did not wait for bob's slot of the shared limit",
    });
    expect((await taskResult(alice, hers, 30_000)).isError).toBeFalsy();
    expect((await taskResult(bob, his, 30_000)).isError).toBeFalsy();
  }, 60_000);

  it("a shared limit's line is fair between principals: alice's one run does not wait for all of bob's", async () => {
    const holder = await startTask(bob, 'per_tenant_shared', { tenant: 'initech', ms: 1_500 });
    await waitFor(async () => (await startOf('per_tenant_shared', holder)) !== undefined);
    const line: string[] = [];
    for (let i = 0; i < 4; i++) {
      const id = await startTask(bob, 'per_tenant_shared', { tenant: 'initech', ms: 300 });
      await waitFor(waits(bob, id, /^Waiting for a slot/), { message: `bob's waiter ${i} did not wait` });
      line.push(id);
    }
    const hers = await startTask(alice, 'per_tenant_shared', { tenant: 'initech', ms: 0 });
    await waitFor(waits(alice, hers, /^Waiting for a slot/), { message: "alice's run did not wait" });
    expect((await taskResult(alice, hers, 30_000)).isError).toBeFalsy();
    for (const id of line) expect((await taskResult(bob, id, 30_000)).isError).toBeFalsy();
    // First come, first served would start her after all four of bob's waiters; in turn by principal, after his first.
    const herStart = (await startOf('per_tenant_shared', hers))!.at;
    const his = await Promise.all(line.map(async (id) => (await startOf('per_tenant_shared', id))!.at));
    expect(his.filter((at) => at < herStart).length).toBeLessThanOrEqual(1);
  }, 90_000);
});

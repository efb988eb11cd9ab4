/**
 * PROTOCOL.md §25.1 (issue 30 item 6): priority levels above fair share, across real processes (gateways, a worker of
 * test/fixtures/limited-tools.mjs with one slot, Redis).
 * - A tool's queued calls start by level (`_meta["dev.taskrelay/priority"]`), first come first within a level.
 * - When a slot frees, a waiting tool of an earlier level (`defineTool({ priority: 2 })`) starts before a later one.
 * - A principal may not ask ahead of its tool's level; an operator may.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { Redis } from 'ioredis';
import { useStack } from './helpers/stack.js';
import { ROOT, connectClient, type GatewayProcess } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const TOOLS = resolve(ROOT, 'test/fixtures/limited-tools.mjs');
const PRIORITY = 'dev.taskrelay/priority';

interface ControlEvent {
  tool: string;
  e: 'start' | 'end';
  taskId: string;
  at: number;
}

const stack = useStack({
  name: 'prio',
  redis: { owned: true },
  gateways: [{}, { TASKRELAY_AUTH_TOKENS: 'alice:alice-token,ops:ops-token', TASKRELAY_OPERATORS: 'ops' }],
  workers: [{ TASKRELAY_TOOLS: TOOLS, WORKER_CONCURRENCY: '1' }],
  mcp: true,
});
let r: Redis;
let prefix: string;
let authed: GatewayProcess;
let client: Client;

beforeAll(() => {
  ({ r, prefix, mcp: client } = stack);
  // The second gateway has authentication on (the first, `stack.mcp`'s, is open).
  [, authed] = stack.gateways as [GatewayProcess, GatewayProcess];
});

async function starts(): Promise<string[]> {
  const lines = await r.lrange(`${prefix}:ctl:events`, 0, -1);
  return lines
    .map((l) => JSON.parse(l) as ControlEvent)
    .filter((e) => e.e === 'start')
    .sort((a, b) => a.at - b.at)
    .map((e) => e.taskId);
}

/** Holds the worker's one slot until the calls under test are queued. */
async function block(tool = 'free'): Promise<string> {
  const blocker = await startTask(client, tool, { ms: 1_500 });
  await waitFor(async () => (await starts()).includes(blocker), { message: 'the blocker never started' });
  return blocker;
}

const withPriority = (level: number) => ({ meta: { [PRIORITY]: level } });

describe('§25.1 priority levels', () => {
  it("starts a tool's queued calls by level, first come first within one", async () => {
    const blocker = await block();
    const a = await startTask(client, 'free', { ms: 0 });
    const b = await startTask(client, 'free', { ms: 0 }, withPriority(5));
    const c = await startTask(client, 'free', { ms: 0 }, withPriority(1));
    const d = await startTask(client, 'free', { ms: 0 });
    for (const id of [blocker, a, b, c, d]) expect((await taskResult(client, id)).isError).toBeFalsy();
    const order = (await starts()).filter((id) => [a, b, c, d].includes(id));
    expect(order).toEqual([c, a, d, b]);
  }, 30_000);

  it('gives a freed slot to the waiting tool of the earlier level', async () => {
    await r.del(`${prefix}:ctl:events`);
    // A third tool holds the slot, so both tools' workers wait for it (the later level's since first).
    const blocker = await block('limited');
    const later = await startTask(client, 'free', { ms: 0 });
    // Not an absence window: `earlier` must be queued while the blocker (1.5 s) still holds, so never stretched.
    await new Promise((done) => setTimeout(done, 200));
    const earlier = await startTask(client, 'urgent', { ms: 0 });
    for (const id of [blocker, later, earlier]) expect((await taskResult(client, id)).isError).toBeFalsy();
    expect((await starts()).filter((id) => id === later || id === earlier)).toEqual([earlier, later]);
    // tools/list says so.
    const listed = await client.listTools();
    expect(listed.tools.find((t) => t.name === 'urgent')?._meta?.['dev.taskrelay/controls']).toEqual({
      paused: false,
      priority: 2,
    });
  }, 30_000);

  it("refuses a principal asking ahead of its tool's level, with a clear error; an operator may", async () => {
    const alice = await connectClient(authed.url, { Authorization: 'Bearer alice-token' });
    const ops = await connectClient(authed.url, { Authorization: 'Bearer ops-token' });
    try {
      await expect(startTask(alice, 'free', { ms: 0 }, withPriority(1))).rejects.toThrow(
        /_meta\["dev\.taskrelay\/priority"\] 1 is ahead of what tool free allows \(3\)/,
      );
      await expect(startTask(alice, 'free', { ms: 0 }, withPriority(0))).rejects.toThrow(
        /must be an integer from 1 \(first\) to 5; got 0/,
      );
      const later = await startTask(alice, 'free', { ms: 0 }, withPriority(4));
      const first = await startTask(ops, 'free', { ms: 0 }, withPriority(1));
      for (const [c, id] of [
        [alice, later],
        [ops, first],
      ] as const) {
        expect((await taskResult(c, id)).isError).toBeFalsy();
      }
    } finally {
      await alice.close();
      await ops.close();
    }
  }, 30_000);
});

/**
 * PROTOCOL.md §25.2 (issue 30 item 7): a repeat of an unfinished call joins it, without the client's help, across real
 * processes (two gateways, a worker of test/fixtures/limited-tools.mjs, Redis). The `deduped` tool dedupes on its
 * `report` argument.
 * - A task call repeated while the first is unfinished gets the same task id, on either gateway; nothing new starts.
 * - A plain call repeated meanwhile gets the first call's result; the tool ran once. Its own abort cancels nothing.
 * - Other arguments, another principal, or a repeat after the first ended start anew.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { Redis } from 'ioredis';
import { useStack } from './helpers/stack.js';
import { ROOT, readMetric, type GatewayProcess } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';

const TOOLS = resolve(ROOT, 'test/fixtures/limited-tools.mjs');

const stack = useStack({
  name: 'dedupe',
  redis: { owned: true },
  tokens: { alice: 'alice-token', bob: 'bob-token', ops: 'ops-token' },
  env: { TASKRELAY_OPERATORS: 'ops' },
  gateways: [{}, {}],
  workers: [{ TASKRELAY_TOOLS: TOOLS }],
});
let r: Redis;
let prefix: string;
let a: GatewayProcess;
let b: GatewayProcess;
let alice: Client;
let aliceOnB: Client;
let bob: Client;

beforeAll(async () => {
  ({ r, prefix } = stack);
  [a, b] = stack.gateways as [GatewayProcess, GatewayProcess];
  alice = await stack.client(stack.auth('alice'));
  aliceOnB = await stack.client(stack.auth('alice'), b.url);
  bob = await stack.client(stack.auth('bob'));
});

/** The runs the tool started, by task id. */
async function runs(): Promise<string[]> {
  const lines = await r.lrange(`${prefix}:ctl:events`, 0, -1);
  return lines
    .map((l) => JSON.parse(l) as { tool: string; e: string; taskId: string })
    .filter((e) => e.tool === 'deduped' && e.e === 'start')
    .map((e) => e.taskId);
}

const plainCall = (client: Client, report: string, ms: number, signal?: AbortSignal) =>
  client.request(
    { method: 'tools/call', params: { name: 'deduped', arguments: { report, ms } } },
    CallToolResultSchema,
    { timeout: 20_000, ...(signal ? { signal } : {}) },
  );

describe('§25.2 a repeat of an unfinished call joins it', () => {
  it('gives a repeated task call the same task id, on any gateway, and runs the tool once', async () => {
    const first = await startTask(alice, 'deduped', { report: 'q3', ms: 800 });
    // The other arguments are not part of the key: `ms` differs, the report is the same.
    const again = await startTask(alice, 'deduped', { report: 'q3', ms: 5 });
    const elsewhere = await startTask(aliceOnB, 'deduped', { report: 'q3', ms: 0 });
    expect(again).toBe(first);
    expect(elsewhere).toBe(first);
    const other = await startTask(alice, 'deduped', { report: 'q4', ms: 0 });
    const bobs = await startTask(bob, 'deduped', { report: 'q3', ms: 0 });
    expect(other).not.toBe(first);
    expect(bobs).not.toBe(first);
    for (const [c, id] of [
      [alice, first],
      [alice, other],
      [bob, bobs],
    ] as const) {
      expect((await taskResult(c, id)).isError).toBeFalsy();
    }
    expect((await runs()).filter((id) => id === first)).toHaveLength(1);
    // Once it ended, the same call starts anew.
    const after = await startTask(alice, 'deduped', { report: 'q3', ms: 0 });
    expect(after).not.toBe(first);
    expect((await taskResult(alice, after)).isError).toBeFalsy();
    const ops = { Authorization: 'Bearer ops-token' };
    expect(await readMetric(a.url, 'taskrelay_calls_joined_total', { tool: 'deduped' }, ops)).toBe(1);
  }, 30_000);

  it('gives a repeated plain call the first call’s result; a joiner that gives up cancels nothing', async () => {
    await r.del(`${prefix}:ctl:events`);
    const first = plainCall(alice, 'p1', 800);
    // Not an absence window: the joiners must come while the first call (800 ms) still runs, so never stretched.
    await new Promise((done) => setTimeout(done, 200));
    const quitter = new AbortController();
    const giving = plainCall(aliceOnB, 'p1', 0, quitter.signal).catch((error: unknown) => error);
    const joined = plainCall(alice, 'p1', 0);
    await new Promise((done) => setTimeout(done, 100));
    quitter.abort();
    const [one, two] = await Promise.all([first, joined]);
    expect(one.structuredContent).toEqual(two.structuredContent);
    expect(one.isError).toBeFalsy();
    await giving;
    expect(await runs()).toHaveLength(1);
  }, 30_000);
});

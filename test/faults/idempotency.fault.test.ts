/**
 * Fault suite, PROTOCOL.md §10.8 and docs/MCP.md: a task call carrying `_meta["dev.taskrelay/idempotency-key"]`
 * that the same principal already used returns the same task and starts no second job — also when the duplicates
 * arrive at the same time, as a client retrying after a timeout would send them. Keys are per principal.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GatewayProcess } from '../helpers/processes.js';
import {
  FAULT_TOOLS,
  type FaultRecords,
  useFaultStack,
  startTask,
  taskResult,
  watchingClient,
  type WatchingClient,
} from '../helpers/faults.js';

const KEY = 'dev.taskrelay/idempotency-key';

const fault = useFaultStack({
  name: 'f-idem',
  // Authentication on: the suite's watchers are alice's and bob's own.
  watch: false,
  gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:token-a,bob:token-b' }],
  workers: [{ TASKRELAY_TOOLS: FAULT_TOOLS, WORKER_CONCURRENCY: '16' }],
});
let records: FaultRecords;
let gateway: GatewayProcess;
let alice: WatchingClient;
let bob: WatchingClient;

beforeAll(async () => {
  ({ records } = fault);
  ({ gateway } = fault.stack);
  [alice, bob] = await Promise.all([
    watchingClient(gateway.url, { Authorization: 'Bearer token-a' }),
    watchingClient(gateway.url, { Authorization: 'Bearer token-b' }),
  ]);
});

afterAll(async () => {
  await Promise.all([alice?.close(), bob?.close()]);
});

const call = (who: WatchingClient, key: string) =>
  startTask(who.client, 'steady', { ms: 300 }, { meta: { [KEY]: key } });

/** The task completes after exactly one run, and no other task ran for these calls. */
async function expectRanOnce(who: WatchingClient, taskId: string, before: Set<string>) {
  expect((await taskResult(who.client, taskId)).structuredContent).toMatchObject({ taskId });
  expect(await records.runs(taskId)).toHaveLength(1);
  expect((await records.taskIds()).filter((id) => !before.has(id))).toEqual([taskId]);
}

describe('§10.8 idempotent creation', () => {
  it('returns the same task for a key used twice in a row, and runs the tool once', async () => {
    const before = new Set(await records.taskIds());
    const first = await call(alice, 'twice-in-a-row');
    const second = await call(alice, 'twice-in-a-row');
    expect(second).toBe(first);
    await expectRanOnce(alice, first, before);
    // Still the same task once it is terminal (for as long as it exists).
    expect(await call(alice, 'twice-in-a-row')).toBe(first);
  });

  it('returns one task for the same key sent five times at once, and runs the tool once', async () => {
    const before = new Set(await records.taskIds());
    const ids = await Promise.all(Array.from({ length: 5 }, () => call(alice, 'all-at-once')));
    expect(new Set(ids).size).toBe(1);
    await expectRanOnce(alice, ids[0] ?? '', before);
  });

  it('gives another principal using the same key its own task', async () => {
    const mine = await call(alice, 'shared-key');
    const theirs = await call(bob, 'shared-key');
    expect(theirs).not.toBe(mine);
    expect(await call(bob, 'shared-key')).toBe(theirs);
    expect((await taskResult(bob.client, theirs)).structuredContent).toMatchObject({ taskId: theirs });
    expect((await taskResult(alice.client, mine)).structuredContent).toMatchObject({ taskId: mine });
  });
});

/**
 * `pnpm bench --fair`: what fair share (PROTOCOL.md §25) buys and costs.
 * - Benefit: on a pool of 2 slots, alice queues 300 `bench_hold` tasks of 100 ms, then bob creates one. Bob's wait
 *   (create → start, from the task hash) and how many of alice's jobs started while he waited; a FIFO queue makes
 *   him wait for all of them (14.7 s measured before §25).
 * - Cost: the gateway's fair-share step per enqueue (`FairShare.enter`: one round trip, the `ZADD` riding with the
 *   add), and BullMQ's prioritized add against its plain add, each against the bench's own Redis.
 */
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { createKeys, FairShare, StoreRunner } from '@taskrelay/shared';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { assertAlive, startStack } from './procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './report.js';
import { now } from './stats.js';

const BACKLOG = 300;
const HOLD_MS = 100;
const SLOTS = 2;
const REPS = 3;
const ENTER_OPS = 2_000;
const ADD_OPS = 2_000;
const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

type Rpc = { result?: any; error?: { code: number; message: string } };

/** A 2025-11-25 session of `principal` (token `<principal>-token`): its JSON-RPC calls. */
export async function session(url: string, principal: string) {
  const auth = { authorization: `Bearer ${principal}-token` };
  const init = await fetch(url, {
    method: 'POST',
    headers: { ...JSON_HEADERS, ...auth },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 0,
      method: 'initialize',
      params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'bench-fair', version: '0' } },
    }),
  });
  const sessionId = init.headers.get('mcp-session-id') ?? '';
  await init.text();
  const headers = { ...JSON_HEADERS, ...auth, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-11-25' };
  await fetch(url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
  }).then((r) => r.text());
  let id = 1;
  return async (method: string, params: unknown): Promise<Rpc> => {
    const res = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: id++, method, params }),
    });
    const text = await res.text();
    if (!(res.headers.get('content-type') ?? '').includes('text/event-stream')) return JSON.parse(text) as Rpc;
    const data = text
      .split('\n')
      .filter((l) => l.startsWith('data:') && l.length > 6)
      .map((l) => JSON.parse(l.slice(5)) as Rpc & { id?: unknown });
    return data.find((m) => m.id !== undefined) ?? {};
  };
}

const holdTask = (ms: number) => ({ name: 'bench_hold', arguments: { ms }, task: { ttl: 120_000 } });

export async function runFair(o: {
  redis: TestRedis;
  cleanup: Array<() => Promise<void> | void>;
  log: (m: string) => void;
}): Promise<number> {
  const startedAt = new Date();
  const results = new Results();
  const prefix = uniquePrefix('fair');
  const stack = await startStack({
    name: 'fair',
    prefix,
    redisUrl: o.redis.url,
    gateways: 1,
    workers: 1,
    workerConcurrency: SLOTS,
    env: { TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token', TASKRELAY_MAX_OPEN_TASKS: '10000' },
  });
  const url = stack.gateways[0]!.url;
  const redis = new Redis(o.redis.url);
  o.cleanup.push(() => redis.disconnect());
  const alice = await session(url, 'alice');
  const bob = await session(url, 'bob');
  const hget = (id: string, field: string) => redis.hget(`${prefix}:task:${id}`, field);

  for (let rep = 1; rep <= REPS; rep++) {
    assertAlive([...stack.gateways, ...stack.workers], 'fair');
    const aliceIds: string[] = [];
    for (let i = 0; i < BACKLOG; i++) aliceIds.push((await alice('tools/call', holdTask(HOLD_MS))).result.task.taskId);
    const bobId = (await bob('tools/call', holdTask(1))).result.task.taskId as string;
    const started = await waitFor(() => hget(bobId, 'startedAt'), { timeoutMs: 120_000, intervalMs: 5 });
    const createdMs = Date.parse((await hget(bobId, 'createdAt')) ?? '');
    const startedMs = Date.parse(started);
    const aliceStarts = await Promise.all(aliceIds.map((id) => hget(id, 'startedAt')));
    const ahead = aliceStarts.filter((s) => s && Date.parse(s) > createdMs && Date.parse(s) < startedMs).length;
    results.add('fair.bobWaitMs', startedMs - createdMs);
    results.add('fair.aliceAhead', ahead);
    o.log(`fair rep ${rep}: bob waited ${startedMs - createdMs} ms, ${ahead} of alice's jobs started meanwhile`);
    await Promise.all(aliceIds.map((taskId) => alice('tasks/cancel', { taskId }).catch(() => undefined)));
  }

  // The gateway's step per enqueue, alone: one principal with a backlog of BACKLOG entries.
  const keys = createKeys(uniquePrefix('fair-cost'));
  const share = new FairShare(new StoreRunner(redis, keys));
  for (let rep = 1; rep <= REPS; rep++) {
    // Interleaved with a PING, so load on the machine weighs on both alike. Timed as the gateway waits for it: the
    // one script that counts and enters, before BullMQ's add.
    let enterMs = 0;
    let pingMs = 0;
    for (let i = 0; i < ENTER_OPS; i++) {
      const t0 = now();
      await share.enter('pool', 'alice', `j${rep}-${i}`, 60_000);
      const t1 = now();
      await redis.ping();
      enterMs += t1 - t0;
      pingMs += now() - t1;
    }
    results.add('fair.enterUs', (enterMs * 1000) / ENTER_OPS);
    results.add('fair.rttUs', (pingMs * 1000) / ENTER_OPS);
    await redis.del(keys.fairShare('pool', 'alice'));
    // BullMQ's own cost of a priority: a prioritized add against a plain one, interleaved, into queues nobody
    // consumes.
    const plain = new Queue(`fair-plain-${rep}`, { connection: redis, prefix: keys.bullPrefix });
    const prioritized = new Queue(`fair-prioritized-${rep}`, { connection: redis, prefix: keys.bullPrefix });
    await Promise.all([plain.waitUntilReady(), prioritized.waitUntilReady()]);
    let plainMs = 0;
    let prioritizedMs = 0;
    for (let i = 0; i < ADD_OPS; i++) {
      const t0 = now();
      await plain.add('j', { i });
      const t1 = now();
      await prioritized.add('j', { i }, { priority: 1 + (i % BACKLOG) });
      plainMs += t1 - t0;
      prioritizedMs += now() - t1;
    }
    results.add('fair.add.plainUs', (plainMs * 1000) / ADD_OPS);
    results.add('fair.add.prioritizedUs', (prioritizedMs * 1000) / ADD_OPS);
    for (const queue of [plain, prioritized]) {
      await queue.obliterate({ force: true });
      await queue.close();
    }
  }

  const g1 = `fair share: bob's 1 task behind alice's ${BACKLOG} × ${HOLD_MS} ms, ${SLOTS} slots`;
  const g2 = 'fair share: cost per enqueue';
  const specs: RowSpec[] = [
    { group: g1, label: "bob's task: create → start", unit: 'ms', id: 'fair.bobWaitMs' },
    { group: g1, label: "alice's jobs started while bob waited", unit: 'count', id: 'fair.aliceAhead' },
    {
      group: g2,
      label: 'FairShare.enter (count + ZADD)',
      unit: 'µs',
      id: 'fair.enterUs',
      ref: { id: 'fair.rttUs', name: 'PING' },
      better: 'lower',
    },
    {
      group: g2,
      label: 'BullMQ add with a priority',
      unit: 'µs',
      id: 'fair.add.prioritizedUs',
      ref: { id: 'fair.add.plainUs', name: 'plain add' },
      better: 'lower',
    },
  ];
  const rows = buildRows(results, specs);
  console.log(renderTable(rows));
  const file = await writeResults(
    {
      mode: 'fair',
      machine: machine((await redis.info('server')).match(/redis_version:(\S+)/)?.[1] ?? 'unknown'),
      rows,
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return 0;
}

/**
 * The fault suite on a sharded Redis Cluster (issue 45 item 4, PROTOCOL.md §1.1, §10.10): 3 masters with a replica
 * each, an unbraced prefix (the sharded layout), 3 tools, one of them with `shards: 3`, so every master holds tool
 * shards and one of them the home keys too. Worker and gateway SIGKILLs in a kill loop; a graceful `CLUSTER FAILOVER`
 * on a replica under load; a master SIGKILLed and its replica promoted under load. Every task ends `completed` with
 * its side effect applied once (runs and effects counted per task by the fault tools), none stuck; the runs in flight
 * during a failover complete once (no re-run), and every error a client sees meanwhile is "Task store unavailable …
 * retry shortly". What a client sees, and for how long, is printed per master: the failed-over master's tools and the
 * others' (docs/SCALING.md quotes it).
 *
 * The fault tools record to a standalone Redis of their own (FAULT_RECORD_REDIS_URL), so the records are true through
 * the cluster's outage. No Python worker: it does not speak the sharded layout yet (docs/SCALING.md §4).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { HOME_TAG, createKeys, slotOfCode } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../helpers/redis.js';
import { startRedisCluster, type TestCluster } from '../helpers/redis-cluster.js';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT, startGatewayProcess, stopAll, type GatewayProcess } from '../helpers/processes.js';
import { FaultRecords, WorkerPool, startTask, testRedis } from '../helpers/faults.js';
import {
  Session,
  creating,
  endedOnce,
  errorWindow,
  linesAbout,
  opaque,
  summary,
  timeouts,
  underLoad,
  workerWrites,
  type FaultStack,
  type Outcome,
} from '../helpers/cluster-faults.js';

const TOOLS = `${ROOT}/test/fixtures/shard-fault-tools.mjs`;
/** Half the tasks go to the hot tool's three shards, the rest to the two one-shard tools. */
const toolOf = (i: number): string => ['chaos_a', 'chaos_hot', 'chaos_b', 'chaos_hot'][i % 4] as string;
/** A dead master is failed over after this (plus the election, about a second). */
const NODE_TIMEOUT_MS = 2_000;
/** The kill loop's workers: a SIGKILLed worker's job is taken over within 5L/6. */
const KILL_LOOP_LOCK_MS = 3_000;
/** The default: a failover of up to L/6 (5 s) costs no re-run (PROTOCOL.md §10.4, §10.10). */
const FAILOVER_LOCK_MS = 30_000;

let cluster: TestCluster;
let recordRedis: TestRedis;
let r: Redis;
let prefix: string;
let gateway: GatewayProcess;
let gatewayEnv: Record<string, string>;
let workerEnv: Record<string, string>;
let pool: WorkerPool | undefined;
let poolLockMs = 0;
let records: FaultRecords;
const stack: FaultStack = {
  gatewayUrl: () => gateway.url,
  get records() {
    return records;
  },
  procs: () => [gateway, ...(pool ? pool.procs.values() : [])],
};

beforeAll(async () => {
  [cluster, recordRedis] = await Promise.all([
    startRedisCluster(3, { replicas: 1, nodeTimeoutMs: NODE_TIMEOUT_MS }),
    startRedis({ owned: true }),
  ]);
  r = testRedis(recordRedis.url);
  // No braces: the sharded layout.
  prefix = uniquePrefix('f-shards');
  records = new FaultRecords(r, prefix);
  const base = { REDIS_CLUSTER_NODES: cluster.nodes.join(','), TASKRELAY_PREFIX: prefix };
  gatewayEnv = { ...base };
  workerEnv = {
    ...base,
    TASKRELAY_TOOLS: TOOLS,
    FAULT_RECORD_REDIS_URL: recordRedis.url,
    FAULT_RECORD_PREFIX: prefix,
    WORKER_CONCURRENCY: '20',
    WORKER_HEARTBEAT_MS: '1000',
  };
  // The workers place the tools' shards as they start: before the gateway, so its first catalog read has them all.
  await workers(3, KILL_LOOP_LOCK_MS);
  gateway = await startGatewayProcess(gatewayEnv);
}, 120_000);

afterAll(async () => {
  r?.disconnect();
  await stopAll();
  await Promise.all([cluster?.stop(), recordRedis?.stop()]);
});

/** `count` workers of lock duration `lockMs`: the pool as it is when it has them, else a fresh one. */
async function workers(count: number, lockMs: number): Promise<WorkerPool> {
  if (pool && poolLockMs === lockMs && pool.procs.size >= count) return pool;
  await pool?.stopAll();
  pool = new WorkerPool({ ...workerEnv, WORKER_LOCK_DURATION_MS: String(lockMs) });
  poolLockMs = lockMs;
  await pool.start(count);
  return pool;
}

/** The master serving a hash tag's slot now. */
async function masterOfTag(tag: string): Promise<{ slot: number; master: number }> {
  const live = cluster.ports.find((p) => p !== killed) as number;
  const slot = Number(await cluster.node(live).cluster('KEYSLOT', `{${tag}}`));
  return { slot, master: await cluster.masterOf(slot, live) };
}

let killed: number | undefined;

/** The tasks whose shard (the code their id starts with) the master `port` served before the fault, and the rest. */
function splitByMaster(outcomes: Outcome[], port: number): { on: Outcome[]; off: Outcome[] } {
  const on: Outcome[] = [];
  const off: Outcome[] = [];
  for (const o of outcomes) {
    const code = o.taskId.slice(0, 4);
    (masterBefore.get(slotOfCode(code)) === port ? on : off).push(o);
  }
  return { on, off };
}

/** Slot → master before the fault, for the codes of the tasks submitted. */
const masterBefore = new Map<number, number>();
async function noteMasters(codes: string[]): Promise<void> {
  const live = cluster.ports.find((p) => p !== killed) as number;
  for (const code of new Set(codes)) {
    const slot = slotOfCode(code);
    masterBefore.set(slot, await cluster.masterOf(slot, live));
  }
}

function maxExtra(outcomes: Outcome[]): string {
  const extras = outcomes.map((o) => o.extraMs).filter((n) => Number.isFinite(n));
  return extras.length === 0 ? 'none' : `${Math.max(...extras)} ms (${extras.length} tasks)`;
}

describe('on a sharded 3-master cluster with a replica each, 3 tools, one with shards: 3', () => {
  const sessions = Array.from({ length: 4 }, () => new Session(stack));

  afterAll(async () => {
    await Promise.all(sessions.map((s) => s.close()));
  });

  it('spreads the tools over every master', async () => {
    const ids = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        (sessions[0] as Session).request((c) => startTask(c, toolOf(i), { ms: 10, stepMs: 10 })),
      ),
    );
    await noteMasters(ids.map((id) => id.slice(0, 4)));
    const used = new Set(ids.map((id) => masterBefore.get(slotOfCode(id.slice(0, 4)))));
    // chaos_a, chaos_b and chaos_hot's three shards: five shards, placed over all three masters.
    expect(used.size).toBe(3);
  });

  it('worker SIGKILLs and a gateway SIGKILL in a kill loop: every task completes, its effect applied once', async () => {
    const workerPool = await workers(3, KILL_LOOP_LOCK_MS);
    const kills = { workers: 0, gateways: 0 };
    const outcomes = await underLoad(
      stack,
      sessions,
      32,
      (i) => 500 + ((i * 379) % 1_501),
      async () => {
        for (const round of [{ workers: 1, gateway: true }, { workers: 2 }, { workers: 1 }]) {
          const victims = [...workerPool.procs.values()].slice(0, round.workers);
          await Promise.all(victims.map((w) => w.kill('SIGKILL')));
          kills.workers += victims.length;
          if (round.gateway) {
            await gateway.kill('SIGKILL');
            kills.gateways += 1;
            gateway = await startGatewayProcess({ ...gatewayEnv, PORT: String(gateway.port) });
          }
          await workerPool.start(3 - workerPool.procs.size);
          await new Promise((resolve) => setTimeout(resolve, 1_000));
        }
      },
      { toolOf },
    );
    console.log(
      `sharded kill loop: ${kills.workers} worker kills, ${kills.gateways} gateway kill; ${summary(outcomes)}; ` +
        `shards used ${new Set(outcomes.map((o) => o.taskId.slice(0, 4))).size}`,
    );
    await endedOnce(stack, sessions[0] as Session, outcomes);
    expect(outcomes.some((o) => o.runs > 1)).toBe(true);
  });

  it('a graceful CLUSTER FAILOVER of the home master under load: runs complete once, no opaque error', async () => {
    await workers(2, FAILOVER_LOCK_MS);
    for (const s of sessions) s.errors.length = 0;
    const { slot, master } = await masterOfTag(HOME_TAG);
    const [replica] = await cluster.replicasOf(master);
    if (replica === undefined) throw new Error(`master ${master} has no replica`);
    let faultOver = false;
    const creator = creating(sessions[1] as Session, () => faultOver, toolOf);
    let promotedMs = 0;
    const outcomes = await underLoad(
      stack,
      sessions,
      16,
      (i) => 3_000 + (i % 4) * 500,
      async () => {
        const started = Date.now();
        await cluster.node(replica).cluster('FAILOVER');
        await waitFor(async () => (await cluster.masterOf(slot, replica)) === replica, {
          timeoutMs: 20_000,
          message: `replica ${replica} did not take over slot ${slot}`,
        });
        promotedMs = Date.now() - started;
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        faultOver = true;
      },
      { toolOf },
    );
    const createdIds = await creator.done;
    const { errors } = errorWindow(sessions);
    console.log(
      `sharded graceful failover: replica ${replica} master after ${promotedMs} ms; ${summary(outcomes)}; ` +
        `client errors ${errors.length} (gave up after 5 s: ${timeouts(sessions).length}), creates retried ${creator.retries()}, ` +
        `created meanwhile ${createdIds.length}`,
    );
    await endedOnce(stack, sessions[0] as Session, outcomes, createdIds);
    expect(outcomes.filter((o) => o.runs !== 1)).toEqual([]);
    expect(opaque(sessions)).toEqual([]);
  });

  it('a tool master SIGKILLed and its replica promoted under load: runs complete once, errors say retry', async () => {
    await workers(2, FAILOVER_LOCK_MS);
    for (const s of sessions) s.errors.length = 0;
    // A master serving a shard of chaos_hot but not the home keys: the hot tool loses one of its shards, the other
    // masters' tools should keep going.
    const home = await masterOfTag(HOME_TAG);
    const registry = await cluster.node(home.master).hgetall(createKeys(prefix, 'sharded').placement);
    masterBefore.clear();
    await noteMasters(Object.values(registry));
    const target = Object.entries(registry)
      .filter(([field]) => /~chaos_hot#\d+$/.test(field))
      .map(([, code]) => slotOfCode(code))
      .find((s) => masterBefore.get(s) !== home.master);
    if (target === undefined)
      throw new Error(`every shard of chaos_hot is on the home master: ${JSON.stringify(registry)}`);
    const slot = target;
    const master = masterBefore.get(slot) as number;
    const [replica] = await cluster.replicasOf(master);
    if (replica === undefined) throw new Error(`master ${master} has no replica`);
    let faultOver = false;
    const creator = creating(sessions[1] as Session, () => faultOver, toolOf);
    let killedAt = 0;
    let promotedMs = 0;
    const outcomes = await underLoad(
      stack,
      sessions,
      24,
      // Most of them end while the slot has no master: their results are written through the outage.
      (i) => 1_500 + (i % 8) * 400,
      async () => {
        killedAt = Date.now();
        killed = master;
        await cluster.kill(master);
        await waitFor(async () => (await cluster.masterOf(slot, replica).catch(() => undefined)) === replica, {
          timeoutMs: 30_000,
          intervalMs: 50,
          message: `replica ${replica} was not promoted for slot ${slot}`,
        });
        promotedMs = Date.now() - killedAt;
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        faultOver = true;
      },
      { toolOf },
    );
    const createdIds = await creator.done;
    const { errors, windowMs } = errorWindow(sessions);
    const { on, off } = splitByMaster(outcomes, master);
    const { lost, rewritten } = workerWrites(pool ? [...pool.procs.values()] : []);
    console.log(
      `sharded master SIGKILL (${master}, not the home master ${home.master}): replica ${replica} promoted after ` +
        `${promotedMs} ms; ${summary(outcomes)}; ` +
        `extra time on the killed master's shards max ${maxExtra(on)}, on the others max ${maxExtra(off)}; ` +
        `client errors ${errors.length} over ${windowMs} ms (from ${errors[0] ? errors[0].at - killedAt : 0} ms after ` +
        `the kill), creates retried ${creator.retries()}, created meanwhile ${createdIds.length}; ` +
        `worker writes retried through it ${rewritten.length}, lost ${lost.length}; ` +
        `requests the client gave up on after 5 s ${timeouts(sessions).length}`,
    );
    await endedOnce(stack, sessions[0] as Session, outcomes, createdIds);
    expect(
      outcomes.filter((o) => o.runs !== 1),
      outcomes
        .filter((o) => o.runs !== 1)
        .map((o) => linesAbout(stack, o.taskId))
        .join('\n'),
    ).toEqual([]);
    expect(on.length).toBeGreaterThan(0);
    expect(opaque(sessions)).toEqual([]);
    expect(lost).toEqual([]);
  });
});

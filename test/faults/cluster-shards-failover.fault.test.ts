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
import { afterAll, describe, expect, it } from 'vitest';
import { HOME_TAG, createKeys, slotOfCode } from '@taskrelay/shared';
import { ROOT } from '../helpers/processes.js';
import { startTask } from '../helpers/faults.js';
import {
  Session,
  endedOnce,
  errorWindow,
  failOverUnderLoad,
  killLoopUnderLoad,
  linesAbout,
  opaque,
  summary,
  timeouts,
  useClusterFaults,
  workerWrites,
  type Outcome,
} from '../helpers/cluster-faults.js';

const TOOLS = `${ROOT}/test/fixtures/shard-fault-tools.mjs`;
/** Half the tasks go to the hot tool's three shards, the rest to the two one-shard tools. */
const toolOf = (i: number): string => ['chaos_a', 'chaos_hot', 'chaos_b', 'chaos_hot'][i % 4] as string;
/** The kill loop's workers: a SIGKILLed worker's job is taken over within 5L/6. */
const KILL_LOOP_LOCK_MS = 3_000;
/** The default: a failover of up to L/6 (5 s) costs no re-run (PROTOCOL.md §10.4, §10.10). */
const FAILOVER_LOCK_MS = 30_000;

// No braces: the sharded layout. The workers place the tools' shards as they start: before the gateway, so its first
// catalog read has them all.
const faults = useClusterFaults({
  name: 'f-shards',
  tools: TOOLS,
  braces: false,
  nodeTimeoutMs: 2_000,
  workersFirst: { count: 3, lockMs: KILL_LOOP_LOCK_MS },
});

/** The master serving a hash tag's slot now. */
async function masterOfTag(tag: string): Promise<{ slot: number; master: number }> {
  const { cluster } = faults;
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
  const { cluster } = faults;
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
  const sessions = Array.from({ length: 4 }, () => new Session(faults));

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
    const { outcomes, kills } = await killLoopUnderLoad(faults, sessions, {
      count: 32,
      lockMs: KILL_LOOP_LOCK_MS,
      toolOf,
    });
    console.log(
      `sharded kill loop: ${kills.workers} worker kills, ${kills.gateways} gateway kill; ${summary(outcomes)}; ` +
        `shards used ${new Set(outcomes.map((o) => o.taskId.slice(0, 4))).size}`,
    );
    await endedOnce(faults, sessions[0] as Session, outcomes);
    expect(outcomes.some((o) => o.runs > 1)).toBe(true);
  });

  it('a graceful CLUSTER FAILOVER of the home master under load: runs complete once, no opaque error', async () => {
    await faults.workers(2, FAILOVER_LOCK_MS);
    const { outcomes, createdIds, retries, replica, promotedMs } = await failOverUnderLoad(
      faults,
      sessions,
      { count: 16, msOf: (i) => 3_000 + (i % 4) * 500, toolOf },
      await masterOfTag(HOME_TAG),
    );
    const { errors } = errorWindow(sessions);
    console.log(
      `sharded graceful failover: replica ${replica} master after ${promotedMs} ms; ${summary(outcomes)}; ` +
        `client errors ${errors.length} (gave up after 5 s: ${timeouts(sessions).length}), creates retried ${retries}, ` +
        `created meanwhile ${createdIds.length}`,
    );
    await endedOnce(faults, sessions[0] as Session, outcomes, createdIds);
    expect(outcomes.filter((o) => o.runs !== 1)).toEqual([]);
    expect(opaque(sessions)).toEqual([]);
  });

  it('a tool master SIGKILLed and its replica promoted under load: runs complete once, errors say retry', async () => {
    await faults.workers(2, FAILOVER_LOCK_MS);
    // A master serving a shard of chaos_hot but not the home keys: the hot tool loses one of its shards, the other
    // masters' tools should keep going.
    const home = await masterOfTag(HOME_TAG);
    const registry = await faults.cluster.node(home.master).hgetall(createKeys(faults.prefix, 'sharded').placement);
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
    killed = master;
    const fault = await failOverUnderLoad(
      faults,
      sessions,
      // Most of them end while the slot has no master: their results are written through the outage.
      { count: 24, msOf: (i) => 1_500 + (i % 8) * 400, toolOf },
      { slot, master, kill: true },
    );
    const { outcomes, createdIds } = fault;
    const { errors, windowMs } = errorWindow(sessions);
    const { on, off } = splitByMaster(outcomes, master);
    const { lost, rewritten } = workerWrites(faults.pool ? [...faults.pool.procs.values()] : []);
    console.log(
      `sharded master SIGKILL (${master}, not the home master ${home.master}): replica ${fault.replica} promoted after ` +
        `${fault.promotedMs} ms; ${summary(outcomes)}; ` +
        `extra time on the killed master's shards max ${maxExtra(on)}, on the others max ${maxExtra(off)}; ` +
        `client errors ${errors.length} over ${windowMs} ms (from ${errors[0] ? errors[0].at - fault.startedAt : 0} ms after ` +
        `the kill), creates retried ${fault.retries}, created meanwhile ${createdIds.length}; ` +
        `worker writes retried through it ${rewritten.length}, lost ${lost.length}; ` +
        `requests the client gave up on after 5 s ${timeouts(sessions).length}`,
    );
    await endedOnce(faults, sessions[0] as Session, outcomes, createdIds);
    expect(
      outcomes.filter((o) => o.runs !== 1),
      outcomes
        .filter((o) => o.runs !== 1)
        .map((o) => linesAbout(faults, o.taskId))
        .join('\n'),
    ).toEqual([]);
    expect(on.length).toBeGreaterThan(0);
    expect(opaque(sessions)).toEqual([]);
    expect(lost).toEqual([]);
  });
});

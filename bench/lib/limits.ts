/**
 * `pnpm bench --limits`: what a keyed limit (PROTOCOL.md §3.5, issue 48 F2) makes another principal wait. Bob queues 6
 * runs on tenant `acme`, then alice calls the same tool on `acme`, and on a tenant of her own; her wait is the time
 * from her task's creation (the task hash) to her tool's start (the tool records it: a run its limit refuses records a
 * start too, but never reaches the tool). Four tools of bench/bench-tools.mjs: one run at a time
 * per tenant (bob's runs hold 1.5 s each) and two starts a second per tenant, each counted per principal (the
 * default) and shared across principals (`acrossPrincipals: true`). Before §3.5 counted per principal, bob's runs made
 * alice's `acme` call wait 8.7 s through the concurrency key and 4.0 s through the rate key (14 ms on her own tenant).
 * Each repetition uses tenants of its own, so no window or slot carries over.
 */
import { Redis } from 'ioredis';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { session } from './fair.js';
import { assertAlive, startStack } from './procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './report.js';

const BOB_RUNS = 6;
const BOB_HOLD_MS = 1_500;
const REPS = 3;

const CASES = [
  { id: 'slot', tool: 'bench_tenant_slot', limit: 'concurrency key', scope: 'per principal', bobMs: BOB_HOLD_MS },
  {
    id: 'slotShared',
    tool: 'bench_tenant_slot_shared',
    limit: 'concurrency key',
    scope: 'acrossPrincipals',
    bobMs: BOB_HOLD_MS,
  },
  { id: 'rate', tool: 'bench_tenant_rate', limit: 'rate key', scope: 'per principal', bobMs: 0 },
  { id: 'rateShared', tool: 'bench_tenant_rate_shared', limit: 'rate key', scope: 'acrossPrincipals', bobMs: 0 },
] as const;

export async function runLimits(o: {
  redis: TestRedis;
  cleanup: Array<() => Promise<void> | void>;
  log: (m: string) => void;
}): Promise<number> {
  const startedAt = new Date();
  const results = new Results();
  const prefix = uniquePrefix('limits');
  const stack = await startStack({
    name: 'limits',
    prefix,
    redisUrl: o.redis.url,
    gateways: 1,
    workers: 1,
    // Room for all of bob's runs and alice's at once: only the limit under test holds anyone back.
    workerConcurrency: 16,
    env: { TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token' },
  });
  const url = stack.gateways[0]!.url;
  const redis = new Redis(o.redis.url);
  o.cleanup.push(() => redis.disconnect());
  const alice = await session(url, 'alice');
  const bob = await session(url, 'bob');
  const hget = (id: string, field: string) => redis.hget(`${prefix}:task:${id}`, field);
  const call = async (as: typeof alice, tool: string, tenant: string, ms: number): Promise<string> => {
    const answer = await as('tools/call', { name: tool, arguments: { tenant, ms }, task: { ttl: 120_000 } });
    if (answer.error) throw new Error(`${tool}: ${answer.error.message}`);
    return String(answer.result.task.taskId);
  };
  /** When the task's tool began (the tool records it; a run its limit refused records its start but never gets there). */
  const toolStart = (taskId: string) => redis.get(`${prefix}:bench:tool-start:${taskId}`);
  /** Creation (the task hash) → the tool's start. */
  const waited = async (taskId: string): Promise<number> => {
    const started = await waitFor(() => toolStart(taskId), { timeoutMs: 60_000, intervalMs: 5 });
    return Number(started) - Date.parse((await hget(taskId, 'createdAt')) ?? '');
  };

  for (let rep = 1; rep <= REPS; rep++) {
    for (const c of CASES) {
      assertAlive([...stack.gateways, ...stack.workers], 'limits');
      const tenant = `acme-${c.id}-${rep}`;
      const bobs: string[] = [];
      for (let i = 0; i < BOB_RUNS; i++) bobs.push(await call(bob, c.tool, tenant, c.bobMs));
      // Bob's line is there: his first run started, and the rest of his runs wait behind it.
      await waitFor(() => toolStart(bobs[0]!), { timeoutMs: 60_000, intervalMs: 5 });
      const same = await waited(await call(alice, c.tool, tenant, 0));
      const own = await waited(await call(alice, c.tool, `alice-co-${c.id}-${rep}`, 0));
      results.add(`limits.${c.id}.same`, same);
      results.add(`limits.${c.id}.own`, own);
      o.log(`limits rep ${rep}: ${c.limit}, ${c.scope}: alice on bob's tenant ${same} ms, on her own ${own} ms`);
      await Promise.all(bobs.map((taskId) => bob('tasks/cancel', { taskId }).catch(() => undefined)));
    }
  }

  const group = `keyed limits: alice's call behind bob's ${BOB_RUNS} runs on one tenant (create → start)`;
  const specs: RowSpec[] = CASES.map((c) => ({
    group,
    label: `${c.limit}, ${c.scope}: on bob's tenant`,
    unit: 'ms',
    id: `limits.${c.id}.same`,
    ref: { id: `limits.${c.id}.own`, name: 'her own tenant' },
    better: 'lower',
  }));
  const rows = buildRows(results, specs);
  console.log(renderTable(rows));
  const file = await writeResults(
    {
      mode: 'limits',
      machine: machine((await redis.info('server')).match(/redis_version:(\S+)/)?.[1] ?? 'unknown'),
      rows,
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return 0;
}

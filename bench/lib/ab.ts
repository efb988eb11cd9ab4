/**
 * `pnpm bench --ab <checkout>`: two versions of taskrelay side by side, A from another built checkout, B from this
 * one, each 1 gateway + 1 worker on its own prefix of one Redis, measured in alternating windows (A first in odd
 * repetitions, B first in even ones) with the same load generator: plain calls and task cycles of the raw-HTTP
 * generator, and task cycles as SDK 1.32.2 clients run them (`sdk`: tools/call, tasks/get until terminal,
 * tasks/result; bench/lib/sdk-cycle.ts). The ratio is B / A, so a machine that drifts
 * (another tenant, thermal) lands on both. How each change of issue 25 was kept or dropped (docs/PERFORMANCE.md).
 *
 *   pnpm bench --ab ../other-checkout [--auth] [--reps 5] [--window-ms 3000]
 *
 * `--auth` runs both with a static token (TASKRELAY_AUTH_TOKENS) and so with the open-work cap on (its default,
 * 1000), the rate limits off (each would add its own Redis round trip to both sides alike).
 */
import { loadavg } from 'node:os';
import { resolve } from 'node:path';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { openSessions, type McpSession } from './mcp-http.js';
import { startStack, type RedisAdmin } from './procs.js';
import { Results, buildRows, machine, renderTable, writeResults, type RowSpec } from './report.js';
import { cycles } from './scenarios.js';
import { openClients, sdkWindow } from './sdk-cycle.js';

export interface AbOptions {
  redis: TestRedis;
  admin: RedisAdmin;
  root: string;
  auth: boolean;
  reps: number;
  windowMs: number;
  cleanup: Array<() => Promise<void> | void>;
  log: (message: string) => void;
}

const KINDS = ['plain', 'task', 'sdk'] as const;
type Kind = (typeof KINDS)[number];
const GROUPS: Record<Kind, string> = { plain: 'plain call', task: 'task cycle', sdk: 'SDK task cycle' };
const CS = [1, 32] as const;
const TOKEN = 'bench-ab-token';

export async function runAb(o: AbOptions): Promise<number> {
  const startedAt = new Date();
  const info = machine(o.admin.version);
  const env: Record<string, string> = o.auth
    ? {
        TASKRELAY_AUTH_TOKENS: `bench:${TOKEN}`,
        TASKRELAY_RATE_LIMIT_CALLS: '0',
        TASKRELAY_RATE_LIMIT_TASK_OPS: '0',
      }
    : {};
  const common = { redisUrl: o.redis.url, gateways: 1, workers: 1, workerConcurrency: 64, env };
  const [a, b] = await Promise.all([
    startStack({ ...common, name: 'A', prefix: uniquePrefix('abA'), root: resolve(o.root) }),
    startStack({ ...common, name: 'B', prefix: uniquePrefix('abB') }),
  ]);
  const sessions: McpSession[] = [];
  o.cleanup.push(() => Promise.all(sessions.map((s) => s.close())).then(() => undefined));
  const token = o.auth ? { token: TOKEN } : {};
  const [sa, sb] = await Promise.all([
    openSessions(a.gateways[0]!.url, 32, token),
    openSessions(b.gateways[0]!.url, 32, token),
  ]);
  sessions.push(...sa, ...sb);
  const [ca, cb] = await Promise.all([
    openClients(a.gateways[0]!.url, 32, o.auth ? TOKEN : undefined),
    openClients(b.gateways[0]!.url, 32, o.auth ? TOKEN : undefined),
  ]);
  o.cleanup.push(() => Promise.all([...ca, ...cb].map((c) => c.close())).then(() => undefined));
  const redisPids = o.admin.pid > 0 ? [o.admin.pid] : [];
  const targets = [
    { name: 'A', stack: a, sessions: sa, clients: ca },
    { name: 'B', stack: b, sessions: sb, clients: cb },
  ].map((t) => ({
    ...t,
    cpu: {
      gateway: t.stack.gateways.map((p) => p.pid),
      worker: t.stack.workers.map((p) => p.pid),
      redis: redisPids,
    },
  }));
  const results = new Results();
  const run = async (
    rep: number,
    t: (typeof targets)[number],
    kind: Kind,
    c: number,
    ms: number,
    into: Results,
    maxOps?: number,
  ) => {
    const totalRoles = ['gateway', 'worker', 'redis'];
    try {
      const m =
        kind === 'sdk'
          ? await sdkWindow(t.clients, 'task', c, ms, t.cpu, totalRoles)
          : await cycles({
              sessions: t.sessions,
              kind,
              concurrency: c,
              durationMs: ms,
              cpu: t.cpu,
              totalRoles,
              ttlMs: 5_000,
              ...(maxOps === undefined ? {} : { maxOps }),
            });
      into.addAll(`${t.name}.${kind}.c${c}`, m);
      into.addAll(`${t.name}.${kind}.c${c}`, { load1: loadavg()[0] ?? 0 });
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      into.errors.push({ scenario: `${t.name}.${kind}.c${c}`, rep, message });
      o.log(`rep ${rep} ${t.name}.${kind}.c${c}: FAILED: ${message}`);
    }
  };
  o.log(`A = ${o.root}, B = this checkout${o.auth ? ', authentication on (open-work cap 1000)' : ''}; warming up`);
  for (const t of targets) {
    await run(0, t, 'task', 32, 20_000, new Results(), 4_000);
    await run(0, t, 'plain', 32, 10_000, new Results(), 2_000);
    await run(0, t, 'sdk', 32, 5_000, new Results());
  }
  for (let rep = 1; rep <= o.reps; rep++) {
    const pair = rep % 2 === 1 ? targets : [...targets].reverse();
    for (const kind of KINDS) for (const c of CS) for (const t of pair) await run(rep, t, kind, c, o.windowMs, results);
    o.log(`rep ${rep} done (load ${loadavg()[0]?.toFixed(2)})`);
  }
  const specs: RowSpec[] = [];
  for (const kind of KINDS) {
    const group = GROUPS[kind];
    for (const c of CS) {
      const row = (label: string, unit: string, k: string, better?: 'higher' | 'lower'): RowSpec => ({
        group,
        label: `C=${c} ${label}`,
        unit,
        id: `B.${kind}.c${c}.${k}`,
        ref: { id: `A.${kind}.c${c}.${k}`, name: 'A' },
        ...(better ? { better } : {}),
      });
      specs.push(row('throughput', 'ops/s', 'opsPerS', 'higher'), row('p50', 'ms', 'p50', 'lower'));
      if (c === 32) {
        specs.push(
          row('gateway CPU', 'CPU-ms', 'cpu.gateway', 'lower'),
          row('worker CPU', 'CPU-ms', 'cpu.worker', 'lower'),
          row('Redis CPU', 'CPU-ms', 'cpu.redis', 'lower'),
          row('total CPU', 'CPU-ms', 'cpu.total', 'lower'),
          row('worker syscalls', 'count', 'sys.worker', 'lower'),
          row('Redis syscalls', 'count', 'sys.redis', 'lower'),
          row('total syscalls', 'count', 'sys.total', 'lower'),
        );
      }
      specs.push(row('other cores busy', 'cores', 'otherCores'), row('load average (1 min)', '', 'load1'));
    }
  }
  info.loadavgAtEnd = loadavg().map((v) => Math.round(v * 100) / 100);
  const rows = buildRows(results, specs);
  const out = [
    '',
    `taskrelay A/B — B (this checkout) / A (${o.root}), ${o.reps} interleaved repetitions, ${o.windowMs} ms windows` +
      (o.auth ? ', authentication on' : ''),
    `machine: ${info.cpuModel}, ${info.cores} cores, node ${info.node}, redis ${info.redis}, ` +
      `load average ${info.loadavgAtStart.join(' ')} → ${info.loadavgAtEnd.join(' ')}`,
    '',
    renderTable(rows),
  ];
  // Paired: each repetition's B / A, A and B measured back to back; on a drifting machine the median of these says
  // more than the ratio of the medians.
  out.push('', 'paired ratios B / A per repetition (median; how many repetitions B was better):');
  for (const spec of specs) {
    if (!spec.better || !spec.ref) continue;
    const bs = results.values.get(spec.id) ?? [];
    const as = results.values.get(spec.ref.id) ?? [];
    const ratios = bs.map((v, i) => v / (as[i] ?? Number.NaN)).filter((r) => Number.isFinite(r));
    if (ratios.length === 0) continue;
    const sorted = [...ratios].sort((x, y) => x - y);
    const median = sorted[Math.floor((sorted.length - 1) / 2)]!;
    const better = ratios.filter((r) => (spec.better === 'higher' ? r > 1 : r < 1)).length;
    out.push(`  ${`${spec.group}, ${spec.label}`.padEnd(36)} ${median.toFixed(2)} (${better}/${ratios.length})`);
  }
  if (results.errors.length > 0) {
    out.push('', `FAILED scenarios (${results.errors.length}):`);
    for (const e of results.errors) out.push(`  rep ${e.rep} ${e.scenario}: ${e.message}`);
  }
  console.log(out.join('\n'));
  const file = await writeResults(
    {
      mode: 'ab',
      a: o.root,
      auth: o.auth,
      startedAt: startedAt.toISOString(),
      machine: info,
      config: { reps: o.reps, windowMs: o.windowMs },
      rows,
      metrics: Object.fromEntries([...results.values.keys()].sort().map((k) => [k, results.get(k) ?? null])),
      errors: results.errors,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return results.errors.length > 0 ? 1 : 0;
}

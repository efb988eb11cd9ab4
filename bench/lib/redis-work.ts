/**
 * `pnpm bench --redis-work` (and the last section of the full `pnpm bench`): the Redis work of one operation, on a
 * Redis of its own with nothing else on it — one gateway and one worker, the raw BullMQ floor's worker and producer.
 * For each operation: the commands Redis ran per operation, broken down by command (`INFO commandstats` deltas, so a
 * script's own commands count, each under its name, besides the `evalsha` that ran them), Redis's CPU per operation
 * (`INFO cpu`), and each process's CPU per operation (/proc). Idle traffic (heartbeats, blocking reads that time out,
 * the stalled checks) is measured alone first and taken off every window in proportion to its length.
 *
 * `--trace` adds one task cycle and one plain call seen through MONITOR, command by command, each line marked with the
 * connection that sent it (or `lua` for a script's own command): how docs/PERFORMANCE.md attributes the commands.
 */
import type { Redis } from 'ioredis';
import { monitorRedis } from '../../test/helpers/monitor.js';
import { startRedis, uniquePrefix } from '../../test/helpers/redis.js';
import { openSessions, type McpSession } from './mcp-http.js';
import { RedisAdmin, startFloorWorker, startStack } from './procs.js';
import { BullFloor, CpuMeter, cycles, progressLatency, type CpuRoles } from './scenarios.js';
import { openClients, operation } from './sdk-cycle.js';
import { now, sleep } from './stats.js';

/** The issue's method (46): 400 operations at 16 in flight. */
const OPS = 400;
const IN_FLIGHT = 16;
const PROGRESS_TASKS = 16;
const PROGRESS_UPDATES = 10;
const CANCEL_TASKS = 16;
const IDLE_MS = 10_000;

type Counts = Map<string, number>;

interface Snapshot {
  commands: Counts;
  /** Redis's CPU seconds, user + sys (`INFO cpu`). */
  cpuS: number;
  at: number;
}

async function snapshot(admin: Redis): Promise<Snapshot> {
  const [stats, cpu] = await Promise.all([admin.info('commandstats'), admin.info('cpu')]);
  const commands: Counts = new Map();
  for (const m of stats.matchAll(/cmdstat_([\w|]+):calls=(\d+)/g)) commands.set(m[1]!, Number(m[2]));
  const field = (name: string) => Number(new RegExp(`${name}:([0-9.]+)`).exec(cpu)?.[1] ?? 0);
  return { commands, cpuS: field('used_cpu_user') + field('used_cpu_sys'), at: now() };
}

/** Commands between two snapshots, less this bench's own INFO calls and the idle traffic of as long a window. */
function delta(before: Snapshot, after: Snapshot, idlePerMs?: Counts): Counts {
  const out: Counts = new Map();
  const ms = after.at - before.at;
  for (const [name, calls] of after.commands) {
    let d = calls - (before.commands.get(name) ?? 0);
    if (name === 'info') d -= 2; // the snapshot's own
    d -= (idlePerMs?.get(name) ?? 0) * ms;
    if (d > 0.5) out.set(name, d);
  }
  return out;
}

export interface OperationWork {
  ops: number;
  /** Commands per operation, by command name (script-internal ones included). */
  commands: Record<string, number>;
  commandsTotal: number;
  /** Redis CPU per operation, µs (`INFO cpu`). */
  redisCpuUs: number;
  /** CPU-ms per operation of each process role (/proc), and of the load generator. */
  cpu: Record<string, number>;
}

export interface RedisWorkReport {
  worker: 'node' | 'python';
  operations: Record<string, OperationWork>;
  idlePerSecond: Record<string, number>;
  /**
   * Redis CPU per operation in each repetition's windows (floor, task cycle and plain call back to back, so each
   * ratio compares windows seconds apart), and the median ratios to the floor's: what the issue's target reads.
   */
  repetitions?: {
    floorUs: number[];
    taskUs: number[];
    plainUs: number[];
    taskOverFloor: number;
    plainOverFloor: number;
  };
  /** Per operation: each client call's execution time inside Redis, by script (SLOWLOG at 0 µs, a window of its own). */
  execution?: Record<string, ExecutionRow[]>;
  /**
   * The same windows' script-internal commands, by command name: their own time, which is inside their scripts'
   * times above. What a script's time holds beyond them is the script itself (its call, its Lua).
   */
  executionInside?: Record<string, ExecutionRow[]>;
  trace?: Record<string, string[]>;
}

export interface ExecutionRow {
  /** A plain command's name, or a script call named by its key count and first key's shape. */
  call: string;
  callsPerOp: number;
  /** Execution time per operation inside Redis, µs: a script's whole run with its own commands; no socket I/O. */
  usPerOp: number;
}

/**
 * Names a client call from its SLOWLOG arguments. A script call carries only its SHA, so it is named by its key count
 * and its first key with the prefix and ids taken off (`evalsha/17 task:` is the create, `evalsha/11 q:wait` BullMQ's
 * `moveToActive`): a name stable across runs, which docs/PERFORMANCE.md maps to the scripts.
 */
function callName(args: string[], prefix: string): string {
  const name = (args[0] ?? '').toLowerCase();
  const shape = (key: string | undefined) =>
    (key ?? '')
      .replace(prefix, '')
      .replace(/^:/, '')
      .replace(/[0-9a-f]{32}/g, '<id>')
      .replace(/q-[^:]*:/, 'q:')
      .replace(/:[^:]*<id>.*$/, ':<id>');
  if (name === 'evalsha' || name === 'eval') return `${name}/${args[2] ?? '?'} ${shape(args[3])}`;
  return name;
}

/**
 * Each client call's execution time inside Redis, by script, over one window of `fn`: SLOWLOG with a threshold of
 * 0 µs logs every call (a script's own commands, logged from client `?:0`, are left out: their time is inside their
 * EVALSHA's, which the logging of each of them also lengthens a little). Run apart from `measure`'s
 * windows, as logging every call costs Redis CPU of its own. What Redis's CPU per operation holds beyond these times
 * is reading and writing the calls on the sockets.
 */
async function execution(
  admin: Redis,
  prefix: string,
  fn: () => Promise<number>,
): Promise<{ calls: ExecutionRow[]; inside: ExecutionRow[] }> {
  const old = (await admin.config('GET', 'slowlog-*')) as string[];
  await admin.config('SET', 'slowlog-max-len', '1000000');
  await admin.config('SET', 'slowlog-log-slower-than', '0');
  await admin.slowlog('RESET');
  let ops: number;
  let entries: unknown[];
  try {
    ops = await fn();
    entries = (await admin.slowlog('GET', -1)) as unknown[];
  } finally {
    for (let i = 0; i + 1 < old.length; i += 2) await admin.config('SET', old[i]!, old[i + 1]!);
    await admin.slowlog('RESET');
  }
  const by = new Map<string, { calls: number; us: number }>();
  const inside = new Map<string, { calls: number; us: number }>();
  const add = (rows: typeof by, key: string, us: number) => {
    const row = rows.get(key) ?? { calls: 0, us: 0 };
    row.calls += 1;
    row.us += us;
    rows.set(key, row);
  };
  for (const e of entries as Array<[number, number, number, string[], string]>) {
    const args = e[3] ?? [];
    // A script's own command is logged too, from client `?:0`: its time is inside its EVALSHA's already, so it is
    // counted apart, by command name.
    if (String(e[4]).startsWith('?:')) {
      add(inside, String(args[0] ?? '').toLowerCase(), Number(e[2]));
      continue;
    }
    const first = String(args[0] ?? '').toLowerCase();
    if (first === 'slowlog' || first === 'config' || first === 'info') continue;
    add(by, callName(args.map(String), prefix), Number(e[2]));
  }
  const rows = (m: typeof by) =>
    [...m]
      .map(([call, r]) => ({ call, callsPerOp: r.calls / ops, usPerOp: r.us / ops }))
      .filter((r) => r.callsPerOp >= 0.05)
      .sort((a, b) => b.usPerOp - a.usPerOp);
  return { calls: rows(by), inside: rows(inside) };
}

function perOp(counts: Counts, ops: number, redisCpuS: number, cpu: Record<string, number>): OperationWork {
  const commands = Object.fromEntries(
    [...counts].sort((a, b) => b[1] - a[1]).map(([name, n]) => [name, Math.round((n / ops) * 100) / 100]),
  );
  const commandsTotal = [...counts.values()].reduce((a, b) => a + b, 0) / ops;
  return { ops, commands, commandsTotal, redisCpuUs: (redisCpuS * 1e6) / ops, cpu };
}

/** Runs `fn` as one measured window of `ops` operations (the count known before, or answered by `fn`). */
async function measure(
  admin: Redis,
  roles: CpuRoles,
  idlePerMs: Counts,
  fn: () => Promise<number | void>,
  ops?: number,
): Promise<OperationWork & { counts: Counts }> {
  const meter = new CpuMeter(roles).start();
  const before = await snapshot(admin);
  const done = await fn();
  const after = await snapshot(admin);
  const n = typeof done === 'number' ? done : (ops ?? 1);
  const counts = delta(before, after, idlePerMs);
  const cpu = meter.perOp(n);
  return { ...perOp(counts, n, after.cpuS - before.cpuS, cpu), counts };
}

/** What one operation's commands were, through MONITOR: `client  command args…`, clients named by their port. */
async function trace(url: string, admin: Redis, fn: () => Promise<unknown>): Promise<string[]> {
  const monitor = await monitorRedis(url);
  try {
    await monitor.ready((marker) => admin.echo(marker));
    const from = monitor.commands.length;
    await fn();
    await sleep(200);
    return monitor.commands
      .slice(from)
      .filter((c) => !(c.name === 'echo' || c.name === 'info'))
      .map((c) => {
        const args = c.args.map((a) => (a.length > 48 ? `${a.slice(0, 45)}…` : a)).join(' ');
        return `${c.source.padStart(15)}  ${c.name} ${args}`;
      });
  } finally {
    monitor.close();
  }
}

export async function runRedisWork(o: {
  log: (m: string) => void;
  cleanup: Array<() => Promise<void> | void>;
  python?: boolean;
  withTrace?: boolean;
  /** Floor, task cycle and plain call windows this many times over (the first also gives the command counts). */
  reps?: number;
}): Promise<RedisWorkReport> {
  const redis = await startRedis({ owned: true });
  o.cleanup.push(() => redis.stop());
  const adminInfo = new RedisAdmin(redis.url);
  o.cleanup.push(() => adminInfo.close());
  await adminInfo.init();
  const admin = adminInfo.client;
  const prefix = uniquePrefix('rw');
  const [stack, floorWorker] = await Promise.all([
    startStack({
      name: 'rw',
      prefix,
      redisUrl: redis.url,
      gateways: 1,
      workers: 1,
      workerConcurrency: 64,
      ...(o.python ? { python: true } : {}),
    }),
    startFloorWorker(redis.url, 'rw-floor', 32),
  ]);
  const floor = new BullFloor(redis.url, 'rw-floor');
  o.cleanup.push(() => floor.close());
  await floor.ready();
  const sessions = await openSessions(stack.gateways[0]!.url, IN_FLIGHT);
  o.cleanup.push(() => Promise.all(sessions.map((s) => s.close())).then(() => undefined));
  const redisPids = adminInfo.pid > 0 ? [adminInfo.pid] : [];
  const trRoles: CpuRoles = {
    gateway: stack.gateways.map((p) => p.pid),
    worker: stack.workers.map((p) => p.pid),
    redis: redisPids,
  };
  const floorRoles: CpuRoles = { worker: [floorWorker.pid], redis: redisPids };
  const cycle = (kind: 'task' | 'plain', maxOps: number, s: McpSession[] = sessions, concurrency = IN_FLIGHT) =>
    cycles({
      sessions: s,
      kind,
      concurrency,
      durationMs: 120_000,
      maxOps,
      cpu: {},
      totalRoles: [],
      ttlMs: 5_000,
    });

  // The task cycle as SDK 1.32.2 clients run it (`pnpm bench --sdk`): tools/call, tasks/get until it is terminal
  // (every pollInterval), tasks/result, on 16 sessions with their GET streams open.
  const sdkClients = await openClients(stack.gateways[0]!.url, IN_FLIGHT);
  o.cleanup.push(() => Promise.all(sdkClients.map((c) => c.close())).then(() => undefined));
  const sdkCycles = async (count: number) => {
    let started = 0;
    await Promise.all(
      sdkClients.map(async (client) => {
        while (started < count) {
          started++;
          await operation(client, 'task');
        }
      }),
    );
    return count;
  };

  o.log('redis work: warming up');
  await sdkCycles(500);
  await cycle('task', 2_000);
  await cycle('plain', 1_000);
  await floor.runCount(1_000, IN_FLIGHT, {});

  o.log('redis work: idle traffic');
  const idleBefore = await snapshot(admin);
  await sleep(IDLE_MS);
  const idleAfter = await snapshot(admin);
  const idle = delta(idleBefore, idleAfter);
  const idleMs = idleAfter.at - idleBefore.at;
  const idlePerMs: Counts = new Map([...idle].map(([k, v]) => [k, v / idleMs]));

  const operations: Record<string, OperationWork> = {};
  const keep = (name: string, w: OperationWork & { counts: Counts }) => {
    const { counts: _counts, ...rest } = w;
    operations[name] = rest;
    o.log(`redis work: ${name}: ${rest.commandsTotal.toFixed(1)} commands, ${rest.redisCpuUs.toFixed(0)} µs Redis CPU`);
    return w;
  };
  const floorOnce = () =>
    measure(admin, floorRoles, idlePerMs, () => floor.runCount(OPS, IN_FLIGHT, {}).then(() => OPS));
  const taskOnce = () => measure(admin, trRoles, idlePerMs, () => cycle('task', OPS).then((r) => r.ops ?? OPS));
  const plainOnce = () => measure(admin, trRoles, idlePerMs, () => cycle('plain', OPS).then((r) => r.ops ?? OPS));
  const floorUs = [keep('floor', await floorOnce()).redisCpuUs];
  const task = keep('task', await taskOnce());
  const taskUs = [task.redisCpuUs];
  const plainUs = [keep('plain', await plainOnce()).redisCpuUs];
  keep('sdk', await measure(admin, trRoles, idlePerMs, () => sdkCycles(OPS)));
  // Redis's CPU per window moves by ±30% on a shared machine: more windows, each ratio from neighbours, the median.
  for (let rep = 1; rep < (o.reps ?? 1); rep++) {
    floorUs.push((await floorOnce()).redisCpuUs);
    taskUs.push((await taskOnce()).redisCpuUs);
    plainUs.push((await plainOnce()).redisCpuUs);
    o.log(
      `redis work: repetition ${rep + 1}: task ${(taskUs[rep]! / floorUs[rep]!).toFixed(2)}x the floor's Redis CPU`,
    );
  }
  const median = (xs: number[]) => {
    const sorted = [...xs].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
  };
  const repetitions = {
    floorUs,
    taskUs,
    plainUs,
    taskOverFloor: median(taskUs.map((t, i) => t / floorUs[i]!)),
    plainOverFloor: median(plainUs.map((p, i) => p / floorUs[i]!)),
  };
  if (!o.python) {
    // Progress: tasks that each report PROGRESS_UPDATES updates; per update, net of as many task cycles.
    const progress = await measure(admin, trRoles, idlePerMs, async () => {
      await progressLatency(sessions, PROGRESS_TASKS, PROGRESS_UPDATES, 75);
      return PROGRESS_TASKS * PROGRESS_UPDATES;
    });
    const net: Counts = new Map();
    for (const [name, n] of progress.counts) {
      const d = n - (task.counts.get(name) ?? 0) * (PROGRESS_TASKS / task.ops);
      if (d > 0.5) net.set(name, d);
    }
    keep('progress', {
      ...perOp(net, progress.ops, (progress.redisCpuUs * progress.ops) / 1e6, progress.cpu),
      counts: net,
    });
    // Cancel: a task that runs until its client cancels it, from its create to its abort and end (no tasks/result).
    keep(
      'cancel',
      await measure(admin, trRoles, idlePerMs, async () => {
        const ids = await Promise.all(
          sessions.slice(0, CANCEL_TASKS).map(async (s) => {
            const created = await s.call('tools/call', {
              name: 'bench_hold',
              arguments: { ms: 60_000 },
              task: { ttl: 5_000 },
            });
            return { s, taskId: created.task.taskId as string };
          }),
        );
        await sleep(300);
        await Promise.all(ids.map(({ s, taskId }) => s.call('tasks/cancel', { taskId })));
        await sleep(700);
        return CANCEL_TASKS;
      }),
    );
  }

  const report: RedisWorkReport = {
    worker: o.python ? 'python' : 'node',
    operations,
    idlePerSecond: Object.fromEntries([...idle].map(([k, v]) => [k, Math.round((v * 1000 * 100) / idleMs) / 100])),
    repetitions,
  };
  // Where a call's Redis time goes, by script: a window of its own for each kind (SLOWLOG costs Redis CPU too).
  const windows = {
    floor: await execution(admin, prefix, () => floor.runCount(OPS, IN_FLIGHT, {}).then(() => OPS)),
    task: await execution(admin, prefix, () => cycle('task', OPS).then((r) => r.ops ?? OPS)),
    plain: await execution(admin, prefix, () => cycle('plain', OPS).then((r) => r.ops ?? OPS)),
  };
  report.execution = Object.fromEntries(Object.entries(windows).map(([k, w]) => [k, w.calls]));
  report.executionInside = Object.fromEntries(Object.entries(windows).map(([k, w]) => [k, w.inside]));
  if (o.withTrace) {
    await sleep(500);
    report.trace = {
      task: await trace(redis.url, admin, () => cycle('task', 1, sessions, 1)),
      plain: await trace(redis.url, admin, () => cycle('plain', 1, sessions, 1)),
      floor: await trace(redis.url, admin, () => floor.runCount(1, 1, {})),
    };
  }
  return report;
}

/** The report as a text table: one column per operation, commands by name, then the CPU rows. */
export function renderRedisWork(report: RedisWorkReport): string {
  const ops = Object.keys(report.operations);
  const label: Record<string, string> = {
    floor: 'BullMQ floor',
    task: 'task cycle',
    plain: 'plain call',
    sdk: 'SDK task cycle',
    progress: 'progress upd.',
    cancel: 'cancelled task',
  };
  const names = new Set<string>();
  for (const op of ops) for (const n of Object.keys(report.operations[op]!.commands)) names.add(n);
  const order = [...names].sort(
    (a, b) => (report.operations['task']?.commands[b] ?? 0) - (report.operations['task']?.commands[a] ?? 0),
  );
  const width = 15;
  const cell = (v: number | undefined, digits = 1) =>
    (v === undefined || !Number.isFinite(v) ? '' : v.toFixed(digits)).padStart(width);
  const lines: string[] = [];
  lines.push(
    `Redis work per operation (${report.worker} worker; ${OPS} ops at ${IN_FLIGHT} in flight; a Redis of its own; ` +
      'idle traffic taken off)',
  );
  lines.push('command'.padEnd(22) + ops.map((op) => (label[op] ?? op).padStart(width)).join(''));
  const row = (name: string, values: Array<number | undefined>, digits = 1) =>
    lines.push(name.padEnd(22) + values.map((v) => cell(v, digits)).join(''));
  row(
    'commands, total',
    ops.map((op) => report.operations[op]!.commandsTotal),
  );
  for (const name of order)
    row(
      `  ${name}`,
      ops.map((op) => report.operations[op]!.commands[name]),
      2,
    );
  row(
    'Redis CPU, µs (INFO)',
    ops.map((op) => report.operations[op]!.redisCpuUs),
    0,
  );
  for (const role of ['gateway', 'worker', 'redis', 'loadgen']) {
    row(
      `CPU-ms ${role}${role === 'redis' ? ' (/proc)' : ''}`,
      ops.map((op) => report.operations[op]!.cpu[`cpu.${role}`]),
      3,
    );
  }
  const floor = report.operations['floor'];
  const task = report.operations['task'];
  if (floor && task) {
    lines.push(
      `task cycle / floor: ${(task.commandsTotal / floor.commandsTotal).toFixed(2)}x commands, ` +
        `${(task.redisCpuUs / floor.redisCpuUs).toFixed(2)}x Redis CPU`,
    );
  }
  const reps = report.repetitions;
  if (reps && reps.floorUs.length > 1) {
    const us = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(' ');
    lines.push(
      `Redis CPU per op over ${reps.floorUs.length} repetitions, µs: floor ${us(reps.floorUs)}; task ${us(reps.taskUs)}; ` +
        `plain ${us(reps.plainUs)}`,
      `median of each repetition's ratio to its floor: task cycle ${reps.taskOverFloor.toFixed(2)}x, plain call ` +
        `${reps.plainOverFloor.toFixed(2)}x`,
    );
  }
  lines.push(
    `idle, per second: ${Object.entries(report.idlePerSecond)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}`,
  );
  lines.push(
    'SDK task cycle = tools/call, tasks/get until terminal, tasks/result (SDK 1.32.2 clients); ' +
      'progress upd. = per update, net of its task cycle; cancelled task = create → start → tasks/cancel → abort → end',
  );
  if (report.execution) {
    lines.push('', 'Execution inside Redis per operation, by client call (SLOWLOG at 0 µs; no socket I/O):');
    for (const [name, rows] of Object.entries(report.execution)) {
      const total = rows.reduce((a, r) => a + r.usPerOp, 0);
      const calls = rows.reduce((a, r) => a + r.callsPerOp, 0);
      lines.push(`  ${label[name] ?? name}: ${calls.toFixed(1)} calls, ${total.toFixed(0)} µs`);
      for (const r of rows) {
        lines.push(
          `    ${r.call.padEnd(44)} ${r.callsPerOp.toFixed(2).padStart(6)} calls ${r.usPerOp.toFixed(1).padStart(7)} µs`,
        );
      }
      const inside = report.executionInside?.[name];
      if (inside && inside.length > 0) {
        const own = inside.reduce((a, r) => a + r.usPerOp, 0);
        const top = inside
          .slice(0, 6)
          .map((r) => `${r.call} ${r.usPerOp.toFixed(1)}`)
          .join(', ');
        lines.push(`    of which the scripts' own commands: ${own.toFixed(0)} µs (${top}, …); the rest is the scripts`);
      }
    }
  }
  if (report.trace) {
    for (const [name, cmds] of Object.entries(report.trace)) {
      lines.push('', `MONITOR, one ${name} (${cmds.length} commands):`, ...cmds.map((c) => `  ${c}`));
    }
  }
  return lines.join('\n');
}

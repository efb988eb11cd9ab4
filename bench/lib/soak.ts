/**
 * `pnpm bench --soak [--minutes N]` (issue 9): a steady mixed load of task cycles over 50 sessions for N minutes
 * (default 5) with 5 s task ttls, so that hundreds of ttl periods pass and expiry is exercised all along (a
 * one-hour-equivalent of a 1 h-ttl deployment in a few minutes). Every 30 s it prints: tasks created / completed /
 * cancelled / failed / lost / duplicated, gateway RSS and heap (after a full GC), worker RSS, Redis used_memory and
 * key count. At the end the load stops, sessions close, one ttl (plus the reaper interval) passes, and a summary
 * says whether memory stayed flat.
 *
 * Definitions: *lost* — a created task that never became terminal (within 30 s of its expected end) or whose result
 * could not be read again before its ttl; *duplicated* — the fixture tool's side effect (an INCR of a per-task
 * counter at its end) seen more than once, or seen again after the benchmark had read and deleted it.
 */
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { RpcError, openSessions, type McpSession } from './mcp-http.js';
import { type RedisAdmin, assertAlive, probeHeap, rssBytes, startStack, type Stack } from './procs.js';
import { machine, writeResults } from './report.js';
import { now, sleep } from './stats.js';

const SESSIONS = 50;
const TTL_MS = 5_000;
const REPORT_EVERY_MS = 30_000;
const THINK_MS = 200;
const RESULT_TIMEOUT_MS = 30_000;
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

interface Counts {
  created: number;
  completed: number;
  cancelled: number;
  failed: number;
  lost: number;
  duplicated: number;
  lateEffects: number;
  missingEffect: number;
  createErrors: number;
  rereadOk: number;
  expiredOk: number;
  notExpired: number;
  progress: number;
}

interface Sample {
  atS: number;
  gatewayRss: number;
  gatewayHeap: number;
  workerRss: number;
  redisUsed: number;
  redisKeys: number;
  inflight: number;
}

const mb = (b: number) => `${(b / 2 ** 20).toFixed(1)} MB`;

export async function runSoak(o: {
  redis: TestRedis;
  admin: RedisAdmin;
  minutes: number;
  cleanup: Array<() => Promise<void> | void>;
  log: (m: string) => void;
}): Promise<number> {
  if (!Number.isFinite(o.minutes) || o.minutes <= 0) throw new Error('--minutes must be a positive number');
  const startedAt = new Date();
  const prefix = uniquePrefix('soak');
  const stack = await startStack({
    name: 'soak',
    prefix,
    redisUrl: o.redis.url,
    gateways: 1,
    workers: 2,
    workerConcurrency: 32,
    // Event-store streams of closed sessions expire within the summary's wait, like the tasks.
    env: { TASKRELAY_EVENT_TTL_MS: String(TTL_MS * 4) },
  });
  const sessions = await openSessions(stack.gateways[0]!.url, SESSIONS);
  let sessionsClosed = false;
  o.cleanup.push(async () => {
    if (!sessionsClosed) await Promise.all(sessions.map((s) => s.close()));
  });
  const counts: Counts = {
    created: 0,
    completed: 0,
    cancelled: 0,
    failed: 0,
    lost: 0,
    duplicated: 0,
    lateEffects: 0,
    missingEffect: 0,
    createErrors: 0,
    rereadOk: 0,
    expiredOk: 0,
    notExpired: 0,
    progress: 0,
  };
  const firstProblem: Record<string, string> = {};
  const problem = (kind: keyof Counts, detail: string) => {
    counts[kind]++;
    firstProblem[kind] ??= detail;
  };
  for (const s of sessions) {
    s.onNotification = (m) => {
      if (m.method === 'notifications/progress') counts.progress++;
    };
  }
  const redis = o.admin.client;
  const effectKey = (taskId: string) => `${prefix}:bench:effect:${taskId}`;
  const pendingChecks = new Set<Promise<void>>();
  const later = (ms: number, fn: () => Promise<void>) => {
    const p = sleep(ms)
      .then(fn)
      .catch(() => undefined)
      .finally(() => pendingChecks.delete(p));
    pendingChecks.add(p);
  };
  let inflight = 0;

  const baseline = await sample(0, stack, o.admin, 0);
  const samples: Sample[] = [];
  const t0 = now();
  const endAt = t0 + o.minutes * 60_000;
  o.log(`soak: ${o.minutes} min, ${SESSIONS} sessions, ttl ${TTL_MS} ms, report every ${REPORT_EVERY_MS / 1000} s`);
  console.log(
    `\n${'t'.padStart(5)} ${'created'.padStart(8)} ${'done'.padStart(7)} ${'cancel'.padStart(7)} ${'failed'.padStart(6)} ` +
      `${'lost'.padStart(5)} ${'dup'.padStart(4)}  gateway rss / heap     worker rss   redis used / keys`,
  );

  const cycle = async (s: McpSession, n: number) => {
    const r = Math.random();
    const kind = r < 0.2 ? 'cancel' : r < 0.6 ? 'progress' : 'plain';
    const args =
      kind === 'plain' ? { ms: 20, steps: 1 } : kind === 'progress' ? { ms: 200, steps: 5 } : { ms: 300, steps: 3 };
    let taskId: string;
    try {
      const created = await s.call('tools/call', {
        name: 'bench_effect',
        arguments: args,
        task: { ttl: TTL_MS },
        ...(kind === 'progress' ? { _meta: { progressToken: `soak-${n}` } } : {}),
      });
      taskId = created.task.taskId as string;
      counts.created++;
    } catch (error) {
      problem('createErrors', error instanceof Error ? error.message : String(error));
      return;
    }
    inflight++;
    try {
      if (kind === 'cancel') {
        await sleep(Math.random() * 150);
        await s.call('tasks/cancel', { taskId }).catch((error: unknown) => {
          // A task that finished first: -32602 is the specified answer.
          if (!(error instanceof RpcError && error.error.code === -32602)) throw error;
        });
      }
      const answer = await Promise.race([
        s.send('tasks/result', { taskId }),
        sleep(RESULT_TIMEOUT_MS).then(() => undefined),
      ]);
      let status: string | undefined;
      for (let i = 0; i < 10 && !(status && TERMINAL.has(status)); i++) {
        if (i > 0) await sleep(500);
        status = ((await s.call('tasks/get', { taskId })) as { status?: string }).status;
      }
      if (!status || !TERMINAL.has(status)) {
        problem(
          'lost',
          `${taskId} still ${status} (tasks/result: ${answer ? JSON.stringify(answer).slice(0, 150) : 'timed out'})`,
        );
        return;
      }
      if (status === 'completed') {
        counts.completed++;
        if (answer?.error || answer?.result?.isError) {
          problem('lost', `${taskId} completed but tasks/result gave ${JSON.stringify(answer).slice(0, 150)}`);
        }
        // Re-read one in ten at half its ttl (must work), and after its ttl (must be gone).
        if (n % 10 === 0) {
          later(TTL_MS / 2, async () => {
            const again = await s.send('tasks/result', { taskId });
            if (again.error) problem('lost', `${taskId} unreadable before its ttl: ${again.error.message}`);
            else counts.rereadOk++;
          });
          later(TTL_MS + 3_000, async () => {
            const gone = await s.send('tasks/get', { taskId });
            if (gone.error?.code === -32602) counts.expiredOk++;
            else problem('notExpired', `${taskId} still readable ${TTL_MS + 3_000} ms after completing`);
          });
        }
      } else if (status === 'cancelled') counts.cancelled++;
      else problem('failed', `${taskId}: ${JSON.stringify(answer).slice(0, 150)}`);
      // The side effect, read after a second (a cancelled tool may still be finishing), then deleted.
      later(1_000, async () => {
        const value = await redis.getdel(effectKey(taskId));
        const times = value === null ? 0 : Number(value);
        if (times > 1) problem('duplicated', `${taskId}: side effect ${times} times`);
        if (status === 'completed' && times === 0)
          problem('missingEffect', `${taskId} completed without its side effect`);
      });
    } catch (error) {
      problem('lost', `${taskId}: ${error instanceof Error ? error.message : String(error)}`);
    } finally {
      inflight--;
    }
  };

  let stopLoad = false;
  let seq = 0;
  const loops = sessions.map(async (s) => {
    while (!stopLoad && now() < endAt) {
      await cycle(s, seq++);
      await sleep(THINK_MS * (0.5 + Math.random()));
    }
  });
  let crashed = '';
  const reporter = (async () => {
    for (let next = t0 + REPORT_EVERY_MS; ; next += REPORT_EVERY_MS) {
      while (!stopLoad && now() < next) await sleep(Math.min(250, Math.max(1, next - now())));
      if (stopLoad) break;
      try {
        assertAlive([...stack.gateways, ...stack.workers], 'soak');
      } catch (error) {
        crashed = error instanceof Error ? error.message : String(error);
        stopLoad = true;
        break;
      }
      const s = await sample((now() - t0) / 1000, stack, o.admin, inflight);
      samples.push(s);
      printSample(s, counts);
    }
  })();
  await Promise.all(loops);
  stopLoad = true;
  await reporter;
  await Promise.all([...pendingChecks]);
  const loadEnd = await sample((now() - t0) / 1000, stack, o.admin, inflight);
  samples.push(loadEnd);
  printSample(loadEnd, counts);

  // Drain: close the sessions, let every ttl (and the reaper, and the event-store ttl) pass.
  await Promise.all(sessions.map((s) => s.close()));
  sessionsClosed = true;
  o.log(`load stopped; waiting ${(TTL_MS * 4 + 6_000) / 1000} s for ttl expiry`);
  await sleep(TTL_MS * 4 + 6_000);
  const leftover = await scanCount(o.admin, `${prefix}:bench:effect:*`);
  if (leftover > 0) {
    counts.lateEffects += leftover;
    firstProblem['lateEffects'] ??= `${leftover} side-effect counters written after the task's counter was read`;
  }
  const drained = await sample((now() - t0) / 1000, stack, o.admin, 0);
  const leftKeys = await keyGroups(o.admin);

  // Flatness: steady state is everything after the first report (several ttls in).
  const steady = samples.slice(1, -1).length >= 2 ? samples.slice(1, -1) : samples;
  const first = steady[0]!;
  const last = steady.at(-1)!;
  const growth = (a: number, b: number) => (a > 0 ? (b - a) / a : 0);
  const checks = [
    ['gateway heap', first.gatewayHeap, last.gatewayHeap],
    ['gateway RSS', first.gatewayRss, last.gatewayRss],
    ['worker RSS', first.workerRss, last.workerRss],
    ['Redis used_memory', first.redisUsed, last.redisUsed],
    ['Redis keys', first.redisKeys, last.redisKeys],
  ] as const;
  // 20% (and 4 MB / 200 keys of slack) over the steady part of the run; a leak of one entry per task would be far more.
  const flat = checks.map(([name, a, b]) => {
    const g = growth(a, b);
    const slack = name === 'Redis keys' ? 200 : 4 * 2 ** 20;
    return { name, first: a, last: b, growth: g, flat: b - a <= Math.max(a * 0.2, slack) };
  });
  // After every ttl has passed with no load, what is left should not depend on how many tasks ran.
  const keysLeft = drained.redisKeys - baseline.redisKeys;
  const drainedFlat = keysLeft <= 200;
  const allFlat = flat.every((f) => f.flat) && drainedFlat;
  const info = machine(o.admin.version);
  const lines = [
    '',
    `soak summary — ${o.minutes} min, ${SESSIONS} sessions, ttl ${TTL_MS} ms (${Math.round((o.minutes * 60_000) / TTL_MS)} ttl periods)`,
    `machine: ${info.cpuModel}, ${info.cores} cores, ${info.memoryGiB} GiB, node ${info.node}, redis ${info.redis}`,
    `tasks: created ${counts.created}, completed ${counts.completed}, cancelled ${counts.cancelled}, failed ${counts.failed}`,
    `lost ${counts.lost}, duplicated ${counts.duplicated}, side effect after it was read ${counts.lateEffects}, ` +
      `completed without side effect ${counts.missingEffect}, create errors ${counts.createErrors}`,
    `expiry: re-read before ttl ok ${counts.rereadOk}, gone after ttl ${counts.expiredOk}, still there after ttl ${counts.notExpired}; progress notifications ${counts.progress}`,
    `memory over the steady part (t=${first.atS.toFixed(0)} s → ${last.atS.toFixed(0)} s):`,
    ...flat.map(
      (f) =>
        `  ${f.name.padEnd(18)} ${fmtValue(f.name, f.first).padStart(10)} → ${fmtValue(f.name, f.last).padStart(10)} ` +
        `(${(f.growth * 100).toFixed(1)}%) ${f.flat ? 'flat' : 'GROWING'}`,
    ),
    `after the load stopped and one ttl passed (sessions closed): Redis keys ${drained.redisKeys} (before the load ${baseline.redisKeys}), ` +
      `used_memory ${mb(drained.redisUsed)} (before ${mb(baseline.redisUsed)}), gateway heap ${mb(drained.gatewayHeap)} (before ${mb(baseline.gatewayHeap)})`,
    `keys left, by pattern: ${leftKeys.map(([k, n]) => `${k} ${n}`).join(', ') || 'none'}` +
      (leftKeys[0] && leftKeys[0][1] > 100 ? ` (e.g. ${leftKeys[0][2]})` : '') +
      (drainedFlat ? '' : ` — ${keysLeft} keys more than before the load: they grow with the number of tasks run`),
    `verdict: memory ${allFlat ? 'flat after ttl expiry' : 'NOT flat'}; ${counts.lost + counts.duplicated + counts.lateEffects === 0 ? 'nothing lost or duplicated' : 'LOST OR DUPLICATED TASKS'}`,
    ...(crashed ? [`CRASH: ${crashed}`] : []),
    ...Object.entries(firstProblem).map(([k, d]) => `  first ${k}: ${d}`),
  ];
  console.log(lines.join('\n'));
  const file = await writeResults(
    {
      mode: 'soak',
      startedAt: startedAt.toISOString(),
      machine: info,
      config: {
        minutes: o.minutes,
        sessions: SESSIONS,
        ttlMs: TTL_MS,
        reportEveryMs: REPORT_EVERY_MS,
        thinkMs: THINK_MS,
      },
      counts,
      firstProblem,
      baseline,
      samples,
      drained,
      leftKeys,
      keysLeftAfterDrain: keysLeft,
      flat,
      crashed: crashed || null,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return counts.lost + counts.duplicated + counts.lateEffects > 0 || crashed ? 1 : 0;
}

function fmtValue(name: string, v: number): string {
  return name === 'Redis keys' ? String(v) : mb(v);
}

async function sample(atS: number, stack: Stack, admin: RedisAdmin, inflight: number): Promise<Sample> {
  const gw = await probeHeap(stack.gateways[0]!.pid);
  return {
    atS,
    gatewayRss: gw.rss,
    gatewayHeap: gw.heapUsed,
    workerRss: stack.workers.reduce((a, w) => a + rssBytes(w.pid), 0),
    redisUsed: await admin.usedMemory(),
    redisKeys: await admin.dbsize(),
    inflight,
  };
}

function printSample(s: Sample, c: Counts): void {
  console.log(
    `${s.atS.toFixed(0).padStart(4)}s ${String(c.created).padStart(8)} ${String(c.completed).padStart(7)} ` +
      `${String(c.cancelled).padStart(7)} ${String(c.failed).padStart(6)} ${String(c.lost).padStart(5)} ` +
      `${String(c.duplicated + c.lateEffects).padStart(4)}  ${mb(s.gatewayRss).padStart(9)} / ${mb(s.gatewayHeap).padStart(8)}  ` +
      `${mb(s.workerRss).padStart(9)}   ${mb(s.redisUsed).padStart(9)} / ${s.redisKeys}`,
  );
}

async function scanCount(admin: RedisAdmin, pattern: string): Promise<number> {
  let cursor = '0';
  let n = 0;
  do {
    const [next, keys] = await admin.client.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    n += keys.length;
  } while (cursor !== '0');
  return n;
}

/** Every key, grouped by its pattern (id-like segments as `*`), biggest groups first (top 8). */
async function keyGroups(admin: RedisAdmin): Promise<Array<[string, number, string]>> {
  const groups = new Map<string, number>();
  const examples = new Map<string, string>();
  let cursor = '0';
  do {
    const [next, keys] = await admin.client.scan(cursor, 'COUNT', 1000);
    cursor = next;
    for (const key of keys) {
      const pattern = key
        .split(':')
        .map((seg) => (/^[0-9a-f-]{16,}$/i.test(seg) || /^\d+$/.test(seg) || /^trtest-/.test(seg) ? '*' : seg))
        .join(':');
      groups.set(pattern, (groups.get(pattern) ?? 0) + 1);
      if (!examples.has(pattern)) examples.set(pattern, key);
    }
  } while (cursor !== '0');
  return [...groups]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 8)
    .map(([pattern, n]) => [pattern, n, examples.get(pattern) ?? '']);
}

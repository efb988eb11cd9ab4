/**
 * `pnpm bench --load`: 1,000 tasks in flight at once over 50 sessions (20 per session), each a `bench_effect` of
 * 200 ms that counts its side effect. Reports the completion time of the whole batch, throughput, latencies, CPU per
 * task and every failure (creation errors, non-completed tasks, timeouts, missing or doubled side effects).
 */
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { openSessions, type McpSession } from './mcp-http.js';
import { type RedisAdmin, assertAlive, startStack } from './procs.js';
import { machine, writeResults } from './report.js';
import { CpuMeter } from './scenarios.js';
import { latency, now } from './stats.js';

const TASKS = 1_000;
const SESSIONS = 50;
const TOOL_MS = 200;
const WORKERS = 2;
const WORKER_CONCURRENCY = 100;
const TIMEOUT_MS = 120_000;

export async function runLoad(o: {
  redis: TestRedis;
  admin: RedisAdmin;
  cleanup: Array<() => Promise<void> | void>;
  log: (m: string) => void;
}): Promise<number> {
  const startedAt = new Date();
  const prefix = uniquePrefix('load');
  const stack = await startStack({
    name: 'load',
    prefix,
    redisUrl: o.redis.url,
    gateways: 1,
    workers: WORKERS,
    workerConcurrency: WORKER_CONCURRENCY,
  });
  const sessions: McpSession[] = await openSessions(stack.gateways[0]!.url, SESSIONS);
  o.cleanup.push(() => Promise.all(sessions.map((s) => s.close())).then(() => undefined));
  o.log(`load: ${TASKS} tasks over ${SESSIONS} sessions, ${WORKERS} workers × ${WORKER_CONCURRENCY}`);

  const failures: Record<string, number> = {};
  const firstFailure: Record<string, string> = {};
  const fail = (kind: string, detail: string) => {
    failures[kind] = (failures[kind] ?? 0) + 1;
    firstFailure[kind] ??= detail;
  };
  const createLatency: number[] = [];
  const endToEnd: number[] = [];
  const completedIds: string[] = [];
  const meter = new CpuMeter({
    gateway: stack.gateways.map((g) => g.pid),
    worker: stack.workers.map((w) => w.pid),
    redis: o.admin.pid > 0 ? [o.admin.pid] : [],
  }).start();
  const t0 = now();
  let createdAllAt = 0;
  let created = 0;
  const perSession = TASKS / SESSIONS;
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), TIMEOUT_MS)));
  const run = Promise.all(
    sessions.flatMap((s) =>
      Array.from({ length: perSession }, async () => {
        const start = now();
        let taskId: string;
        try {
          const r = await s.call('tools/call', {
            name: 'bench_effect',
            arguments: { ms: TOOL_MS, steps: 2 },
            task: { ttl: 300_000 },
          });
          taskId = r.task.taskId as string;
          createLatency.push(now() - start);
          if (++created === TASKS) createdAllAt = now();
        } catch (error) {
          fail('create failed', error instanceof Error ? error.message : String(error));
          return;
        }
        try {
          const result = await s.call('tasks/result', { taskId });
          if (result?.isError) fail('tool error', JSON.stringify(result).slice(0, 200));
          else {
            endToEnd.push(now() - start);
            completedIds.push(taskId);
          }
        } catch (error) {
          fail('tasks/result failed', error instanceof Error ? error.message : String(error));
        }
      }),
    ),
  );
  const outcome = await Promise.race([run, timedOut]);
  clearTimeout(timer);
  const wallMs = now() - t0;
  if (outcome === 'timeout') {
    for (const s of sessions) s.abortInflight();
    fail('timed out', `${TASKS - completedIds.length} tasks not terminal after ${TIMEOUT_MS} ms`);
  }
  const done = completedIds.length;
  const cpu = meter.perOp(Math.max(1, done));

  // Side effects: exactly one per completed task.
  let duplicated = 0;
  let missingEffect = 0;
  const redis = o.admin.client;
  for (let i = 0; i < completedIds.length; i += 500) {
    const keys = completedIds.slice(i, i + 500).map((id) => `${prefix}:bench:effect:${id}`);
    const values = await redis.mget(keys);
    for (const v of values) {
      if (v === null) missingEffect++;
      else if (Number(v) > 1) duplicated++;
    }
    await redis.del(keys);
  }
  if (duplicated > 0) fail('side effect twice', `${duplicated} tasks`);
  if (missingEffect > 0) fail('completed without side effect', `${missingEffect} tasks`);
  try {
    assertAlive([...stack.gateways, ...stack.workers], 'load');
  } catch (error) {
    fail('process died', error instanceof Error ? error.message : String(error));
  }

  const c = latency(createLatency);
  const e = latency(endToEnd);
  const info = machine(o.admin.version);
  const totalFailures = Object.values(failures).reduce((a, b) => a + b, 0);
  const lines = [
    '',
    `taskrelay load — ${TASKS} concurrent tasks over ${SESSIONS} sessions (bench_effect ${TOOL_MS} ms), 1 gateway, ${WORKERS} workers × ${WORKER_CONCURRENCY}`,
    `machine: ${info.cpuModel}, ${info.cores} cores, ${info.memoryGiB} GiB, node ${info.node}, redis ${info.redis}, load average ${info.loadavgAtStart.join(' ')}`,
    '',
    `completed            ${done} / ${TASKS}`,
    `completion time      ${(wallMs / 1000).toFixed(2)} s (all created after ${createdAllAt ? ((createdAllAt - t0) / 1000).toFixed(2) : '—'} s)`,
    `throughput           ${(done / (wallMs / 1000)).toFixed(0)} tasks/s (ceiling for ${TOOL_MS} ms tasks on ${WORKERS * WORKER_CONCURRENCY} slots: ${((WORKERS * WORKER_CONCURRENCY * 1000) / TOOL_MS).toFixed(0)} tasks/s)`,
    `create latency       p50 ${c.p50.toFixed(1)} ms, p99 ${c.p99.toFixed(1)} ms`,
    `create → result      p50 ${e.p50.toFixed(1)} ms, p99 ${e.p99.toFixed(1)} ms, max ${e.max.toFixed(1)} ms`,
    `CPU-ms per task      gateway ${cpu['cpu.gateway']!.toFixed(2)}, workers ${cpu['cpu.worker']!.toFixed(2)}, Redis ${cpu['cpu.redis']!.toFixed(2)}, load generator ${cpu['cpu.loadgen']!.toFixed(2)}`,
    `failures             ${totalFailures}${totalFailures ? '' : ' (none)'}`,
    ...Object.entries(failures).map(([k, n]) => `  ${k}: ${n} (first: ${firstFailure[k]})`),
  ];
  console.log(lines.join('\n'));
  const file = await writeResults(
    {
      mode: 'load',
      startedAt: startedAt.toISOString(),
      machine: info,
      config: {
        tasks: TASKS,
        sessions: SESSIONS,
        toolMs: TOOL_MS,
        workers: WORKERS,
        workerConcurrency: WORKER_CONCURRENCY,
      },
      completed: done,
      wallMs,
      createdAllMs: createdAllAt ? createdAllAt - t0 : null,
      throughputPerS: done / (wallMs / 1000),
      createLatency: c,
      endToEnd: e,
      cpuMsPerTask: cpu,
      failures,
      firstFailure,
    },
    startedAt,
  );
  console.log(`\nresults: ${file}`);
  return totalFailures > 0 ? 1 : 0;
}

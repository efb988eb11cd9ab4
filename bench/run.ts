/**
 * `pnpm bench`: latency figures for progress and cancellation against real processes on loopback, side by side with
 * the raw Redis pub/sub floor. Bounded in count and time; stops everything it started.
 */
import { Redis } from 'ioredis';
import hdr from 'hdr-histogram-js';
import { CreateTaskResultSchema, ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix } from '../test/helpers/redis.js';
import { waitFor } from '../test/helpers/wait-for.js';
import { ROOT, connectClient, startGatewayProcess, startWorkerProcess, stopAll } from '../test/helpers/processes.js';

const now = () => performance.timeOrigin + performance.now();
const UPDATES_PER_TASK = 20;
const INTERVAL_MS = 60; // above the 50 ms throttle, so no update is coalesced away

interface Row {
  scenario: string;
  concurrency: number;
  samples: number;
  p50: string;
  p99: string;
  max: string;
}
const rows: Row[] = [];

function record(scenario: string, concurrency: number, samples: number[]): void {
  const h = hdr.build({
    lowestDiscernibleValue: 1,
    highestTrackableValue: 60_000_000,
    numberOfSignificantValueDigits: 3,
  });
  for (const s of samples) h.recordValue(Math.max(1, Math.round(s * 1000))); // microseconds
  const ms = (us: number) => (us / 1000).toFixed(2);
  rows.push({
    scenario,
    concurrency,
    samples: samples.length,
    p50: ms(h.getValueAtPercentile(50)),
    p99: ms(h.getValueAtPercentile(99)),
    max: ms(h.maxValue),
  });
}

async function rawPubSub(url: string, concurrency: number): Promise<void> {
  const pub = new Redis(url);
  const sub = new Redis(url);
  const samples: number[] = [];
  await sub.subscribe('bench:raw');
  sub.on('message', (_c, m: string) => samples.push(now() - Number(m)));
  const total = concurrency * UPDATES_PER_TASK;
  // Same shape as the task scenario: `concurrency` publishers, each every INTERVAL_MS.
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = 0; i < UPDATES_PER_TASK; i++) {
        await new Promise((r) => setTimeout(r, INTERVAL_MS));
        await pub.publish('bench:raw', String(now()));
      }
    }),
  );
  await waitFor(() => samples.length >= total, { timeoutMs: 30_000 });
  record('raw ioredis publish → message', concurrency, samples);
  pub.disconnect();
  sub.disconnect();
}

async function progressLatency(url: string, concurrency: number): Promise<void> {
  const client = await connectClient(url);
  const samples: number[] = [];
  client.setNotificationHandler(ProgressNotificationSchema, (n) => {
    if (n.params.message) samples.push(now() - Number(n.params.message));
  });
  const ids = await Promise.all(
    Array.from({ length: concurrency }, (_, i) =>
      client.request(
        {
          method: 'tools/call',
          params: {
            name: 'bench_progress',
            arguments: { count: UPDATES_PER_TASK, intervalMs: INTERVAL_MS },
            task: {},
            _meta: { progressToken: `b${i}` },
          },
        },
        CreateTaskResultSchema,
      ),
    ),
  );
  await waitFor(() => samples.length >= concurrency * UPDATES_PER_TASK, { timeoutMs: 60_000 });
  record('ctx.progress → client notification', concurrency, samples);
  void ids;
  await client.close();
}

async function cancelLatency(url: string, redisUrl: string, concurrency: number, prefix: string): Promise<void> {
  const client = await connectClient(url);
  const r = new Redis(redisUrl);
  const started = new Set<string>();
  client.setNotificationHandler(ProgressNotificationSchema, (n) => void started.add(String(n.params.progressToken)));
  const tasks = await Promise.all(
    Array.from({ length: concurrency }, async (_, i) => {
      const key = `${prefix}:bench:abort:${i}`;
      const created = await client.request(
        {
          method: 'tools/call',
          params: { name: 'bench_cancel', arguments: { key }, task: {}, _meta: { progressToken: `c${i}` } },
        },
        CreateTaskResultSchema,
      );
      return { taskId: created.task.taskId, key, token: `c${i}` };
    }),
  );
  await waitFor(() => tasks.every((t) => started.has(t.token)), { timeoutMs: 30_000 });
  const answered = new Map<string, number>();
  await Promise.all(
    tasks.map(async (t) => {
      await client.experimental.tasks.cancelTask(t.taskId);
      answered.set(t.key, now());
    }),
  );
  const samples: number[] = [];
  await waitFor(
    async () => {
      const values = await r.mget(tasks.map((t) => t.key));
      return values.every((v) => v !== null) ? values : undefined;
    },
    { timeoutMs: 30_000 },
  ).then((values) => values.forEach((v, i) => samples.push(Number(v) - (answered.get(tasks[i]?.key ?? '') ?? 0))));
  record('tasks/cancel answered → signal aborted', concurrency, samples);
  r.disconnect();
  await client.close();
}

async function main(): Promise<void> {
  const redis = await startRedis({ owned: true });
  const prefix = uniquePrefix('bench');
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: prefix, LOG_LEVEL: 'warn' };
  try {
    const gateway = await startGatewayProcess(env);
    await startWorkerProcess({
      ...env,
      LOG_LEVEL: 'info',
      TASKRELAY_TOOLS: `${ROOT}/bench/bench-tools.mjs`,
      WORKER_CONCURRENCY: '128',
    });
    for (const concurrency of [1, 100]) {
      await rawPubSub(redis.url, concurrency);
      await progressLatency(gateway.url, concurrency);
      await cancelLatency(gateway.url, redis.url, concurrency, prefix);
    }
    console.log('\ntaskrelay bench (latency in ms, loopback, 2-core machine)\n');
    console.table(rows);
  } finally {
    await stopAll();
    await redis.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});

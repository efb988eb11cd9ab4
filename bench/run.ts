/**
 * `pnpm bench`: latency figures for progress and cancellation against real processes on loopback, side by side with
 * the raw Redis pub/sub floor. Bounded in count and time; stops everything it started.
 */
import { Redis } from 'ioredis';
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

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN;
}

/** Samples in ms; signed, because an abort may land before the client has read the cancel's answer. */
function record(scenario: string, concurrency: number, samples: number[]): void {
  const sorted = [...samples].sort((a, b) => a - b);
  const ms = (v: number) => v.toFixed(2);
  rows.push({
    scenario,
    concurrency,
    samples: samples.length,
    p50: ms(percentile(sorted, 50)),
    p99: ms(percentile(sorted, 99)),
    max: ms(sorted.at(-1) ?? Number.NaN),
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
  // One task at a time gives one sample per round: take several rounds.
  const rounds = concurrency === 1 ? 20 : 1;
  const all = { answered: [] as number[], fromSend: [] as number[], roundTrip: [] as number[] };
  for (let round = 0; round < rounds; round++) {
    const s = await cancelRound(url, redisUrl, concurrency, `${prefix}:r${round}`);
    all.answered.push(...s.answered);
    all.fromSend.push(...s.fromSend);
    all.roundTrip.push(...s.roundTrip);
  }
  record('tasks/cancel round trip (client)', concurrency, all.roundTrip);
  record('tasks/cancel sent → signal aborted', concurrency, all.fromSend);
  record('tasks/cancel answered → signal aborted', concurrency, all.answered);
}

async function cancelRound(url: string, redisUrl: string, concurrency: number, prefix: string) {
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
  const sent = new Map<string, number>();
  const answered = new Map<string, number>();
  await Promise.all(
    tasks.map(async (t) => {
      sent.set(t.key, now());
      await client.experimental.tasks.cancelTask(t.taskId);
      answered.set(t.key, now());
    }),
  );
  const values = await waitFor(
    async () => {
      const v = await r.mget(tasks.map((t) => t.key));
      return v.every((x) => x !== null) ? v : undefined;
    },
    { timeoutMs: 30_000 },
  );
  const samples: number[] = [];
  const fromSend: number[] = [];
  const roundTrip: number[] = [];
  values.forEach((v, i) => {
    const key = tasks[i]?.key ?? '';
    samples.push(Number(v) - (answered.get(key) ?? 0));
    fromSend.push(Number(v) - (sent.get(key) ?? 0));
    roundTrip.push((answered.get(key) ?? 0) - (sent.get(key) ?? 0));
  });
  r.disconnect();
  await client.close();
  return { answered: samples, fromSend, roundTrip };
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
    console.log('\ntaskrelay bench (latency in ms, loopback, 2-core machine)');
    console.log('Negative "answered → aborted" values: the worker aborted before the client had read the answer.\n');
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

/**
 * `pnpm bench --batch`: a batch of 10,000 `bench_noop` children (PROTOCOL.md §26) on 1, 2 and 4 workers, against the
 * raw BullMQ floor (a FlowProducer parent with the same number of no-op children, consumed by as many in-process
 * BullMQ workers of the same concurrency) in the same run. Reports children per second, the parent's progress
 * latency (gap between progress notifications the caller receives, and from the last child to the result), and the
 * gateway's RSS and Redis's used memory at their peak during the batch. One Redis serves every row in turn, so its
 * peak includes what earlier rows left behind (finished jobs are removed, batch hashes kept for their ttl).
 */
import { FlowProducer, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';
import { connectClient } from '../../test/helpers/processes.js';
import { startTask, taskResult } from '../../test/helpers/tasks.js';
import { rssBytes, startStack } from './procs.js';

const CHILDREN = 10_000;
const WORKER_CONCURRENCY = 32;

interface Row {
  what: string;
  workers: number;
  seconds: number;
  childrenPerSecond: number;
  progressUpdates?: number;
  maxProgressGapMs?: number;
  gatewayRssMb?: number;
  redisPeakMb: number;
}

async function usedMemory(redis: Redis): Promise<number> {
  const info = await redis.info('memory');
  return Number(/used_memory:(\d+)/.exec(info)?.[1] ?? 0);
}

async function taskrelayBatch(server: TestRedis, workers: number): Promise<Row> {
  const stack = await startStack({
    name: `batch-${workers}`,
    prefix: uniquePrefix('bench-batch'),
    redisUrl: server.url,
    gateways: 1,
    workers,
    workerConcurrency: WORKER_CONCURRENCY,
    env: { LOG_LEVEL: 'warn' },
  });
  const redis = new Redis(server.url);
  const gateway = stack.gateways[0];
  if (!gateway) throw new Error('no gateway');
  const client = await connectClient(gateway.url);
  const times: number[] = [];
  client.setNotificationHandler(ProgressNotificationSchema, () => {
    times.push(performance.now());
  });
  let rss = 0;
  let peak = 0;
  const sampler = setInterval(() => {
    rss = Math.max(rss, rssBytes(gateway.pid));
    void usedMemory(redis).then((m) => (peak = Math.max(peak, m)));
  }, 200);
  const started = performance.now();
  const taskId = await startTask(client, 'bench_fanout', { count: CHILDREN }, { progressToken: 'batch', ttl: 600_000 });
  const result = await taskResult(client, taskId, 600_000);
  const seconds = (performance.now() - started) / 1000;
  clearInterval(sampler);
  const completed = (result.structuredContent as { completed?: number } | undefined)?.completed;
  if (completed !== CHILDREN) throw new Error(`batch completed ${String(completed)} of ${CHILDREN}`);
  const gaps = times.slice(1).map((t, i) => t - (times[i] ?? t));
  await client.close();
  redis.disconnect();
  await Promise.all([...stack.workers, ...stack.gateways].map((p) => p.kill('SIGKILL')));
  return {
    what: 'taskrelay batch',
    workers,
    seconds,
    childrenPerSecond: CHILDREN / seconds,
    progressUpdates: times.length,
    maxProgressGapMs: Math.max(0, ...gaps),
    gatewayRssMb: rss / 1e6,
    redisPeakMb: peak / 1e6,
  };
}

async function flowFloor(server: TestRedis, workers: number): Promise<Row> {
  const prefix = uniquePrefix('bench-flow');
  const connection = new Redis(server.url, { maxRetriesPerRequest: null });
  const redis = new Redis(server.url);
  let parentDone!: () => void;
  const finished = new Promise<void>((resolve) => (parentDone = resolve));
  const duplicates: Redis[] = [];
  const consumers = Array.from(
    { length: workers },
    () =>
      new Worker(
        'floor-batch',
        async (job) => {
          if (job.name === 'parent') parentDone();
          return 'ok';
        },
        {
          connection: duplicates[duplicates.push(connection.duplicate()) - 1] as Redis,
          prefix,
          concurrency: WORKER_CONCURRENCY,
        },
      ),
  );
  let peak = 0;
  const sampler = setInterval(() => void usedMemory(redis).then((m) => (peak = Math.max(peak, m))), 200);
  const flow = new FlowProducer({ connection, prefix });
  const started = performance.now();
  await flow.add({
    name: 'parent',
    queueName: 'floor-batch',
    children: Array.from({ length: CHILDREN }, () => ({ name: 'child', queueName: 'floor-batch', data: {} })),
  });
  await finished;
  const seconds = (performance.now() - started) / 1000;
  clearInterval(sampler);
  await Promise.all(consumers.map((w) => w.close()));
  await flow.close();
  for (const duplicate of duplicates) duplicate.disconnect();
  connection.disconnect();
  redis.disconnect();
  return {
    what: 'BullMQ FlowProducer floor',
    workers,
    seconds,
    childrenPerSecond: CHILDREN / seconds,
    redisPeakMb: peak / 1e6,
  };
}

export async function runBatch(options: { redis: TestRedis; log: (m: string) => void }): Promise<number> {
  const rows: Row[] = [];
  for (const workers of [1, 2, 4]) {
    options.log(`batch of ${CHILDREN} on ${workers} worker(s)`);
    rows.push(await taskrelayBatch(options.redis, workers));
    rows.push(await flowFloor(options.redis, workers));
  }
  const fmt = (n: number | undefined, d = 1) => (n === undefined ? '—' : n.toFixed(d));
  console.log(
    '| what | workers | s | children/s | vs floor | progress updates | max gap ms | gateway RSS MB | Redis peak MB |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|');
  for (const row of rows) {
    const floor = rows.find((r) => r.what !== 'taskrelay batch' && r.workers === row.workers);
    const ratio = row.what === 'taskrelay batch' && floor ? row.childrenPerSecond / floor.childrenPerSecond : undefined;
    console.log(
      `| ${row.what} | ${row.workers} | ${fmt(row.seconds, 2)} | ${fmt(row.childrenPerSecond, 0)} | ${fmt(ratio, 2)} | ${row.progressUpdates ?? '—'} | ${fmt(row.maxProgressGapMs, 0)} | ${fmt(row.gatewayRssMb)} | ${fmt(row.redisPeakMb)} |`,
    );
  }
  return 0;
}

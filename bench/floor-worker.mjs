// The raw BullMQ floor: a plain BullMQ Worker with a no-op processor, in its own process so its CPU can be read.
// REDIS_URL, BENCH_QUEUE, BENCH_CONCURRENCY from the environment; prints "floor worker ready" once it consumes.
import { Worker } from 'bullmq';
import { Redis } from 'ioredis';

const connection = new Redis(process.env.REDIS_URL, { maxRetriesPerRequest: null });
const worker = new Worker(process.env.BENCH_QUEUE ?? 'bench-floor', async () => 'ok', {
  connection,
  prefix: 'benchfloor',
  concurrency: Number(process.env.BENCH_CONCURRENCY ?? 32),
});
worker.on('error', (error) => console.error(`floor worker: ${error.message}`));
await worker.waitUntilReady();
console.log('floor worker ready');
const stop = () => void worker.close().finally(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

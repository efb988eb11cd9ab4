// Tools the benchmark serves: each progress message carries the worker's send time (ms, sub-ms precision).
import { Redis } from 'ioredis';
import { z } from 'zod';
import { defineTool } from '@taskrelay/worker';

const now = () => performance.timeOrigin + performance.now();

export const benchProgress = defineTool({
  name: 'bench_progress',
  description: 'Reports `count` progress updates `intervalMs` apart, each stamped with its send time.',
  inputSchema: z.object({ count: z.number().int().min(1), intervalMs: z.number().int().min(0) }),
  async run({ count, intervalMs }, ctx) {
    for (let i = 1; i <= count; i++) {
      await ctx.sleep(intervalMs);
      ctx.progress(i, count, String(now()));
    }
    return 'done';
  },
});

export const benchCancel = defineTool({
  name: 'bench_cancel',
  description: 'Waits for its signal to abort and records when it did in Redis.',
  inputSchema: z.object({ key: z.string() }),
  async run({ key }, ctx) {
    ctx.progress(1);
    await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
    const abortedAt = now();
    const redis = new Redis(process.env.REDIS_URL);
    await redis.set(key, String(abortedAt), 'EX', 600);
    redis.disconnect();
    ctx.throwIfCancelled();
    return 'unreachable';
  },
});

// Tools the benchmark serves (TASKRELAY_TOOLS=bench/bench-tools.mjs). Timestamps are ms since the epoch with sub-ms
// precision (performance.timeOrigin + performance.now()), comparable across processes on one machine.
import { Redis } from 'ioredis';
import { z } from 'zod';
import { defineTool, NonRetryableError } from '@taskrelay/worker';

const now = () => performance.timeOrigin + performance.now();
const prefix = process.env.TASKRELAY_PREFIX ?? 'taskrelay';

/** One lazily opened connection per worker process for the tools' own Redis writes. */
let redis;
const benchRedis = () => (redis ??= new Redis(process.env.REDIS_URL));

export const benchNoop = defineTool({
  name: 'bench_noop',
  description: 'Does nothing and returns at once: the per-call cost of everything around a tool.',
  inputSchema: z.object({}),
  taskSupport: 'optional',
  async run() {
    return 'ok';
  },
});

/**
 * `bench_noop` under fleet-wide controls (PROTOCOL.md §3.3) that never bind: a concurrency and a rate limit far above
 * what the bench reaches, so the row measures what the controls cost, not what they hold back.
 */
export const benchLimited = defineTool({
  name: 'bench_limited',
  description: 'Does nothing, under a generous concurrency limit and rate limit.',
  inputSchema: z.object({}),
  taskSupport: 'optional',
  concurrency: 100_000,
  rateLimit: { max: 1_000_000, perMs: 1_000 },
  async run() {
    return 'ok';
  },
});

/**
 * `bench_noop` under the worker-admitted limits (PROTOCOL.md §3.5) that never bind: a concurrency per key and a rate
 * limit shared by name, far above what the bench reaches, so the row measures the admission's Redis round trips.
 */
export const benchKeyed = defineTool({
  name: 'bench_keyed',
  description: 'Does nothing, under a generous per-key concurrency and a generous shared rate limit.',
  inputSchema: z.object({}),
  taskSupport: 'optional',
  concurrency: { limit: 100_000, key: () => 'all' },
  rateLimit: { max: 1_000_000, perMs: 1_000, name: 'bench' },
  async run() {
    return 'ok';
  },
});

/**
 * The slot hand-off (PROTOCOL.md §3.3 and §3.5 step 4): a tool that runs one at a time per `lane`, fleet-wide, and
 * records each run's handler start and end (`<start> <end>`) on `<prefix>:bench:slot:<lane>`. The gap from one run's
 * end to the next run's start is what a freed slot costs the run that waits for it.
 */
const slotTool = (name, concurrency) =>
  defineTool({
    name,
    description: 'Holds ms, one run at a time per lane, and logs its start and end times.',
    inputSchema: z.object({ lane: z.string(), ms: z.number().int().min(0).max(10_000) }),
    concurrency,
    async run({ lane, ms }, ctx) {
      const start = now();
      await ctx.sleep(ms);
      await benchRedis().rpush(`${prefix}:bench:slot:${lane}`, `${start} ${now()}`);
      return 'ok';
    },
  });
/** Worker-admitted: a concurrency of 1 per lane (§3.5). */
export const benchSlotKeyed = slotTool('bench_slot_keyed', { limit: 1, key: ['lane'] });
/** BullMQ's own: the tool queue's global concurrency of 1 (§3.3). */
export const benchSlotQueue = slotTool('bench_slot_queue', 1);

/**
 * A task that tags itself and fails at once, not retried: what an operator keeps to find and replay (PROTOCOL.md §30).
 * `pnpm bench` measures the Redis bytes one such task holds while it is retained.
 */
export const benchFail = defineTool({
  name: 'bench_fail',
  description: 'Tags its task, then fails (not retried) with a short message.',
  inputSchema: z.object({ report: z.string(), items: z.number().int() }),
  taskSupport: 'optional',
  async run({ report }, ctx) {
    await ctx.tag(`report:${report}`);
    throw new NonRetryableError(`upstream refused report ${report}`);
  },
});

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
    await benchRedis().set(key, String(abortedAt), 'EX', 600);
    ctx.throwIfCancelled();
    return 'unreachable';
  },
});

export const benchHold = defineTool({
  name: 'bench_hold',
  description: 'Sleeps `ms` (honouring cancellation): keeps a task open.',
  inputSchema: z.object({ ms: z.number().int().min(0).max(3_600_000) }),
  async run({ ms }, ctx) {
    await ctx.sleep(ms);
    return 'held';
  },
});

/**
 * Keyed limits (PROTOCOL.md §3.5, issue 48 F2; `pnpm bench --limits`): sleep `ms` under one run at a time, or two starts
 * a second, per `tenant`: per principal (the default), or shared across principals.
 */
const tenantInput = z.object({ tenant: z.string(), ms: z.number().int().min(0).max(600_000) });
const holdFor = async ({ ms }, ctx) => {
  // When the tool itself starts (a run refused by its limit has recorded its start already, but never gets here).
  await benchRedis().set(`${prefix}:bench:tool-start:${ctx.taskId}`, String(Date.now()), 'PX', 600_000, 'NX');
  await ctx.sleep(ms);
  return 'held';
};
export const benchTenantSlot = defineTool({
  name: 'bench_tenant_slot',
  description: 'Sleeps ms; one run at once per tenant of each caller.',
  inputSchema: tenantInput,
  concurrency: { limit: 1, key: ['tenant'] },
  run: holdFor,
});
export const benchTenantSlotShared = defineTool({
  name: 'bench_tenant_slot_shared',
  description: 'Sleeps ms; one run at once per tenant, whoever calls.',
  inputSchema: tenantInput,
  concurrency: { limit: 1, key: ['tenant'], acrossPrincipals: true },
  run: holdFor,
});
export const benchTenantRate = defineTool({
  name: 'bench_tenant_rate',
  description: 'Sleeps ms; two starts a second per tenant of each caller.',
  inputSchema: tenantInput,
  rateLimit: { max: 2, perMs: 1000, key: ['tenant'] },
  run: holdFor,
});
export const benchTenantRateShared = defineTool({
  name: 'bench_tenant_rate_shared',
  description: 'Sleeps ms; two starts a second per tenant, whoever calls.',
  inputSchema: tenantInput,
  rateLimit: { max: 2, perMs: 1000, key: ['tenant'], acrossPrincipals: true },
  run: holdFor,
});

/**
 * Soak and load fixture: sleeps `ms` in `steps` steps (progress after each), then counts its side effect with INCR on
 * `<prefix>:bench:effect:<taskId>`. The benchmark reads and deletes the counter: a value above 1, or a counter that
 * reappears after it was read, is a side effect that happened twice.
 */
export const benchEffect = defineTool({
  name: 'bench_effect',
  description: 'Sleeps ms in steps with progress, then INCRs a per-task counter (its one side effect).',
  inputSchema: z.object({ ms: z.number().int().min(0).max(600_000), steps: z.number().int().min(1).max(1000) }),
  taskSupport: 'optional',
  async run({ ms, steps }, ctx) {
    for (let i = 1; i <= steps; i++) {
      await ctx.sleep(ms / steps);
      ctx.progress(i, steps);
    }
    await benchRedis().incr(`${prefix}:bench:effect:${ctx.taskId}`);
    return { steps };
  },
});

/** Fans out `count` `bench_noop` children (PROTOCOL §26): the batch's own cost, for `pnpm bench --batch`. */
export const benchFanout = defineTool({
  name: 'bench_fanout',
  description: 'Fans out count bench_noop children and returns how many completed.',
  inputSchema: z.object({ count: z.number().int().min(1).max(100_000), concurrency: z.number().int().default(256) }),
  taskSupport: 'required',
  async run({ count, concurrency }, ctx) {
    const batch = await ctx.fanOut(
      Array.from({ length: count }, () => ({})),
      { tool: 'bench_noop', concurrency },
    );
    return {
      content: [{ type: 'text', text: `${batch.completed}` }],
      structuredContent: { completed: batch.completed },
    };
  },
});

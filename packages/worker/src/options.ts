/** The options of `startWorker`: the public type (every field documented with its default), the schema, the resolved type. */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { z } from 'zod';
import {
  ConfigError,
  clusterPrefixProblem,
  createLogger,
  type KeyLayoutSetting,
  isRedisTarget,
  workerSettingsShape,
  DEFAULT_OUTPUT_LIMITS,
  type Logger,
  type OutputLimits,
  type BlobStoreConfig,
} from '@taskrelay/shared';
import { isToolDefinition, type ToolDefinition } from './define-tool.js';
import { WorkerMetrics } from './metrics.js';

/** Options of `startWorker`. Only `tools` and a Redis URL are required. */
export interface WorkerOptions {
  /**
   * Redis URL: `redis://host:port/db`, `rediss://` for TLS, `redis+cluster://host:port,host:port` for a Redis Cluster
   * (then `prefix` must be wrapped in `{}`), or `redis+sentinel://host:port,host:port/<master name>`. Required unless
   * `connection` is given.
   */
  redisUrl?: string;
  /** The Redis URL under BullMQ's name for it; used when `redisUrl` is not given. */
  connection?: string;
  /** Prefix of every Redis key, channel and BullMQ queue; must match the gateway's. Default `'taskrelay'`. */
  prefix?: string;
  /**
   * The key layout (PROTOCOL.md §1.1), the same as the gateways': `'auto'` is `'sharded'` on a Redis Cluster with an
   * unbraced `prefix`, else `'single'`; `'sharded'` forces it on one server too. Default `'auto'`.
   */
  keyLayout?: 'auto' | 'single' | 'sharded';
  /** The tools this worker serves (from `defineTool`). At least one; names must be unique. */
  tools: readonly ToolDefinition[];
  /**
   * The name of this worker's pool. The BullMQ queue it consumes is this name plus a digest of its tool names, so
   * workers with different tool sets never share a queue, whatever this says; the gateway routes each call to the pool
   * of a live worker that serves the tool. Default `'default'`.
   */
  queue?: string;
  /** Jobs run at once by this worker. Default `8`. */
  concurrency?: number;
  /**
   * How soon the job of a crashed worker is taken over by another: BullMQ's lock is two thirds of it (renewed every
   * third) and the stalled check runs every sixth, so a dead worker's job is back in the queue within five sixths
   * (PROTOCOL.md §10.5). Default `30000` (30 s).
   */
  lockDurationMs?: number;
  /**
   * How long `close()` lets running tools finish before aborting them with `WORKER_SHUTDOWN` and handing their jobs
   * back (`WORKER_SHUTDOWN_GRACE_MS`). Default `30000` (30 s).
   */
  shutdownGraceMs?: number;
  /** How often the tool catalog is refreshed; it expires after three missed heartbeats. Default `5000` (5 s). */
  heartbeatMs?: number;
  /** Per-task progress throttle: at most one progress write per this many ms, newest value wins. Default `50`. */
  progressIntervalMs?: number;
  /** A warning is logged when a tool is still running this long after its signal aborted. Default `5000` (5 s). */
  abortGraceMs?: number;
  /**
   * How often the status of every running task is re-read, so a missed cancel message still aborts its tool.
   * Default `2000` (2 s).
   */
  cancelSweepMs?: number;
  /** This worker's id in the catalog. Default `<hostname>-<pid>-<random hex>`. */
  workerId?: string;
  /**
   * Seals waitpoint tokens (`ctx.waitpoint`, PROTOCOL.md §32.2); at least 32 characters, the same on every gateway and
   * worker (`TASKRELAY_WAITPOINT_SECRET`). Default: a random key the first gateway or worker stores in Redis.
   */
  waitpointSecret?: string;
  /** pino logger. Default: `createLogger('worker')` (JSON lines on stdout, level from `LOG_LEVEL`). */
  logger?: Logger;
  /** Where this worker counts its runs, waits, cancels and slots. Default: a new `WorkerMetrics` of its own. */
  metrics?: WorkerMetrics;
  /**
   * Bounds of task output, results by reference and artifacts (PROTOCOL.md §34): `inlineResultBytes` (default 1 MiB),
   * `maxOutputBytes` (1 MiB), `blobTtlMs` (24 h), `maxTaskBytes` (64 MiB), `maxPrincipalBytes` (1 GiB); the
   * `TASKRELAY_*` variables of docs/CONFIGURATION.md set them for the stock worker.
   */
  output?: Partial<OutputLimits>;
  /**
   * Where values stored apart from results keep their bytes (PROTOCOL.md §34.7): `{ kind: 'redis' }` (the default) or
   * `{ kind: 's3', bucket, endpoint?, region?, keyPrefix? }`. The gateways must be configured alike to read them.
   */
  blobStore?: BlobStoreConfig;
}

export interface CloseOptions {
  /**
   * How long running tools may take to finish before they are aborted with `WORKER_SHUTDOWN` (their jobs go back to
   * the queue for another worker, without using up an attempt). Default: the worker's `shutdownGraceMs`.
   */
  graceMs?: number;
}

/** `WorkerOptions` with every default applied. */
export interface ResolvedWorkerOptions {
  redisUrl: string;
  prefix: string;
  /** `keyLayoutOf(redisUrl, prefix, keyLayout)` is the layout it means. */
  keyLayout: KeyLayoutSetting;
  tools: ToolDefinition[];
  queue: string;
  concurrency: number;
  lockDurationMs: number;
  shutdownGraceMs: number;
  heartbeatMs: number;
  progressIntervalMs: number;
  abortGraceMs: number;
  cancelSweepMs: number;
  workerId: string;
  waitpointSecret: string | undefined;
  logger: Logger;
  metrics: WorkerMetrics;
  output: OutputLimits;
  blobStore: BlobStoreConfig;
}

const bytes = (max: number) => z.number().int().min(1_024).max(max);
const OutputLimitsSchema = z.strictObject({
  inlineResultBytes: bytes(1024 ** 3).default(DEFAULT_OUTPUT_LIMITS.inlineResultBytes),
  maxOutputBytes: bytes(512 * 1024 ** 2).default(DEFAULT_OUTPUT_LIMITS.maxOutputBytes),
  blobTtlMs: z
    .number()
    .int()
    .min(1_000)
    .max(365 * 86_400_000)
    .default(DEFAULT_OUTPUT_LIMITS.blobTtlMs),
  maxTaskBytes: bytes(1024 ** 4).default(DEFAULT_OUTPUT_LIMITS.maxTaskBytes),
  maxPrincipalBytes: bytes(1024 ** 4).default(DEFAULT_OUTPUT_LIMITS.maxPrincipalBytes),
});

const redisUrlSchema = z
  .string()
  .trim()
  .refine((v) => isRedisTarget(v), {
    message: 'must be a redis://, rediss://, redis+cluster:// or redis+sentinel:// target',
  });

const WorkerOptionsSchema = z
  .strictObject({
    redisUrl: redisUrlSchema.optional(),
    connection: redisUrlSchema.optional(),
    // The settings the environment also sets, with the same bounds and defaults (shared's workerSettingsShape).
    ...workerSettingsShape,
    tools: z
      .array(z.custom<ToolDefinition>(isToolDefinition, { message: 'must hold tool definitions made by defineTool' }))
      .min(1, { message: 'must list at least one tool' }),
    workerId: z.string().trim().regex(/^\S+$/, { message: 'must be non-empty without spaces' }).optional(),
    waitpointSecret: z.string().min(32, { message: 'must be at least 32 characters' }).optional(),
    logger: z
      .custom<Logger>((v) => typeof v === 'object' && v !== null && typeof (v as Logger).child === 'function', {
        message: 'must be a pino logger',
      })
      .optional(),
    metrics: z.instanceof(WorkerMetrics, { message: 'must be a WorkerMetrics' }).optional(),
    output: OutputLimitsSchema.default(DEFAULT_OUTPUT_LIMITS),
    blobStore: z
      .discriminatedUnion('kind', [
        z.strictObject({ kind: z.literal('redis') }),
        z.strictObject({
          kind: z.literal('s3'),
          bucket: z.string().min(1),
          endpoint: z.url().optional(),
          region: z.string().min(1).optional(),
          keyPrefix: z.string().optional(),
        }),
      ])
      .default({ kind: 'redis' }),
  })
  .refine((o) => o.redisUrl !== undefined || o.connection !== undefined, {
    message: 'is required (redisUrl or connection)',
    path: ['redisUrl'],
  })
  .superRefine((o, ctx) => {
    const problem = clusterPrefixProblem(o.redisUrl ?? o.connection, o.prefix, o.keyLayout);
    if (problem) ctx.addIssue({ code: 'custom', message: problem, path: ['prefix'] });
  });

/** Applies the defaults of `WorkerOptions`; throws a one-line `ConfigError` for anything invalid. */
export function resolveWorkerOptions(options: WorkerOptions): ResolvedWorkerOptions {
  const parsed = WorkerOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue?.path.map(String).join('.') || 'options';
    throw new ConfigError(`Invalid worker options: ${field} ${issue?.message ?? 'is invalid'}`);
  }
  const o = parsed.data;
  const names = new Set<string>();
  for (const tool of o.tools) {
    if (names.has(tool.name)) throw new ConfigError(`Invalid worker options: two tools are named "${tool.name}"`);
    names.add(tool.name);
  }
  return {
    redisUrl: o.redisUrl ?? o.connection ?? '',
    prefix: o.prefix,
    keyLayout: o.keyLayout,
    tools: o.tools,
    queue: o.queue,
    concurrency: o.concurrency,
    lockDurationMs: o.lockDurationMs,
    shutdownGraceMs: o.shutdownGraceMs,
    heartbeatMs: o.heartbeatMs,
    progressIntervalMs: o.progressIntervalMs,
    abortGraceMs: o.abortGraceMs,
    cancelSweepMs: o.cancelSweepMs,
    workerId: o.workerId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
    waitpointSecret: o.waitpointSecret,
    logger: o.logger ?? createLogger('worker'),
    metrics: o.metrics ?? new WorkerMetrics(),
    output: o.output,
    blobStore: o.blobStore,
  };
}

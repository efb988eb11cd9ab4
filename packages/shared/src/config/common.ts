/**
 * What every process reads alike: the Redis connection and key layout, the log level, waitpoint and blob-store
 * settings (`commonShape`), the worker's settings shared with `startWorker` (`workerSettingsShape`), and how a schema
 * is applied to the environment (`parseEnv`: one `ConfigError` line naming the variable).
 */
import { z } from 'zod';
import { ConfigError } from '../protocol/errors.js';
import {
  KEY_LAYOUT_SETTINGS,
  clusterPrefixProblem,
  clusterTarget,
  sentinelTarget,
  type KeyLayoutSetting,
} from '../redis.js';
import type { BlobStoreConfig } from '../blob-objects.js';
import type { gatewayEnvSchema } from './gateway-env.js';
import type { workerEnvSchema } from './worker.js';
import { LOG_LEVELS, int, nodeList, prefix, queueName, redisUrl, wholeNumber, type Env } from './values.js';

/**
 * The worker's settings, each defined once with its bounds and default: `workerEnvSchema` reads its variables through
 * them, and `startWorker` checks its options with them (packages/worker/src/options.ts), so the two cannot disagree.
 */
export const workerSettingsShape = {
  prefix: prefix.default('taskrelay'),
  keyLayout: z
    .enum(KEY_LAYOUT_SETTINGS, { message: `must be one of ${KEY_LAYOUT_SETTINGS.join(', ')}` })
    .default('auto'),
  queue: queueName.default('default'),
  concurrency: wholeNumber(1, 10_000).default(8),
  lockDurationMs: wholeNumber(1_000, 3_600_000).default(30_000),
  heartbeatMs: wholeNumber(100, 600_000).default(5_000),
  abortGraceMs: wholeNumber(0, 3_600_000).default(5_000),
  cancelSweepMs: wholeNumber(50, 600_000).default(2_000),
  shutdownGraceMs: wholeNumber(0, 86_400_000).default(30_000),
  progressIntervalMs: wholeNumber(0, 60_000).default(50),
};

export const commonShape = {
  REDIS_URL: redisUrl.optional(),
  REDIS_CLUSTER_NODES: nodeList.optional(),
  REDIS_SENTINELS: nodeList.optional(),
  REDIS_SENTINEL_NAME: z
    .string()
    .trim()
    .regex(/^[A-Za-z0-9_.-]+$/, { message: 'must be letters, digits, _ . or -' })
    .optional(),
  TASKRELAY_PREFIX: prefix.default('taskrelay'),
  TASKRELAY_KEY_LAYOUT: workerSettingsShape.keyLayout.describe(
    'How keys are laid out ([PROTOCOL.md §1.1](PROTOCOL.md#11-redis-cluster-sentinel-tls-two-key-layouts)): `auto` is `sharded` on a Redis Cluster with an unbraced `TASKRELAY_PREFIX` (tools on shards of their own) and `single` otherwise (one hash slot, as before); `sharded` forces the sharded layout on one server too (a test and migration aid); the same on every gateway and worker.',
  ),
  LOG_LEVEL: z.enum(LOG_LEVELS, { message: `must be one of ${LOG_LEVELS.join(', ')}` }).default('info'),
  TASKRELAY_PROGRESS_INTERVAL_MS: int(0, 60_000).default(50),
  TASKRELAY_WAITPOINT_SECRET: z
    .string()
    .min(32, { message: 'must be at least 32 characters' })
    .optional()
    .describe(
      'Key that seals waitpoint tokens (`ctx.waitpoint`, [PROTOCOL.md §32](PROTOCOL.md#32-waitpoints-a-callback-url-a-tool-waits-on)); at least 32 characters, the same on every gateway and worker. Default: a random key the first gateway or worker stores in Redis (`<prefix>:waitpoint-key`) for all to share.',
    ),
  TASKRELAY_BLOB_STORE: z
    .enum(['redis', 's3'], { message: 'must be redis or s3' })
    .default('redis')
    .describe(
      'where results stored by reference and artifacts keep their bytes: `redis` (with their own TTL) or `s3` (an S3-compatible bucket; Redis keeps the index and the bounds) ([PROTOCOL.md §34.7](PROTOCOL.md#34-task-output-as-resources))',
    ),
  TASKRELAY_S3_BUCKET: z
    .string()
    .trim()
    .min(1)
    .optional()
    .describe('the bucket, with `TASKRELAY_BLOB_STORE=s3` (required then)'),
  TASKRELAY_S3_ENDPOINT: z
    .string()
    .trim()
    .refine((v) => /^https?:\/\//.test(v) && URL.canParse(v), { message: 'must be an http:// or https:// URL' })
    .optional()
    .describe("an S3-compatible server (MinIO, Ceph, moto); unset: AWS. Credentials: the AWS SDK's default chain"),
  TASKRELAY_S3_REGION: z.string().trim().min(1).default('us-east-1').describe("the bucket's region"),
  TASKRELAY_S3_KEY_PREFIX: z
    .string()
    .default('taskrelay/')
    .describe(
      'the start of every object key; give the bucket a lifecycle rule expiring it after `TASKRELAY_BLOB_TTL_MS`',
    ),
};

export interface CommonConfig {
  /**
   * Where Redis is, as `createRedis` takes it: `REDIS_URL`, or the `redis+cluster://` / `redis+sentinel://` target
   * built from `REDIS_CLUSTER_NODES` / `REDIS_SENTINELS` (which win over `REDIS_URL`); undefined when none is set (the
   * entry points require one).
   */
  redisUrl: string | undefined;
  /**
   * Prefix of every Redis key and channel. Default `taskrelay`.
   * @default "taskrelay"
   */
  prefix: string;
  /**
   * `TASKRELAY_KEY_LAYOUT` (PROTOCOL.md §1.1); `keyLayoutOf` says which layout it means. Default `auto`.
   * @default "auto"
   */
  keyLayout: KeyLayoutSetting;
  /**
   * pino level. Default `info`.
   * @default "info"
   */
  logLevel: (typeof LOG_LEVELS)[number];
  /**
   * Per-task progress throttle interval. Default 50 ms (about 20 updates per second).
   * @default 50
   */
  progressIntervalMs: number;
  /** `TASKRELAY_WAITPOINT_SECRET`: seals waitpoint tokens (PROTOCOL.md §32.2); undefined: a key kept in Redis. */
  waitpointSecret?: string | undefined;
  /** Where values stored apart from results keep their bytes (PROTOCOL.md §34.7). Default Redis. */
  blobStore: BlobStoreConfig;
}

export function parseEnv<S extends z.ZodType>(schema: S, env: Env): z.infer<S> {
  // Treat empty strings as unset, as shells and compose files often export `VAR=`.
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const result = schema.safeParse(cleaned);
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  const name = String(issue?.path[0] ?? 'environment');
  const got = cleaned[name];
  // Secrets are never echoed.
  const secret =
    name === 'TASKRELAY_AUTH_TOKENS' ||
    name === 'TASKRELAY_WEBHOOK_SECRET' ||
    name === 'TASKRELAY_REQUEST_STATE_SECRET';
  const shown = secret || got === undefined ? '' : ` (got ${JSON.stringify(got)})`;
  throw new ConfigError(`Invalid configuration: ${name} ${issue?.message ?? 'is invalid'}${shown}`);
}

export function common(parsed: z.infer<typeof gatewayEnvSchema> | z.infer<typeof workerEnvSchema>): CommonConfig {
  let redisTarget = parsed.REDIS_URL;
  if (parsed.REDIS_CLUSTER_NODES) {
    if (parsed.REDIS_SENTINELS) {
      throw new ConfigError('Invalid configuration: set REDIS_CLUSTER_NODES or REDIS_SENTINELS, not both');
    }
    redisTarget = clusterTarget(parsed.REDIS_CLUSTER_NODES);
  } else if (parsed.REDIS_SENTINELS) {
    if (!parsed.REDIS_SENTINEL_NAME) {
      throw new ConfigError(
        'Invalid configuration: REDIS_SENTINEL_NAME (the master name) is required with REDIS_SENTINELS',
      );
    }
    redisTarget = sentinelTarget(parsed.REDIS_SENTINELS, parsed.REDIS_SENTINEL_NAME);
  }
  const problem = clusterPrefixProblem(redisTarget, parsed.TASKRELAY_PREFIX, parsed.TASKRELAY_KEY_LAYOUT);
  if (problem) throw new ConfigError(`Invalid configuration: TASKRELAY_PREFIX ${problem}`);
  return {
    redisUrl: redisTarget,
    prefix: parsed.TASKRELAY_PREFIX,
    keyLayout: parsed.TASKRELAY_KEY_LAYOUT,
    logLevel: parsed.LOG_LEVEL,
    progressIntervalMs: parsed.TASKRELAY_PROGRESS_INTERVAL_MS,
    waitpointSecret: parsed.TASKRELAY_WAITPOINT_SECRET,
    blobStore: blobStoreOf(parsed),
  };
}

function blobStoreOf(parsed: z.infer<typeof gatewayEnvSchema> | z.infer<typeof workerEnvSchema>): BlobStoreConfig {
  if (parsed.TASKRELAY_BLOB_STORE === 'redis') return { kind: 'redis' };
  if (parsed.TASKRELAY_S3_BUCKET === undefined) {
    throw new ConfigError('Invalid configuration: TASKRELAY_S3_BUCKET is required with TASKRELAY_BLOB_STORE=s3');
  }
  return {
    kind: 's3',
    bucket: parsed.TASKRELAY_S3_BUCKET,
    endpoint: parsed.TASKRELAY_S3_ENDPOINT,
    region: parsed.TASKRELAY_S3_REGION,
    keyPrefix: parsed.TASKRELAY_S3_KEY_PREFIX,
  };
}

/** The entry points need Redis: a one-line error when it is missing. */
export function requireRedisUrl(config: CommonConfig): string {
  if (!config.redisUrl) {
    throw new ConfigError('Invalid configuration: REDIS_URL is required (for example redis://127.0.0.1:6379)');
  }
  const problem = clusterPrefixProblem(config.redisUrl, config.prefix, config.keyLayout);
  if (problem) throw new ConfigError(`Invalid configuration: TASKRELAY_PREFIX ${problem}`);
  return config.redisUrl;
}

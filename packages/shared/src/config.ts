/**
 * Configuration from the environment: one zod schema per process, defaults as in docs/CONFIGURATION.md, and a one-line
 * `ConfigError` naming the variable for anything invalid. Resolved once at the edge; the rest of the code takes the
 * resolved objects (units in names).
 */
import { z } from 'zod';
import { ConfigError } from './protocol/errors.js';
import {
  KEY_LAYOUT_SETTINGS,
  clusterPrefixProblem,
  clusterTarget,
  sentinelTarget,
  type KeyLayoutSetting,
  type RedisNode,
} from './redis.js';
import type { OutputLimits } from './task-output.js';
import type { BlobStoreConfig } from './blob-objects.js';

type Env = Record<string, string | undefined>;

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

const int = (min: number, max: number) =>
  z
    .string()
    .trim()
    .regex(/^-?\d+$/, { message: 'must be a whole number' })
    .transform(Number)
    .pipe(
      z
        .number()
        .int()
        .min(min, { message: `must be at least ${min}` })
        .max(max, { message: `must be at most ${max}` }),
    );

/** A whole number within bounds, as an option takes it. */
const wholeNumber = (min: number, max: number) =>
  z
    .number({ message: 'must be a whole number' })
    .int({ message: 'must be a whole number' })
    .min(min, { message: `must be at least ${min}` })
    .max(max, { message: `must be at most ${max}` });

/** An environment variable read as a whole number, then checked and defaulted by its option's own schema. */
const intEnv = <T extends z.ZodType<number | undefined, number | undefined>>(option: T) =>
  z
    .string()
    .trim()
    .regex(/^-?\d+$/, { message: 'must be a whole number' })
    .transform(Number)
    .optional()
    .pipe(option);

const redisUrl = z
  .string()
  .trim()
  .refine((v) => /^rediss?:\/\/[^\s]+$/.test(v) && URL.canParse(v), { message: 'must be a redis:// or rediss:// URL' });

/** `host:port,host:port`: Redis Cluster seed nodes or Sentinels. */
const nodeList = z.string().transform((value, ctx) => {
  const nodes: RedisNode[] = [];
  for (const item of value
    .split(',')
    .map((v) => v.trim())
    .filter(Boolean)) {
    const match = /^(\[[0-9a-fA-F:]+\]|[^\s:/[\]]+):(\d{1,5})$/.exec(item);
    const port = Number(match?.[2]);
    if (!match?.[1] || !(port >= 1 && port <= 65_535)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a comma list of host:port (bad entry ${JSON.stringify(item)})`,
      });
      return z.NEVER;
    }
    nodes.push({ host: match[1].replace(/^\[|\]$/g, ''), port });
  }
  if (nodes.length === 0) {
    ctx.addIssue({ code: 'custom', message: 'must list at least one host:port' });
    return z.NEVER;
  }
  return nodes;
});

const prefix = z
  .string()
  .trim()
  .min(1, { message: 'must not be empty' })
  .regex(/^[^\s]+$/, { message: 'must not contain spaces' });

const queueName = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9_.-]+$/, { message: 'must be letters, digits, _ . or -' });

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

const commonShape = {
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

const authTokens = z.string().transform((value, ctx) => {
  const tokens = new Map<string, string>();
  for (const pair of value
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)) {
    const at = pair.indexOf(':');
    const principal = at > 0 ? pair.slice(0, at).trim() : '';
    const token = at > 0 ? pair.slice(at + 1).trim() : '';
    if (!principal || !token) {
      ctx.addIssue({ code: 'custom', message: 'must be a comma list of principal:token pairs' });
      return z.NEVER;
    }
    tokens.set(token, principal);
  }
  return tokens;
});

const originList = z.string().transform((v) =>
  v
    .split(',')
    .map((o) => o.trim())
    .filter(Boolean),
);

const scopeList = z.string().transform((v) => v.split(/\s+/).filter(Boolean));

const httpUrl = z
  .string()
  .trim()
  .refine((v) => /^https?:\/\//.test(v) && URL.canParse(v), { message: 'must be an http:// or https:// URL' });

const flag = z
  .string()
  .trim()
  .toLowerCase()
  .refine((v) => ['1', 'true', 'yes', '0', 'false', 'no'].includes(v), { message: 'must be true or false' })
  .transform((v) => ['1', 'true', 'yes'].includes(v));

/** `TASKRELAY_WEBHOOK_SECRET`: any non-empty value, or `whsec_` and non-empty base64 (PROTOCOL.md §27.4). */
const webhookSecret = z
  .string()
  .refine(
    (v) =>
      !v.startsWith('whsec_') || /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(v.slice(6)),
    {
      message: 'must be base64 after the whsec_ prefix',
    },
  )
  .refine((v) => v !== 'whsec_', { message: 'must not be empty after the whsec_ prefix' });

/** `TASKRELAY_WEBHOOK_ALLOWED_HOSTS`: `host`, `host:port`, `[v6]` or `[v6]:port`, lowercased. */
const webhookHostList = z.string().transform((value, ctx) => {
  const hosts: string[] = [];
  for (const item of value
    .split(',')
    .map((v) => v.trim().toLowerCase())
    .filter(Boolean)) {
    const match = /^(\[[0-9a-f:.]+\]|[^\s:/[\]@]+)(?::(\d{1,5}))?$/.exec(item);
    if (!match || (match[2] !== undefined && !(Number(match[2]) >= 1 && Number(match[2]) <= 65_535))) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a comma list of host or host:port (bad entry ${JSON.stringify(item)})`,
      });
      return z.NEVER;
    }
    hosts.push(item);
  }
  return hosts;
});

/** The gateway's environment, variable by variable (docs/CONFIGURATION.md is generated from it: `pnpm docs:config`). */
export const gatewayEnvSchema = z.object({
  ...commonShape,
  HOST: z.string().trim().min(1).default('127.0.0.1'),
  PORT: int(0, 65_535).default(3000),
  TASKRELAY_AUTH_TOKENS: authTokens.optional(),
  TASKRELAY_OPERATORS: originList.optional(),
  TASKRELAY_ALLOWED_ORIGINS: originList.optional(),
  TASKRELAY_DEFAULT_TTL_MS: int(1_000, 30 * 86_400_000).default(3_600_000),
  TASKRELAY_MAX_TTL_MS: int(1_000, 30 * 86_400_000).default(86_400_000),
  TASKRELAY_POLL_INTERVAL_MS: int(10, 3_600_000)
    .default(1_000)
    .describe('the longest `pollInterval` suggested to clients; a younger task gets a quarter of its age, from 50 ms'),
  TASKRELAY_MAX_TOOL_TIMEOUT_MS: int(1, 30 * 86_400_000).default(86_400_000),
  TASKRELAY_EVENT_TTL_MS: int(1_000, 30 * 86_400_000).default(3_600_000),
  TASKRELAY_SESSION_IDLE_MS: int(1_000, 30 * 86_400_000).default(1_800_000),
  TASKRELAY_REAPER_INTERVAL_MS: int(50, 3_600_000).default(5_000),
  TASKRELAY_QUEUE_TIMEOUT_MS: int(1_000, 30 * 86_400_000).default(3_600_000),
  TASKRELAY_CATALOG_RETENTION_MS: int(0, 365 * 86_400_000).default(86_400_000),
  TASKRELAY_MAX_START_DELAY_MS: int(1_000, 365 * 86_400_000)
    .default(30 * 86_400_000)
    .describe(
      'how far ahead a call\'s `_meta["dev.taskrelay/start-at"]` may be; a later time is refused with a JSON-RPC error ([PROTOCOL.md §33.1](PROTOCOL.md#331-delayed-start))',
    ),
  TASKRELAY_SCHEDULES_FILE: z
    .string()
    .min(1)
    .optional()
    .describe(
      'path of a YAML (or JSON) file of schedules the gateway creates or updates as it starts; a bad file stops it with one line ([PROTOCOL.md §33.2](PROTOCOL.md#332-schedules))',
    ),
  TASKRELAY_RETAIN_COMPLETED_MS: int(1_000, 365 * 86_400_000)
    .optional()
    .describe(
      'how long a completed task stays readable after it ended (replacing its ttl); unset: its own ttl. The newest gateway to start sets it for the deployment ([PROTOCOL.md §30.1](PROTOCOL.md#301-retention-per-status))',
    ),
  TASKRELAY_RETAIN_FAILED_MS: int(1_000, 365 * 86_400_000)
    .optional()
    .describe('the same for a failed task, for example `604800000` (7 days) to find and replay failures'),
  TASKRELAY_RETAIN_CANCELLED_MS: int(1_000, 365 * 86_400_000)
    .optional()
    .describe('the same for a cancelled task'),
  GATEWAY_SHUTDOWN_GRACE_MS: int(0, 3_600_000).default(10_000),
  TASKRELAY_ALLOWED_HOSTS: originList.optional(),
  TASKRELAY_ALLOW_UNAUTHENTICATED: flag.default(false),
  TASKRELAY_MAX_BODY_BYTES: int(1_024, 1024 * 1024 * 1024).default(1_048_576),
  TASKRELAY_MAX_JSON_DEPTH: int(8, 10_000).default(64),
  TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL: int(0, 10_000_000).default(1_000),
  TASKRELAY_MAX_OPEN_TASKS: int(0, 10_000_000).default(1_000),
  TASKRELAY_RATE_LIMIT_CALLS: int(0, 100_000_000).default(60_000),
  TASKRELAY_RATE_LIMIT_TASK_OPS: int(0, 100_000_000).default(120_000),
  TASKRELAY_RATE_LIMIT_WINDOW_MS: int(1_000, 86_400_000).default(60_000),
  TASKRELAY_MAX_ARGUMENT_BYTES: int(2, 1024 * 1024 * 1024).default(262_144),
  TASKRELAY_MAX_PROGRESS_TOKEN_BYTES: int(1, 65_536).default(256),
  TASKRELAY_MAX_RESULT_BYTES: int(1_024, 1024 * 1024 * 1024).default(16 * 1024 * 1024),
  TASKRELAY_MAX_LARGE_READS_PER_PRINCIPAL: int(1, 64)
    .default(2)
    .describe(
      'results over 1 MiB one principal may have read at once on one gateway; each goes over a Redis connection of its own (4 per gateway, one read at a time each), never the connection every other command waits on ([PROTOCOL.md §22.5](PROTOCOL.md#22-backpressure-and-the-memory-budget)); the rest wait their turn',
    ),
  TASKRELAY_MAX_STREAM_BUFFER_BYTES: int(16_384, 1024 * 1024 * 1024).default(1_048_576),
  TASKRELAY_PUBLIC_URL: httpUrl
    .optional()
    .describe(
      'the base URL other systems reach the gateways at, for waitpoint URLs (`<base>/waitpoints/<token>`, [PROTOCOL.md §32](PROTOCOL.md#32-waitpoints-a-callback-url-a-tool-waits-on)); the same on every gateway. Default: `http://localhost:<PORT>`, announced only while no gateway announced a configured one',
    ),
  TASKRELAY_WAITPOINT_MAX_BYTES: int(2, 16 * 1024 * 1024)
    .default(65_536)
    .describe('the largest JSON body a waitpoint URL takes; a bigger one gets 413'),
  TASKRELAY_MEMORY_BUDGET_BYTES: int(1_048_576, 1024 * 1024 * 1024 * 1024).default(536_870_912),
  TASKRELAY_ADMIN_SESSION_TTL_MS: int(1_000, 30 * 86_400_000)
    .default(28_800_000)
    .describe(
      'how long a dashboard login (`POST /admin/login`) lasts; a session signed in with an OAuth access token ends when that token expires, if sooner ([OPERATIONS.md](OPERATIONS.md#the-dashboard-in-a-browser))',
    ),
  TASKRELAY_OAUTH_ISSUER: httpUrl.optional(),
  TASKRELAY_OAUTH_AUDIENCE: httpUrl.optional(),
  TASKRELAY_OAUTH_JWKS_URL: httpUrl.optional(),
  TASKRELAY_OAUTH_SCOPES: scopeList.optional(),
  TASKRELAY_OAUTH_CLOCK_SKEW_MS: int(0, 300_000).default(30_000),
  TASKRELAY_OAUTH_JWKS_COOLDOWN_MS: int(0, 3_600_000).default(30_000),
  TASKRELAY_WEBHOOK_SECRET: webhookSecret.optional(),
  TASKRELAY_REQUEST_STATE_SECRET: z
    .string()
    .min(32, { message: 'must be at least 32 characters' })
    .optional()
    .describe(
      'Key that signs the `requestState` of 2026-07-28 input rounds (MRTR, PROTOCOL.md §17.2); at least 32 characters, the same on every gateway. Default: a random key the first gateway stores in Redis (`<prefix>:request-state-key`) for all to share.',
    ),
  TASKRELAY_WEBHOOK_ALLOWED_HOSTS: webhookHostList.optional(),
  TASKRELAY_WEBHOOK_MAX_ATTEMPTS: int(1, 100).default(10),
  TASKRELAY_WEBHOOK_RETRY_BASE_MS: int(10, 3_600_000).default(2_000),
  TASKRELAY_WEBHOOK_RETRY_MAX_MS: int(10, 86_400_000).default(600_000),
  TASKRELAY_WEBHOOK_TIMEOUT_MS: int(100, 300_000).default(10_000),
  TASKRELAY_WEBHOOK_MAX_PENDING: int(1, 10_000_000).default(1_000),
  TASKRELAY_WEBHOOK_POLL_MS: int(10, 60_000).default(500),
});

/** The worker's environment, variable by variable (docs/CONFIGURATION.md is generated from it). */
export const workerEnvSchema = z.object({
  ...commonShape,
  TASKRELAY_PREFIX: workerSettingsShape.prefix,
  TASKRELAY_PROGRESS_INTERVAL_MS: intEnv(workerSettingsShape.progressIntervalMs),
  WORKER_CONCURRENCY: intEnv(workerSettingsShape.concurrency),
  WORKER_LOCK_DURATION_MS: intEnv(workerSettingsShape.lockDurationMs),
  TASKRELAY_TOOLS: z.string().trim().min(1).optional(),
  TASKRELAY_QUEUE: workerSettingsShape.queue,
  WORKER_HEARTBEAT_MS: intEnv(workerSettingsShape.heartbeatMs),
  WORKER_ABORT_GRACE_MS: intEnv(workerSettingsShape.abortGraceMs),
  WORKER_CANCEL_SWEEP_MS: intEnv(workerSettingsShape.cancelSweepMs),
  WORKER_SHUTDOWN_GRACE_MS: intEnv(workerSettingsShape.shutdownGraceMs),
  WORKER_METRICS_PORT: int(1, 65_535).optional(),
  HOST: z.string().trim().min(1).default('127.0.0.1'),
  TASKRELAY_INLINE_RESULT_BYTES: int(1_024, 1024 * 1024 * 1024)
    .default(1024 * 1024)
    .describe(
      'a result, or one content block of it, above this many bytes is stored apart and returned as `resource_link` content, read with `resources/read` ([PROTOCOL.md §34.3](PROTOCOL.md#34-task-output-as-resources))',
    ),
  TASKRELAY_MAX_OUTPUT_BYTES: int(1_024, 512 * 1024 * 1024)
    .default(1024 * 1024)
    .describe(
      "the most bytes a task's partial output (`ctx.output`) keeps: past it the oldest part is dropped (§34.2)",
    ),
  TASKRELAY_BLOB_TTL_MS: int(1_000, 365 * 86_400_000)
    .default(86_400_000)
    .describe(
      "how long a task's output, results stored apart and artifacts stay in Redis after their last write (§34)",
    ),
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK: int(1_024, 1024 * 1024 * 1024 * 1024)
    .default(64 * 1024 * 1024)
    .describe('the most bytes one task stores apart: artifacts and results moved out by reference (§34.4)'),
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL: int(1_024, 1024 * 1024 * 1024 * 1024)
    .default(1024 * 1024 * 1024)
    .describe('the most bytes one principal stores apart within `TASKRELAY_BLOB_TTL_MS` of its last store (§34.4)'),
});

export interface CommonConfig {
  /**
   * Where Redis is, as `createRedis` takes it: `REDIS_URL`, or the `redis+cluster://` / `redis+sentinel://` target
   * built from `REDIS_CLUSTER_NODES` / `REDIS_SENTINELS` (which win over `REDIS_URL`); undefined when none is set (the
   * entry points require one).
   */
  redisUrl: string | undefined;
  /** Prefix of every Redis key and channel. Default `taskrelay`. */
  prefix: string;
  /** `TASKRELAY_KEY_LAYOUT` (PROTOCOL.md §1.1); `keyLayoutOf` says which layout it means. Default `auto`. */
  keyLayout: KeyLayoutSetting;
  /** pino level. Default `info`. */
  logLevel: (typeof LOG_LEVELS)[number];
  /** Per-task progress throttle interval. Default 50 ms (about 20 updates per second). */
  progressIntervalMs: number;
  /** `TASKRELAY_WAITPOINT_SECRET`: seals waitpoint tokens (PROTOCOL.md §32.2); undefined: a key kept in Redis. */
  waitpointSecret?: string | undefined;
  /** Where values stored apart from results keep their bytes (PROTOCOL.md §34.7). Default Redis. */
  blobStore: BlobStoreConfig;
}

export interface GatewayConfig extends CommonConfig {
  host: string;
  port: number;
  /** token → principal; undefined when authentication is off. */
  authTokens: Map<string, string> | undefined;
  /**
   * Principals allowed on `/admin` and `/metrics` when authentication is on (static-token names, or OAuth
   * `<iss>#<sub>`); undefined: nobody. Ignored with authentication off (the loopback rules of `/mcp` apply).
   */
  operators: string[] | undefined;
  /** Allowed `Origin` values; undefined means loopback origins only. */
  allowedOrigins: string[] | undefined;
  defaultTtlMs: number;
  maxTtlMs: number;
  /** How long a task stays after it ended, per ending status, instead of its ttl (PROTOCOL.md §30.1). */
  retainCompletedMs: number | undefined;
  retainFailedMs: number | undefined;
  retainCancelledMs: number | undefined;
  pollIntervalMs: number;
  /** Upper bound on any tool's run time; a tool's own `timeoutMs` may only be lower. */
  maxToolTimeoutMs: number;
  /** How long SSE events are kept for Last-Event-ID replay. */
  eventTtlMs: number;
  /** A session with no open stream and no request for this long is closed (its tasks live on). */
  sessionIdleMs: number;
  /** How often the reaper looks at live tasks (PROTOCOL.md §10.3). Default 5000 ms. */
  reaperIntervalMs: number;
  /** How long a job may wait for a worker before the reaper fails its task. Default 1 h. */
  queueTimeoutMs: number;
  /**
   * How long a pool's tools stay listed, and their calls accepted and queued, after its last worker has gone (a pool
   * scaled to zero, PROTOCOL.md §24). `0`: a tool goes with its last worker. Default 86400000 (24 h).
   */
  catalogRetentionMs: number;
  /** How far ahead a call's start-at may be (PROTOCOL.md §33.1). Default 30 days. */
  maxStartDelayMs: number;
  /** A YAML or JSON file of schedules applied at start (PROTOCOL.md §33.2); undefined: none. */
  schedulesFile: string | undefined;
  /**
   * On SIGTERM/SIGINT, how long plain calls in flight may finish before they are ended with `GATEWAY_SHUTDOWN`.
   * Default 10000 ms.
   */
  shutdownGraceMs: number;
  /**
   * Accepted `Host` header values (`host` on any port, or `host:port`); undefined means loopback names and `host`.
   */
  allowedHosts: string[] | undefined;
  /** Serve without authentication on a non-loopback address (an explicit opt-in; warned about). Default false. */
  allowUnauthenticated: boolean;
  /** Largest request body, after any content decoding; bigger ones get 413. Default 1 MiB. */
  maxBodyBytes: number;
  /** Deepest nesting of a JSON body, checked on the raw bytes before parsing. Default 64. */
  maxJsonDepth: number;
  /** Open sessions one principal may hold on one gateway; 0 = no limit. Default 1000. */
  maxSessionsPerPrincipal: number;
  /** Non-terminal tasks one principal may hold (all gateways); 0 = no limit. Default 1000. */
  maxOpenTasks: number;
  /** `tools/call` requests one principal may make per `rateLimitWindowMs` (all gateways); 0 = no limit. */
  rateLimitCalls: number;
  /** `tasks/*` requests one principal may make per `rateLimitWindowMs` (all gateways); 0 = no limit. */
  rateLimitTaskOps: number;
  /** The rate limits' window. Default 60000 ms. */
  rateLimitWindowMs: number;
  /** Largest `tools/call` arguments, as JSON bytes. Default 256 KiB. */
  maxArgumentBytes: number;
  /** Largest `_meta.progressToken`, as JSON bytes. Default 256. */
  maxProgressTokenBytes: number;
  /** Largest tool result the gateway delivers, as JSON bytes; a bigger one is answered with an error result. */
  maxResultBytes: number;
  /** Large results (over 1 MiB) one principal may have read at once on this gateway (PROTOCOL.md §22.5). Default 2. */
  maxLargeReadsPerPrincipal: number;
  /**
   * Bytes that may wait to go out on one SSE stream while its client does not read; past it progress is coalesced
   * and the stream is closed (the client resumes it). Default 1 MiB.
   */
  maxStreamBufferBytes: number;
  /** `TASKRELAY_REQUEST_STATE_SECRET`: signs MRTR `requestState` (PROTOCOL.md §17.2); undefined: a key kept in Redis. */
  requestStateSecret?: string | undefined;
  /** `TASKRELAY_PUBLIC_URL`: the base of waitpoint URLs (PROTOCOL.md §32.2); undefined: `http://localhost:<port>`. */
  publicUrl?: string | undefined;
  /** The largest JSON body a waitpoint URL takes, in bytes. Default 64 KiB. */
  waitpointMaxBytes: number;
  /**
   * What this gateway may hold for its clients (sessions, event stores, task routes, listen streams, SSE send
   * buffers); past it the largest stream buffers of the principal holding the most are closed, then the least recently
   * seen idle sessions, then new sessions get 503. Default 512 MiB.
   */
  memoryBudgetBytes: number;
  /**
   * How long a dashboard login lasts (docs/OPERATIONS.md); one made with an OAuth access token ends when the token
   * expires, if sooner. Default 28800000 (8 h).
   */
  adminSessionTtlMs: number;
  /** OAuth 2.1 resource server settings; undefined when OAuth is off. */
  oauth: OAuthConfig | undefined;
  /** Completion webhooks (PROTOCOL.md §27). */
  webhooks: WebhookConfig;
}

/** Completion webhooks (PROTOCOL.md §27, docs/WEBHOOKS.md). */
export interface WebhookConfig {
  /**
   * Signing key as given (`TASKRELAY_WEBHOOK_SECRET`): its UTF-8 bytes, or the base64-decoded rest after `whsec_`.
   * Undefined (the default): every webhook is refused.
   */
  secret: string | undefined;
  /** `host` (any port) or `host:port` entries webhook URLs may name, lowercased. Default none. */
  allowedHosts: string[];
  /** Tries of one event before it is dead-lettered. Default 10. */
  maxAttempts: number;
  /** Wait after the first failed try; doubles after each. Default 2000 ms. */
  retryBaseMs: number;
  /** Longest wait between two tries. Default 600000 ms (10 min). */
  retryMaxMs: number;
  /** Bound on one try, connection to answer. Default 10000 ms. */
  timeoutMs: number;
  /** Events of one principal that may wait for delivery at once. Default 1000. */
  maxPendingPerPrincipal: number;
  /** How often each gateway looks for due events. Default 500 ms. */
  pollMs: number;
}

export interface OAuthConfig {
  /** Required `iss`. */
  issuer: string;
  /** Required `aud`: this gateway's resource URL (also `resource` in its RFC 9728 metadata). */
  audience: string;
  /** The issuer's JWKS. */
  jwksUrl: string;
  /** Scopes every token must carry (403 `insufficient_scope` otherwise). Default none. */
  requiredScopes: string[];
  /** Tolerance on `exp`/`nbf`/`iat`. Default 30000 ms. */
  clockSkewMs: number;
  /** How soon a token with an unknown `kid` may make the gateway fetch the JWKS again (rotation). Default 30000 ms. */
  jwksCooldownMs: number;
}

export interface WorkerConfig extends CommonConfig {
  concurrency: number;
  lockDurationMs: number;
  /** Module whose exports are tool definitions; undefined serves the demo tools. */
  toolsModule: string | undefined;
  queue: string;
  heartbeatMs: number;
  abortGraceMs: number;
  cancelSweepMs: number;
  /** On SIGTERM, how long running jobs may finish before they are aborted and handed back. Default 30000 ms. */
  shutdownGraceMs: number;
  /** When set, Prometheus `/metrics` is served on this port (`WORKER_METRICS_PORT`). Default: unset, no listener. */
  metricsPort: number | undefined;
  /** Address the metrics listener binds (`HOST`, as for the gateway). Default `127.0.0.1`. */
  metricsHost: string;
  /** Bounds of task output, results by reference and artifacts (PROTOCOL.md §34). */
  output: OutputLimits;
}

function parseEnv<S extends z.ZodType>(schema: S, env: Env): z.infer<S> {
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

function common(parsed: z.infer<typeof gatewayEnvSchema> | z.infer<typeof workerEnvSchema>): CommonConfig {
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

/**
 * Each gateway option and the environment variable that sets it: the only thing the environment loader adds to the
 * options (bounds and defaults are the schema's, `gatewayEnvSchema`).
 */
const GATEWAY_ENV_NAMES = {
  prefix: 'TASKRELAY_PREFIX',
  keyLayout: 'TASKRELAY_KEY_LAYOUT',
  logLevel: 'LOG_LEVEL',
  progressIntervalMs: 'TASKRELAY_PROGRESS_INTERVAL_MS',
  host: 'HOST',
  port: 'PORT',
  authTokens: 'TASKRELAY_AUTH_TOKENS',
  operators: 'TASKRELAY_OPERATORS',
  allowedOrigins: 'TASKRELAY_ALLOWED_ORIGINS',
  defaultTtlMs: 'TASKRELAY_DEFAULT_TTL_MS',
  maxTtlMs: 'TASKRELAY_MAX_TTL_MS',
  retainCompletedMs: 'TASKRELAY_RETAIN_COMPLETED_MS',
  retainFailedMs: 'TASKRELAY_RETAIN_FAILED_MS',
  retainCancelledMs: 'TASKRELAY_RETAIN_CANCELLED_MS',
  pollIntervalMs: 'TASKRELAY_POLL_INTERVAL_MS',
  maxToolTimeoutMs: 'TASKRELAY_MAX_TOOL_TIMEOUT_MS',
  eventTtlMs: 'TASKRELAY_EVENT_TTL_MS',
  sessionIdleMs: 'TASKRELAY_SESSION_IDLE_MS',
  reaperIntervalMs: 'TASKRELAY_REAPER_INTERVAL_MS',
  queueTimeoutMs: 'TASKRELAY_QUEUE_TIMEOUT_MS',
  catalogRetentionMs: 'TASKRELAY_CATALOG_RETENTION_MS',
  maxStartDelayMs: 'TASKRELAY_MAX_START_DELAY_MS',
  schedulesFile: 'TASKRELAY_SCHEDULES_FILE',
  shutdownGraceMs: 'GATEWAY_SHUTDOWN_GRACE_MS',
  allowedHosts: 'TASKRELAY_ALLOWED_HOSTS',
  allowUnauthenticated: 'TASKRELAY_ALLOW_UNAUTHENTICATED',
  maxBodyBytes: 'TASKRELAY_MAX_BODY_BYTES',
  maxJsonDepth: 'TASKRELAY_MAX_JSON_DEPTH',
  maxSessionsPerPrincipal: 'TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL',
  maxOpenTasks: 'TASKRELAY_MAX_OPEN_TASKS',
  rateLimitCalls: 'TASKRELAY_RATE_LIMIT_CALLS',
  rateLimitTaskOps: 'TASKRELAY_RATE_LIMIT_TASK_OPS',
  rateLimitWindowMs: 'TASKRELAY_RATE_LIMIT_WINDOW_MS',
  maxArgumentBytes: 'TASKRELAY_MAX_ARGUMENT_BYTES',
  maxProgressTokenBytes: 'TASKRELAY_MAX_PROGRESS_TOKEN_BYTES',
  maxResultBytes: 'TASKRELAY_MAX_RESULT_BYTES',
  maxLargeReadsPerPrincipal: 'TASKRELAY_MAX_LARGE_READS_PER_PRINCIPAL',
  maxStreamBufferBytes: 'TASKRELAY_MAX_STREAM_BUFFER_BYTES',
  requestStateSecret: 'TASKRELAY_REQUEST_STATE_SECRET',
  waitpointSecret: 'TASKRELAY_WAITPOINT_SECRET',
  publicUrl: 'TASKRELAY_PUBLIC_URL',
  waitpointMaxBytes: 'TASKRELAY_WAITPOINT_MAX_BYTES',
  memoryBudgetBytes: 'TASKRELAY_MEMORY_BUDGET_BYTES',
  adminSessionTtlMs: 'TASKRELAY_ADMIN_SESSION_TTL_MS',
} as const satisfies Partial<Record<keyof GatewayConfig, keyof typeof gatewayEnvSchema.shape>>;

const WEBHOOK_ENV_NAMES = {
  secret: 'TASKRELAY_WEBHOOK_SECRET',
  allowedHosts: 'TASKRELAY_WEBHOOK_ALLOWED_HOSTS',
  maxAttempts: 'TASKRELAY_WEBHOOK_MAX_ATTEMPTS',
  retryBaseMs: 'TASKRELAY_WEBHOOK_RETRY_BASE_MS',
  retryMaxMs: 'TASKRELAY_WEBHOOK_RETRY_MAX_MS',
  timeoutMs: 'TASKRELAY_WEBHOOK_TIMEOUT_MS',
  maxPendingPerPrincipal: 'TASKRELAY_WEBHOOK_MAX_PENDING',
  pollMs: 'TASKRELAY_WEBHOOK_POLL_MS',
} as const satisfies Record<keyof WebhookConfig, keyof typeof gatewayEnvSchema.shape>;

const OAUTH_ENV_NAMES = {
  issuer: 'TASKRELAY_OAUTH_ISSUER',
  audience: 'TASKRELAY_OAUTH_AUDIENCE',
  jwksUrl: 'TASKRELAY_OAUTH_JWKS_URL',
  requiredScopes: 'TASKRELAY_OAUTH_SCOPES',
  clockSkewMs: 'TASKRELAY_OAUTH_CLOCK_SKEW_MS',
  jwksCooldownMs: 'TASKRELAY_OAUTH_JWKS_COOLDOWN_MS',
} as const satisfies Record<keyof OAuthConfig, keyof typeof gatewayEnvSchema.shape>;

/** How the checks that span options name them: by variable for the environment, by option for `startGateway`. */
interface Naming {
  what: string;
  name: (option: string) => string;
}

const ENV_NAMING: Naming = {
  what: 'configuration',
  name: (option) =>
    option === 'oauth'
      ? 'TASKRELAY_OAUTH_*'
      : ((GATEWAY_ENV_NAMES as Record<string, string>)[option] ??
        (WEBHOOK_ENV_NAMES as Record<string, string>)[option.replace(/^webhooks\./, '')] ??
        option),
};

const OPTION_NAMING: Naming = { what: 'gateway options', name: (option) => option };

/** The rules that span several settings, wherever the settings came from. */
function checkGatewayConfig(config: GatewayConfig, naming: Naming): GatewayConfig {
  const { what, name } = naming;
  if (config.defaultTtlMs > config.maxTtlMs) {
    throw new ConfigError(`Invalid ${what}: ${name('defaultTtlMs')} must not exceed ${name('maxTtlMs')}`);
  }
  if (config.webhooks.retryBaseMs > config.webhooks.retryMaxMs) {
    throw new ConfigError(
      `Invalid ${what}: ${name('webhooks.retryBaseMs')} must not exceed ${name('webhooks.retryMaxMs')}`,
    );
  }
  const authOn = config.authTokens !== undefined || config.oauth !== undefined;
  if (!authOn && !isLoopbackHost(config.host) && !config.allowUnauthenticated) {
    throw new ConfigError(
      `Invalid ${what}: ${name('host')} ${config.host} is not a loopback address and no authentication is configured; set ${name('authTokens')} or ${name('oauth')}, or ${name('allowUnauthenticated')}=true to serve anyone who can reach it`,
    );
  }
  const problem = clusterPrefixProblem(config.redisUrl, config.prefix, config.keyLayout);
  if (problem) throw new ConfigError(`Invalid ${what}: ${name('prefix')} ${problem}`);
  return config;
}

export function loadGatewayConfig(env: Env = process.env): GatewayConfig {
  const p = parseEnv(gatewayEnvSchema, env);
  const oauthVars = [p.TASKRELAY_OAUTH_ISSUER, p.TASKRELAY_OAUTH_AUDIENCE, p.TASKRELAY_OAUTH_JWKS_URL];
  if (oauthVars.some((v) => v !== undefined) && oauthVars.some((v) => v === undefined)) {
    throw new ConfigError(
      'Invalid configuration: TASKRELAY_OAUTH_ISSUER, TASKRELAY_OAUTH_AUDIENCE and TASKRELAY_OAUTH_JWKS_URL must be set together',
    );
  }
  if (p.TASKRELAY_OAUTH_ISSUER === undefined && p.TASKRELAY_OAUTH_SCOPES !== undefined) {
    throw new ConfigError('Invalid configuration: TASKRELAY_OAUTH_SCOPES needs TASKRELAY_OAUTH_ISSUER to be set');
  }
  const pick = <M extends Record<string, keyof typeof p>>(names: M) =>
    Object.fromEntries(Object.entries(names).map(([option, variable]) => [option, p[variable]])) as {
      [K in keyof M]: (typeof p)[M[K]];
    };
  const oauth = pick(OAUTH_ENV_NAMES);
  const webhooks = pick(WEBHOOK_ENV_NAMES);
  return checkGatewayConfig(
    {
      ...pick(GATEWAY_ENV_NAMES),
      ...common(p),
      oauth:
        oauth.issuer !== undefined && oauth.audience !== undefined && oauth.jwksUrl !== undefined
          ? {
              ...oauth,
              issuer: oauth.issuer,
              audience: oauth.audience,
              jwksUrl: oauth.jwksUrl,
              requiredScopes: oauth.requiredScopes ?? [],
            }
          : undefined,
      webhooks: { ...webhooks, allowedHosts: webhooks.allowedHosts ?? [] },
    },
    ENV_NAMING,
  );
}

/**
 * What `startGateway` takes: only what differs from the defaults (docs/CONFIGURATION.md; the same as with an empty
 * environment). `redisUrl` is required to start.
 */
export type GatewayOptions = Partial<Omit<GatewayConfig, 'webhooks' | 'oauth'>> & {
  webhooks?: Partial<WebhookConfig>;
  /** OAuth 2.1 resource server; `issuer`, `audience` and `jwksUrl` are required, the rest defaults. */
  oauth?: Pick<OAuthConfig, 'issuer' | 'audience' | 'jwksUrl'> & Partial<OAuthConfig>;
};

let gatewayDefaults: GatewayConfig | undefined;

/** One option checked by its variable's schema: the same bounds and messages, named as the option. */
function checkOption(option: string, variable: keyof typeof gatewayEnvSchema.shape, value: unknown): void {
  if (value === undefined) return;
  if (value instanceof Map) {
    for (const [token, principal] of value) {
      if (typeof token !== 'string' || typeof principal !== 'string' || !token || !principal) {
        throw new ConfigError(`Invalid gateway options: ${option} must map tokens to principals (non-empty strings)`);
      }
    }
    return;
  }
  let text: string;
  if (Array.isArray(value)) text = value.map(String).join(variable === 'TASKRELAY_OAUTH_SCOPES' ? ' ' : ',');
  else if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') text = String(value);
  else
    throw new ConfigError(
      `Invalid gateway options: ${option} must be a ${typeof value === 'object' ? 'value, not an object' : 'value'}`,
    );
  const result = gatewayEnvSchema.shape[variable].safeParse(text);
  if (!result.success) {
    throw new ConfigError(`Invalid gateway options: ${option} ${result.error.issues[0]?.message ?? 'is invalid'}`);
  }
}

/**
 * Applies the documented defaults to the options of `startGateway`, checks each given option with the schema of its
 * environment variable (one set of bounds), then the rules that span options. Throws a one-line `ConfigError`.
 */
export function resolveGatewayOptions(options: GatewayOptions = {}): GatewayConfig {
  gatewayDefaults ??= loadGatewayConfig({});
  const given = <T extends object>(o: T | undefined) =>
    Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined)) as Partial<T>;
  for (const [option, variable] of Object.entries(GATEWAY_ENV_NAMES)) {
    checkOption(option, variable, (options as Record<string, unknown>)[option]);
  }
  for (const [option, variable] of Object.entries(WEBHOOK_ENV_NAMES)) {
    checkOption(`webhooks.${option}`, variable, (options.webhooks as Record<string, unknown> | undefined)?.[option]);
  }
  for (const [option, variable] of Object.entries(OAUTH_ENV_NAMES)) {
    checkOption(`oauth.${option}`, variable, (options.oauth as Record<string, unknown> | undefined)?.[option]);
  }
  const defaults = gatewayDefaults;
  return checkGatewayConfig(
    {
      ...defaults,
      ...given(options),
      webhooks: { ...defaults.webhooks, ...given(options.webhooks) },
      oauth: options.oauth
        ? {
            requiredScopes: [],
            clockSkewMs: gatewayEnvSchema.shape.TASKRELAY_OAUTH_CLOCK_SKEW_MS.parse(undefined),
            jwksCooldownMs: gatewayEnvSchema.shape.TASKRELAY_OAUTH_JWKS_COOLDOWN_MS.parse(undefined),
            ...given(options.oauth),
          }
        : undefined,
    } as GatewayConfig,
    OPTION_NAMING,
  );
}

/** `localhost`, 127.0.0.0/8 or `::1` (with or without brackets). */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127(\.\d{1,3}){3}$/.test(h);
}

export function loadWorkerConfig(env: Env = process.env): WorkerConfig {
  const p = parseEnv(workerEnvSchema, env);
  return {
    ...common(p),
    concurrency: p.WORKER_CONCURRENCY,
    lockDurationMs: p.WORKER_LOCK_DURATION_MS,
    toolsModule: p.TASKRELAY_TOOLS,
    queue: p.TASKRELAY_QUEUE,
    heartbeatMs: p.WORKER_HEARTBEAT_MS,
    abortGraceMs: p.WORKER_ABORT_GRACE_MS,
    cancelSweepMs: p.WORKER_CANCEL_SWEEP_MS,
    shutdownGraceMs: p.WORKER_SHUTDOWN_GRACE_MS,
    metricsPort: p.WORKER_METRICS_PORT,
    metricsHost: p.HOST,
    output: {
      inlineResultBytes: p.TASKRELAY_INLINE_RESULT_BYTES,
      maxOutputBytes: p.TASKRELAY_MAX_OUTPUT_BYTES,
      blobTtlMs: p.TASKRELAY_BLOB_TTL_MS,
      maxTaskBytes: p.TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK,
      maxPrincipalBytes: p.TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL,
    },
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

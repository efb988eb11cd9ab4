/** The gateway's environment schema, variable by variable (docs/CONFIGURATION.md is generated from it). */
import { z } from 'zod';
import { commonShape } from './common.js';
import { authTokens, flag, httpUrl, int, originList, scopeList, webhookHostList, webhookSecret } from './values.js';

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
    .describe(
      'the longest `pollInterval` suggested to clients; a younger task gets a quarter of its age, from 50 ms (a create answers 10 ms)',
    ),
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

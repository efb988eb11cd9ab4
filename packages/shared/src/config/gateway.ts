/**
 * The gateway's configuration: its resolved shape (`GatewayConfig`, webhooks, OAuth), read from the environment
 * (`loadGatewayConfig`) or from `startGateway`'s options (`resolveGatewayOptions`), each option checked by its
 * variable's schema, and the rules that span several settings checked once for both.
 */
import { ConfigError } from '../protocol/errors.js';
import { clusterPrefixProblem } from '../redis.js';
import { common, parseEnv, type CommonConfig } from './common.js';
import { gatewayEnvSchema } from './gateway-env.js';
import type { Env } from './values.js';

export interface GatewayConfig extends CommonConfig {
  /** @default "127.0.0.1" */
  host: string;
  /** @default 3000 */
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
  /** @default 3600000 */
  defaultTtlMs: number;
  /** @default 86400000 */
  maxTtlMs: number;
  /** How long a task stays after it ended, per ending status, instead of its ttl (PROTOCOL.md §30.1). */
  retainCompletedMs: number | undefined;
  retainFailedMs: number | undefined;
  retainCancelledMs: number | undefined;
  /** @default 1000 */
  pollIntervalMs: number;
  /**
   * Upper bound on any tool's run time; a tool's own `timeoutMs` may only be lower.
   * @default 86400000
   */
  maxToolTimeoutMs: number;
  /**
   * How long SSE events are kept for Last-Event-ID replay.
   * @default 3600000
   */
  eventTtlMs: number;
  /**
   * A session with no open stream and no request for this long is closed (its tasks live on).
   * @default 1800000
   */
  sessionIdleMs: number;
  /**
   * How often the reaper looks at live tasks (PROTOCOL.md §10.3). Default 5000 ms.
   * @default 5000
   */
  reaperIntervalMs: number;
  /**
   * How long a job may wait for a worker before the reaper fails its task. Default 1 h.
   * @default 3600000
   */
  queueTimeoutMs: number;
  /**
   * How long a pool's tools stay listed, and their calls accepted and queued, after its last worker has gone (a pool
   * scaled to zero, PROTOCOL.md §24). `0`: a tool goes with its last worker. Default 86400000 (24 h).
   * @default 86400000
   */
  catalogRetentionMs: number;
  /**
   * How far ahead a call's start-at may be (PROTOCOL.md §33.1). Default 30 days.
   * @default 2592000000
   */
  maxStartDelayMs: number;
  /** A YAML or JSON file of schedules applied at start (PROTOCOL.md §33.2); undefined: none. */
  schedulesFile: string | undefined;
  /**
   * On SIGTERM/SIGINT, how long plain calls in flight may finish before they are ended with `GATEWAY_SHUTDOWN`.
   * Default 10000 ms.
   * @default 10000
   */
  shutdownGraceMs: number;
  /**
   * Accepted `Host` header values (`host` on any port, or `host:port`); undefined means loopback names and `host`.
   */
  allowedHosts: string[] | undefined;
  /**
   * Serve without authentication on a non-loopback address (an explicit opt-in; warned about). Default false.
   * @default false
   */
  allowUnauthenticated: boolean;
  /**
   * Largest request body, after any content decoding; bigger ones get 413. Default 1 MiB.
   * @default 1048576
   */
  maxBodyBytes: number;
  /**
   * Deepest nesting of a JSON body, checked on the raw bytes before parsing. Default 64.
   * @default 64
   */
  maxJsonDepth: number;
  /**
   * Open sessions one principal may hold on one gateway; 0 = no limit. Default 1000.
   * @default 1000
   */
  maxSessionsPerPrincipal: number;
  /**
   * Non-terminal tasks one principal may hold (all gateways); 0 = no limit. Default 1000.
   * @default 1000
   */
  maxOpenTasks: number;
  /**
   * `tools/call` requests one principal may make per `rateLimitWindowMs` (all gateways); 0 = no limit.
   * @default 60000
   */
  rateLimitCalls: number;
  /**
   * `tasks/*` requests one principal may make per `rateLimitWindowMs` (all gateways); 0 = no limit.
   * @default 120000
   */
  rateLimitTaskOps: number;
  /**
   * The rate limits' window. Default 60000 ms.
   * @default 60000
   */
  rateLimitWindowMs: number;
  /**
   * Largest `tools/call` arguments, as JSON bytes. Default 256 KiB.
   * @default 262144
   */
  maxArgumentBytes: number;
  /**
   * Largest `_meta.progressToken`, as JSON bytes. Default 256.
   * @default 256
   */
  maxProgressTokenBytes: number;
  /**
   * Largest tool result the gateway delivers, as JSON bytes; a bigger one is answered with an error result.
   * @default 16777216
   */
  maxResultBytes: number;
  /**
   * Large results (over 1 MiB) one principal may have read at once on this gateway (PROTOCOL.md §22.5). Default 2.
   * @default 2
   */
  maxLargeReadsPerPrincipal: number;
  /**
   * Bytes that may wait to go out on one SSE stream while its client does not read; past it progress is coalesced
   * and the stream is closed (the client resumes it). Default 1 MiB.
   * @default 1048576
   */
  maxStreamBufferBytes: number;
  /** `TASKRELAY_REQUEST_STATE_SECRET`: signs MRTR `requestState` (PROTOCOL.md §17.2); undefined: a key kept in Redis. */
  requestStateSecret?: string | undefined;
  /** `TASKRELAY_PUBLIC_URL`: the base of waitpoint URLs (PROTOCOL.md §32.2); undefined: `http://localhost:<port>`. */
  publicUrl?: string | undefined;
  /**
   * The largest JSON body a waitpoint URL takes, in bytes. Default 64 KiB.
   * @default 65536
   */
  waitpointMaxBytes: number;
  /**
   * What this gateway may hold for its clients (sessions, event stores, task routes, listen streams, SSE send
   * buffers); past it the largest stream buffers of the principal holding the most are closed, then the least recently
   * seen idle sessions, then new sessions get 503. Default 512 MiB.
   * @default 536870912
   */
  memoryBudgetBytes: number;
  /**
   * How long a dashboard login lasts (docs/OPERATIONS.md); one made with an OAuth access token ends when the token
   * expires, if sooner. Default 28800000 (8 h).
   * @default 28800000
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
  /**
   * Tries of one event before it is dead-lettered. Default 10.
   * @default 10
   */
  maxAttempts: number;
  /**
   * Wait after the first failed try; doubles after each. Default 2000 ms.
   * @default 2000
   */
  retryBaseMs: number;
  /**
   * Longest wait between two tries. Default 600000 ms (10 min).
   * @default 600000
   */
  retryMaxMs: number;
  /**
   * Bound on one try, connection to answer. Default 10000 ms.
   * @default 10000
   */
  timeoutMs: number;
  /**
   * Events of one principal that may wait for delivery at once. Default 1000.
   * @default 1000
   */
  maxPendingPerPrincipal: number;
  /**
   * How often each gateway looks for due events. Default 500 ms.
   * @default 500
   */
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

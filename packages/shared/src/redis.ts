import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { ConfigError, TaskrelayError } from './protocol/errors.js';

export { Cluster, Redis } from 'ioredis';

/**
 * A connection taskrelay talks to: one server (or a Sentinel master) is an ioredis `Redis`, a Redis Cluster an
 * ioredis `Cluster`. Both have everything taskrelay and BullMQ call (commands, scripts, `multi` within one slot,
 * pub/sub, `duplicate`, `quit`); code that needs more than that narrows with `instanceof`.
 */
export type RedisClient = Redis | Cluster;

/** One `host:port` of a Redis Cluster seed list or a Sentinel list. */
export interface RedisNode {
  host: string;
  port: number;
}

/**
 * Where Redis is. One string carries it through every layer (config, `startWorker({ redisUrl })`, `startGateway`):
 * - `redis://…` / `rediss://…` (TLS): one server;
 * - `redis+cluster://host:port,host:port`: a Redis Cluster, through these seed nodes;
 * - `redis+sentinel://host:port,host:port/<master name>`: the master the Sentinels name.
 */
export type RedisTarget =
  | { kind: 'standalone'; url: string }
  | { kind: 'cluster'; nodes: RedisNode[] }
  | { kind: 'sentinel'; sentinels: RedisNode[]; name: string };

const CLUSTER_SCHEME = 'redis+cluster://';
const SENTINEL_SCHEME = 'redis+sentinel://';

const formatNode = ({ host, port }: RedisNode) => `${host.includes(':') ? `[${host}]` : host}:${port}`;

export function clusterTarget(nodes: readonly RedisNode[]): string {
  return `${CLUSTER_SCHEME}${nodes.map(formatNode).join(',')}`;
}

export function sentinelTarget(sentinels: readonly RedisNode[], name: string): string {
  return `${SENTINEL_SCHEME}${sentinels.map(formatNode).join(',')}/${name}`;
}

/**
 * True when every key built from `prefix` hashes to one Redis Cluster slot: the prefix starts with a non-empty
 * `{hash tag}` (Redis hashes only what is inside the first braces).
 */
export function isClusterPrefix(prefix: string): boolean {
  return /^\{[^{}]+\}/.test(prefix);
}

/** `TASKRELAY_KEY_LAYOUT` (PROTOCOL.md §1.1): `auto` picks the layout from the target and the prefix. */
export const KEY_LAYOUT_SETTINGS = ['auto', 'single', 'sharded'] as const;
export type KeyLayoutSetting = (typeof KEY_LAYOUT_SETTINGS)[number];

/**
 * The key layout a deployment uses (PROTOCOL.md §1.1): `sharded` on a Redis Cluster with an unbraced prefix, or when
 * forced; `single` otherwise (a braced prefix keeps today's one-slot layout).
 */
export function keyLayoutOf(
  target: string | undefined,
  prefix: string,
  setting: KeyLayoutSetting = 'auto',
): 'single' | 'sharded' {
  if (setting !== 'auto') return setting;
  return target?.startsWith(CLUSTER_SCHEME) && !/[{}]/.test(prefix) ? 'sharded' : 'single';
}

/**
 * The rules for a prefix (PROTOCOL.md §1.1). The single layout on a Redis Cluster needs the prefix to start with a
 * `{hash tag}`: its Lua scripts and BullMQ touch several keys at once, which must all hash to one slot. The sharded
 * layout puts tags of its own after the prefix, so its prefix has no braces. Returns what is wrong, as a phrase to
 * follow the setting's name, or undefined when `prefix` suits `target` and `setting`.
 */
export function clusterPrefixProblem(
  target: string | undefined,
  prefix: string,
  setting: KeyLayoutSetting = 'auto',
): string | undefined {
  const bare = prefix.replace(/[{}]/g, '') || 'taskrelay';
  if (keyLayoutOf(target, prefix, setting) === 'sharded') {
    return /[{}]/.test(prefix)
      ? `must have no braces with the sharded key layout (TASKRELAY_KEY_LAYOUT=sharded), e.g. ${bare} (got ${JSON.stringify(prefix)})`
      : undefined;
  }
  if (!target?.startsWith(CLUSTER_SCHEME) || isClusterPrefix(prefix)) return undefined;
  return `must be wrapped in {} on a Redis Cluster with the single key layout (one hash slot for every key), e.g. {${bare}}, or be unbraced with TASKRELAY_KEY_LAYOUT=auto (got ${JSON.stringify(prefix)})`;
}

function parseNodes(list: string, what: string): RedisNode[] {
  return list.split(',').map((item) => {
    const match = /^(\[[0-9a-fA-F:]+\]|[^\s:/[\]]+):(\d{1,5})$/.exec(item.trim());
    if (!match?.[1])
      throw new ConfigError(`Invalid Redis target: ${what} must be host:port (got ${JSON.stringify(item)})`);
    return { host: match[1].replace(/^\[|\]$/g, ''), port: Number(match[2]) };
  });
}

/** Parses a target string (see `RedisTarget`); throws a one-line `ConfigError` for anything else. */
export function parseRedisTarget(target: string): RedisTarget {
  if (target.startsWith(CLUSTER_SCHEME)) {
    return { kind: 'cluster', nodes: parseNodes(target.slice(CLUSTER_SCHEME.length), 'a cluster node') };
  }
  if (target.startsWith(SENTINEL_SCHEME)) {
    const rest = target.slice(SENTINEL_SCHEME.length);
    const slash = rest.lastIndexOf('/');
    const name = slash > 0 ? rest.slice(slash + 1) : '';
    if (!name)
      throw new ConfigError('Invalid Redis target: redis+sentinel:// needs /<master name> after the sentinels');
    return { kind: 'sentinel', sentinels: parseNodes(rest.slice(0, slash), 'a sentinel'), name };
  }
  if (/^rediss?:\/\/\S+$/.test(target) && URL.canParse(target)) return { kind: 'standalone', url: target };
  throw new ConfigError(
    `Invalid Redis target: must be redis://, rediss://, ${CLUSTER_SCHEME} or ${SENTINEL_SCHEME} (got ${JSON.stringify(target)})`,
  );
}

/** True when `target` is a target `createRedis` takes. */
export function isRedisTarget(target: string): boolean {
  try {
    parseRedisTarget(target);
    return true;
  } catch {
    return false;
  }
}

/** What a client was made for, for one-line errors (a cluster has no single host). */
const described = new WeakMap<object, string>();

/**
 * Creates an ioredis client for a target (see `RedisTarget`). `maxRetriesPerRequest: null` is what BullMQ needs for
 * blocking connections and lets commands wait through a reconnect instead of failing.
 *
 * A cluster target gives an ioredis `Cluster` (see `RedisClient`). Per-node options (timeouts, retries, the connection
 * name) go to every node; `retryStrategy` becomes the cluster's.
 */
export function createRedis(
  target: string,
  options: RedisOptions & {
    /**
     * A cluster client's `SSUBSCRIBE`s go to the master of each channel's slot, and follow it through a failover
     * (ioredis's `shardedSubscribers`; PROTOCOL.md §1.2). Only for a subscriber connection in the sharded layout.
     */
    shardedSubscribers?: boolean;
  } = {},
): RedisClient {
  const parsed = parseRedisTarget(target);
  const { shardedSubscribers, ...rest } = options;
  const merged: RedisOptions = { maxRetriesPerRequest: null, enableReadyCheck: true, ...rest };
  let client: RedisClient;
  if (parsed.kind === 'cluster') {
    const { retryStrategy, lazyConnect, ...redisOptions } = merged;
    const cluster = new Cluster(parsed.nodes, {
      redisOptions,
      enableReadyCheck: true,
      lazyConnect: lazyConnect ?? false,
      ...(shardedSubscribers === true ? { shardedSubscribers: true } : {}),
      ...(retryStrategy ? { clusterRetryStrategy: (times: number) => retryStrategy(times) } : {}),
    });
    client = cluster;
    described.set(client, `cluster ${parsed.nodes.map(formatNode).join(',')}`);
  } else if (parsed.kind === 'sentinel') {
    client = new Redis({ ...merged, sentinels: parsed.sentinels, name: parsed.name });
    described.set(client, `sentinel master ${parsed.name} via ${parsed.sentinels.map(formatNode).join(',')}`);
  } else {
    client = new Redis(parsed.url, merged);
  }
  return client;
}

/**
 * Options for a connection whose callers must never hang while Redis is away (the gateway's command connections): a
 * command queued during a reconnect fails after one retry, and no command waits longer than `commandTimeout` for its
 * reply (a host that vanished without closing the socket), so a request gets a clear error within ~2 s. Reconnects
 * back off to at most 1 s, so service resumes within a second of Redis returning. Not for blocking commands or
 * subscribers.
 */
export const FAIL_FAST_REDIS_OPTIONS = {
  maxRetriesPerRequest: 1,
  commandTimeout: 2_000,
  retryStrategy: (times: number) => Math.min(times * 50, 1_000),
} as const satisfies RedisOptions;

const UNAVAILABLE_ERRNOS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
]);

const UNAVAILABLE_MESSAGES = [
  /^Command timed out/, // commandTimeout
  /^Connection is closed/, // ioredis and BullMQ, after a disconnect or once reconnecting gave up
  /^Stream isn't writeable/, // enableOfflineQueue: false
  /^Reached the max retries per request limit/, // MaxRetriesPerRequestError
  /^(LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN) /, // a server that is up but cannot serve yet
  // A cluster in a failover (PROTOCOL.md §10.7): slots moving (MOVED/ASK past ioredis's redirections), a demoted master
  // refusing writes, a node dropped from the slot map while a command waited for it.
  /^Too many Cluster redirections/,
  /^(MOVED|ASK) \d+ /,
  /^READONLY /,
  /^UNBLOCKED /, // a blocked client released by a master's demotion
  /^Cluster is disconnect(ed|ing)/,
  /^Node is disconnected/,
  /^Connection is aborted/,
  /^Cluster isn't ready/,
  /^Failed to refresh slots cache/, // a cluster none of whose nodes answers
  /^None of (the )?startup nodes is available/,
  /^All sentinels are unreachable/,
];

/**
 * True when `error` (or any error in its `cause` chain, or in an AggregateError) means Redis could not be reached or
 * did not answer, as opposed to an error Redis answered with: what the gateway reports as "task store unavailable".
 */
export function isRedisUnavailableError(error: unknown): boolean {
  const seen = new Set<unknown>();
  const pending: unknown[] = [error];
  while (pending.length > 0 && seen.size < 16) {
    const e = pending.pop();
    if (e === null || typeof e !== 'object' || seen.has(e)) continue;
    seen.add(e);
    if (e instanceof TaskrelayError && e.code === 'REDIS_UNAVAILABLE') return true;
    const { name, code, message, cause, errors } = e as {
      name?: unknown;
      code?: unknown;
      message?: unknown;
      cause?: unknown;
      errors?: unknown;
    };
    if (name === 'MaxRetriesPerRequestError' || name === 'ClusterAllFailedError') return true;
    if (typeof code === 'string' && UNAVAILABLE_ERRNOS.has(code)) return true;
    if (typeof message === 'string' && UNAVAILABLE_MESSAGES.some((pattern) => pattern.test(message))) return true;
    pending.push(cause);
    if (Array.isArray(errors)) pending.push(...(errors as unknown[]));
  }
  return false;
}

/**
 * Waits until the client is ready, or fails with one clear line (used at start: an entry point must not hang or print
 * a stack when Redis is unreachable).
 */
export async function waitForRedis(client: RedisClient, timeoutMs = 5_000): Promise<void> {
  if (client.status === 'ready') return;
  let lastError: unknown;
  const onError = (error: unknown) => {
    lastError = error;
  };
  client.on('error', onError);
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        client.off('ready', onReady);
        const cause = lastError instanceof Error ? `: ${lastError.message}` : '';
        reject(new TaskrelayError('REDIS_UNAVAILABLE', `Redis is unreachable at ${describe(client)}${cause}`));
      }, timeoutMs);
      const onReady = () => {
        clearTimeout(timer);
        resolve();
      };
      client.once('ready', onReady);
    });
  } finally {
    client.off('error', onError);
  }
}

function describe(client: RedisClient): string {
  const known = described.get(client);
  if (known || client instanceof Cluster) return known ?? 'a Redis Cluster';
  const { host, port } = client.options;
  return `${host ?? '127.0.0.1'}:${port ?? 6379}`;
}

import { createHash } from 'node:crypto';
import { bullJobLockKey, bullQueueKey } from './bullmq-layout.js';

/**
 * Every Redis key and channel name taskrelay uses. No other file builds a key string; the Lua scripts receive the
 * prefixes they append ids to from here.
 * With a `{...}` prefix every key hashes to one Redis Cluster slot, which the Lua scripts and BullMQ need.
 */
export interface Keys {
  readonly prefix: string;
  /** Which layout these keys are of (PROTOCOL.md §1.1). */
  readonly layout: KeyLayout;
  /**
   * The keys of the shard a task id names (PROTOCOL.md §1.1): in the sharded layout every key of the task, and the
   * per-shard keys its scripts touch with it, are under the id's `{code}`; in the single layout this object itself.
   */
  forTask(taskId: string): Keys;
  /** The keys of one tool shard by its code; in the single layout this object itself. */
  forShard(code: string): Keys;
  /** The shard code a task id carries, or undefined (the single layout, or an id naming no shard). */
  shardOf(taskId: string): string | undefined;
  /** Hash: `<queue>~<tool>#<i>` → the code of that tool's shard `i`, written once (home key, PROTOCOL.md §1.1). */
  readonly placement: string;
  /** String: the short lease one process holds while it places a shard. */
  readonly placementLease: string;
  /** Hash holding one task record. */
  task(taskId: string): string;
  /** What `task(id)` puts before the id (the reaper script appends ids to it). */
  readonly taskKeyPrefix: string;
  /** String: a task-mode task's arguments (JSON), kept as long as its hash, for a replay (PROTOCOL.md §30.2). */
  taskArguments(taskId: string): string;
  /** Stream: a task's kept log lines (PROTOCOL.md §30.4), expiring with its hash. */
  taskLogs(taskId: string): string;
  /** Sorted set of one principal's task-mode ids, scored by creation time. */
  principalTasks(principal: string): string;
  /** Sorted set of every non-terminal task, scored by when the reaper next looks at it (PROTOCOL.md §10). */
  readonly live: string;
  /** Sorted set of every task-mode task id, scored by creation time: what operators search (PROTOCOL.md §30.2). */
  readonly taskIndex: string;
  /** List: operators' actions (JSON, newest first, bounded), shown on the dashboard (PROTOCOL.md §30.5). */
  readonly audit: string;
  /**
   * String: one dashboard login (JSON, expiring with it), under the SHA-256 of its cookie, so what Redis holds does
   * not open the dashboard (docs/OPERATIONS.md).
   */
  adminSession(cookieDigest: string): string;
  /** Hash: the deployment's retention policy, ending status → how long a task stays after it (PROTOCOL.md §30.1). */
  readonly retention: string;
  /** String: the lease that lets one gateway at a time run the reaper. */
  readonly reaperLease: string;
  /** String: the random key that signs MRTR `requestState` when no secret is configured (PROTOCOL.md §17.2). */
  readonly requestStateKey: string;
  /** String: the random key waitpoint tokens are sealed with when no secret is configured (PROTOCOL.md §32.2). */
  readonly waitpointKey: string;
  /** String: the gateways' public base URL, which workers put in front of a waitpoint's token (PROTOCOL.md §32.2). */
  readonly publicUrl: string;
  /** String: the task id one principal's idempotency key stands for. */
  idempotency(principal: string, key: string): string;
  /** Sorted set of live worker ids, scored by heartbeat expiry (ms since epoch). */
  readonly workers: string;
  /** String holding one worker's tool catalog (JSON). */
  workerCatalog(workerId: string): string;
  /**
   * Hash: pool → its last seen catalog (`PoolCatalog` JSON), written by every heartbeat and kept after the pool's last
   * worker has gone, so its tools stay listed for the gateway's catalog retention (PROTOCOL.md §24).
   */
  readonly pools: string;
  /**
   * Hash: generation of the task-store scripts (`scriptsGeneration`) → when a gateway of it last started (ms), so a
   * worker in another language can tell whether it runs the deployment's scripts (PROTOCOL.md §29.2).
   */
  readonly protocol: string;
  /**
   * Channel: progress, status and acks for the tasks one gateway routes or waits on. In the sharded layout one per
   * gateway per shard (`P:{<code>}:gateway:<id>:events`, a sharded pub/sub channel in the slot of the scripts that
   * publish on it), and the home one (`P:{home}:…`) for the acks other gateways send (PROTOCOL.md §1.2).
   */
  gatewayChannel(gatewayId: string): string;
  /** What `gatewayChannel(id)` puts before the id (the Lua scripts append the gateway id and the suffix). */
  readonly gatewayChannelPrefix: string;
  /** What `gatewayChannel(id)` puts after the id. */
  readonly gatewayChannelSuffix: string;
  /** Hash `{max, bytes}`: what tool messages waiting for the gateway on its channel may add up to, and do (§22.4). */
  gatewayBacklog(gatewayId: string): string;
  /** What `gatewayBacklog(id)` puts before the id (the Lua scripts append the gateway id and the suffix). */
  readonly gatewayBacklogPrefix: string;
  /** What `gatewayBacklog(id)` puts after the id. */
  readonly gatewayBacklogSuffix: string;
  /**
   * Channel: cancel wake-ups for workers. In the sharded layout one per tool shard (`P:{<code>}:cancel`, a sharded
   * pub/sub channel in the shard's slot), so a cancel reaches only the workers of the task's tool (PROTOCOL.md §1.2).
   */
  readonly cancelChannel: string;
  /** BullMQ `prefix` option. */
  readonly bullPrefix: string;
  /** BullMQ queue name for a worker pool. */
  queueName(queue: string): string;
  /** BullMQ's key of one queue: `bullQueueKeyPrefix + queue`; its job hash is `<that>:<jobId>`. */
  readonly bullQueueKeyPrefix: string;
  /** BullMQ's lock key of one job, whose value is the token of the worker holding it. */
  bullJobLock(queue: string, jobId: string): string;
  /** Sorted set of a principal's possibly non-terminal task ids (the open-task cap), scored by creation time. */
  principalOpenTasks(principal: string): string;
  /** Key prefix of the per-principal rate-limit counters of one limit (`calls`, `task-ops`). */
  rateLimitPrefix(limit: string): string;
  /** The completion-webhook outbox (PROTOCOL.md §27). */
  readonly webhooks: WebhookKeys;
  /**
   * Sorted set of one principal's jobs waiting in one pool, not yet started, scored by their BullMQ priority: the
   * fair-share state (PROTOCOL.md §25).
   */
  /** A call's dedupe key (§25.2): per principal, mode and tool, the digest of its deduped arguments → task id. */
  dedupe(principal: string, mode: string, tool: string, digest: string): string;
  fairShare(queue: string, principal: string): string;
  /** Hash: one schedule (PROTOCOL.md §33.2): its definition (JSON) and its run state, field by field. */
  schedule(scheduleId: string): string;
  /** Sorted set: every schedule id, scored by its creation (ms). */
  readonly scheduleIndex: string;
  /** BullMQ queue name of the schedules' firings (its job schedulers and the jobs they fire, §33.2). */
  readonly firingsQueue: string;
  /** String: when a run first deferred a task to a worker of its recorded tool version (PROTOCOL.md §12.11). */
  versionWait(taskId: string): string;
  /**
   * A worker-admitted limit's keys (PROTOCOL.md §3.5): `slots`/`waiting` of a per-key concurrency limit of a tool,
   * `starts`/`hold` of a rate limit (per key, or shared by its `name`). `keyDigest` is the key's value hashed.
   */
  toolLimit(kind: 'slots' | 'rate', scope: string, keyDigest: string): { a: string; b: string };
  /** Hash: the principal of each waiter of a per-key concurrency limit shared across principals (§3.5). */
  slotWaitersBy(scope: string, keyDigest: string): string;
  /** The keys of one batch, a parent task's fan-out (PROTOCOL.md §26). */
  batch(taskId: string): BatchKeys;
  /**
   * String: a batch child's outcome as its run claimed it on the child's own shard, the first of its two record steps
   * in the sharded layout (PROTOCOL.md §26.10); deleted once the parent's shard counted it.
   */
  batchClaim(childId: string): string;
  /** The keys of one task's output and stored values (PROTOCOL.md §34). */
  output(taskId: string): OutputKeys;
  /** String counter: bytes one principal stored as task blobs within the blob TTL (PROTOCOL.md §34.4). */
  principalBlobBytes(principal: string): string;
  /**
   * Channel: wake-ups naming a task whose output changed (PROTOCOL.md §34.5); every gateway subscribes. In the sharded
   * layout one per shard (`P:{<code>}:resources`), published by the scripts of that shard's tasks (§1.2).
   */
  readonly resourcesChannel: string;
}

/** Keys of one task's output and stored values (PROTOCOL.md §34). */
export interface OutputKeys {
  /** String: the partial output (`ctx.output`). */
  readonly text: string;
  /** Hash: blob id → its description (JSON), and the running total of the task's stored bytes. */
  readonly blobs: string;
  /** String: one stored value (a result moved out, an artifact). */
  blob(blobId: string): string;
}

/** Keys of one batch (PROTOCOL.md §26.2). */
export interface BatchKeys {
  /** Hash: the batch's shape and counters (`BATCH_FIELDS`). */
  readonly hash: string;
  /** List: each child's arguments (JSON), by index. */
  readonly items: string;
  /** Hash: child index → its outcome (JSON), written once per child. */
  readonly outcomes: string;
  /** Set: indices released (their jobs added) and not yet recorded. */
  readonly open: string;
  /** Set: indices whose child is running on some worker now. */
  readonly running: string;
}

/** Keys of the completion-webhook outbox (PROTOCOL.md §27.2). */
export interface WebhookKeys {
  /** Hash of one event not yet settled. */
  event(eventId: string): string;
  /** What `event(id)` puts before the id (the Lua scripts append event ids to it). */
  readonly eventPrefix: string;
  /** Sorted set: event id → when it may be claimed next (ms, Redis server time). */
  readonly due: string;
  /** Hash: principal → events of that principal not yet settled. */
  readonly pending: string;
  /** List of the newest dead letters (JSON). */
  readonly dead: string;
}

/**
 * The two key layouts (PROTOCOL.md §1.1): `single` puts every key under the prefix as it is (one slot when it is
 * braced); `sharded` puts the deployment-wide keys under `<prefix>:{home}` and each tool shard's under
 * `<prefix>:{<code>}`.
 */
export type KeyLayout = 'single' | 'sharded';

/** The hash tag of the sharded layout's deployment-wide keys: not 4 hex digits, so no shard code. */
export const HOME_TAG = 'home';
/** A shard code: 4 hex digits, which a sharded task id starts with. */
const SHARD_CODE = /^[0-9a-f]{4}$/;
export const SHARD_CODE_LENGTH = 4;

export function isShardCode(code: string): boolean {
  return SHARD_CODE.test(code);
}

/** The shard code a task id (or a batch child's `<parent>.<index>`) of the sharded layout starts with, if any. */
export function shardOfTaskId(taskId: string): string | undefined {
  const code = taskId.slice(0, SHARD_CODE_LENGTH);
  return taskId.length > SHARD_CODE_LENGTH && SHARD_CODE.test(code) ? code : undefined;
}

/**
 * The shard code of a BullMQ prefix of the sharded layout (`<prefix>:{<code>}`), or undefined: how a worker knows the
 * shard of a job it took, whose id may name another (a batch child's names its parent's, PROTOCOL.md §26.10).
 */
export function shardOfBullPrefix(bullPrefix: string): string | undefined {
  const match = /:\{([0-9a-f]{4})\}$/.exec(bullPrefix);
  return match?.[1];
}

/** The keys that stay deployment-wide in the sharded layout: what no task script touches (PROTOCOL.md §1.1). */
const HOME_ONLY = [
  'audit',
  'requestStateKey',
  'waitpointKey',
  'publicUrl',
  'workers',
  'workerCatalog',
  'pools',
  'protocol',
  'rateLimitPrefix',
  'toolLimit',
  'schedule',
  'scheduleIndex',
  'firingsQueue',
  'placement',
  'placementLease',
] as const satisfies ReadonlyArray<keyof Keys>;

export function createKeys(prefix = 'taskrelay', layout: KeyLayout = 'single'): Keys {
  if (layout === 'single') {
    const keys: Keys = {
      ...layoutKeys(prefix),
      layout,
      forTask: () => keys,
      forShard: () => keys,
      shardOf: () => undefined,
    };
    return keys;
  }
  const home = layoutKeys(`${prefix}:{${HOME_TAG}}`);
  const homeOnly = Object.fromEntries(HOME_ONLY.map((name) => [name, home[name]])) as Pick<
    Keys,
    (typeof HOME_ONLY)[number]
  >;
  const shards = new Map<string, Keys>();
  const shardOf = (taskId: string) => shardOfTaskId(taskId);
  const forShard = (code: string): Keys => {
    let keys = shards.get(code);
    if (keys === undefined) {
      keys = { ...layoutKeys(`${prefix}:{${code}}`), ...homeOnly, layout, forTask, forShard, shardOf };
      shards.set(code, keys);
    }
    return keys;
  };
  // An id naming no shard gets the home keys: its task is simply not found there.
  const forTask = (taskId: string): Keys => {
    const code = shardOfTaskId(taskId);
    return code === undefined ? base : forShard(code);
  };
  const base: Keys = { ...home, prefix, layout, forTask, forShard, shardOf };
  return base;
}

type LayoutKeys = Omit<Keys, 'layout' | 'forTask' | 'forShard' | 'shardOf'>;

function layoutKeys(prefix: string): LayoutKeys {
  const gatewayChannelPrefix = `${prefix}:gateway:`;
  const gatewayChannelSuffix = ':events';
  const taskKeyPrefix = `${prefix}:task:`;
  const queueName = (queue: string) => `q-${queue}`;
  // BullMQ's own layout lives in bullmq-layout.ts; a pool's queue key is `<that prefix><pool>`.
  const bullQueueKeyPrefix = bullQueueKey(prefix, queueName(''));
  return {
    prefix,
    task: (taskId) => `${taskKeyPrefix}${taskId}`,
    // Not under `<prefix>:task:`, where every key is a task hash. The `finish` include expires both with the hash and
    // names them from it the same way (`<prefix>:task:<id>` → `<prefix>:task-args:<id>`, `…:task-logs:<id>`).
    taskArguments: (taskId) => `${prefix}:task-args:${taskId}`,
    taskLogs: (taskId) => `${prefix}:task-logs:${taskId}`,
    taskKeyPrefix,
    principalTasks: (principal) => `${prefix}:principal:${encodeURIComponent(principal)}:tasks`,
    live: `${prefix}:live`,
    taskIndex: `${prefix}:index:tasks`,
    retention: `${prefix}:config:retention`,
    audit: `${prefix}:audit`,
    adminSession: (cookieDigest) => `${prefix}:admin-session:${cookieDigest}`,
    reaperLease: `${prefix}:reaper:lease`,
    requestStateKey: `${prefix}:request-state-key`,
    waitpointKey: `${prefix}:waitpoint-key`,
    publicUrl: `${prefix}:config:public-url`,
    idempotency: (principal, key) => `${prefix}:idem:${encodeURIComponent(principal)}:${encodeURIComponent(key)}`,
    dedupe: (principal, mode, tool, digest) =>
      `${prefix}:dedupe:${encodeURIComponent(principal)}:${mode}:${encodeURIComponent(tool)}:${digest}`,
    workers: `${prefix}:workers`,
    workerCatalog: (workerId) => `${prefix}:worker:${workerId}:catalog`,
    pools: `${prefix}:pools`,
    protocol: `${prefix}:protocol`,
    gatewayChannelPrefix,
    gatewayChannelSuffix,
    gatewayChannel: (gatewayId) => `${gatewayChannelPrefix}${gatewayId}${gatewayChannelSuffix}`,
    gatewayBacklogPrefix: `${prefix}:gateway:`,
    gatewayBacklogSuffix: ':backlog',
    gatewayBacklog: (gatewayId) => `${prefix}:gateway:${gatewayId}:backlog`,
    cancelChannel: `${prefix}:cancel`,
    bullPrefix: prefix,
    queueName,
    bullQueueKeyPrefix,
    bullJobLock: (queue, jobId) => bullJobLockKey(bullQueueKey(prefix, queueName(queue)), jobId),
    principalOpenTasks: (principal) => `${prefix}:principal:${encodeURIComponent(principal)}:open`,
    rateLimitPrefix: (limit) => `${prefix}:ratelimit:${limit}`,
    toolLimit: (kind, scope, keyDigest) => {
      const base = `${prefix}:limit:${kind}:${encodeURIComponent(scope)}:${keyDigest}`;
      return kind === 'slots' ? { a: base, b: `${base}:waiting` } : { a: base, b: `${base}:hold` };
    },
    slotWaitersBy: (scope, keyDigest) => `${prefix}:limit:slots:${encodeURIComponent(scope)}:${keyDigest}:waiting:by`,
    webhooks: {
      event: (eventId) => `${prefix}:webhook:${eventId}`,
      eventPrefix: `${prefix}:webhook:`,
      due: `${prefix}:webhooks:due`,
      pending: `${prefix}:webhooks:pending`,
      dead: `${prefix}:webhooks:dead`,
    },
    versionWait: (taskId) => `${prefix}:version-wait:${taskId}`,
    schedule: (scheduleId) => `${prefix}:schedule:${scheduleId}`,
    scheduleIndex: `${prefix}:schedule-index`,
    // Not `q-…`: no pool has this queue, so the pools' views never list it.
    firingsQueue: 'firings',
    fairShare: (queue, principal) => `${prefix}:fair:${queue}:${encodeURIComponent(principal)}`,
    batch: (taskId) => ({
      hash: `${prefix}:batch:${taskId}`,
      items: `${prefix}:batch:${taskId}:items`,
      outcomes: `${prefix}:batch:${taskId}:outcomes`,
      open: `${prefix}:batch:${taskId}:open`,
      running: `${prefix}:batch:${taskId}:running`,
    }),
    batchClaim: (childId) => `${prefix}:batch-claim:${childId}`,
    output: (taskId) => ({
      text: `${prefix}:output:${taskId}`,
      blobs: `${prefix}:blobs:${taskId}`,
      blob: (blobId) => `${prefix}:blob:${taskId}:${blobId}`,
    }),
    principalBlobBytes: (principal) => `${prefix}:principal:${encodeURIComponent(principal)}:blob-bytes`,
    resourcesChannel: `${prefix}:resources`,
    placement: `${prefix}:placement`,
    placementLease: `${prefix}:placement:lease`,
  };
}

/**
 * The pool a worker belongs to in the catalog (PROTOCOL.md §3.2, §24): its configured queue name plus a digest of the
 * sorted names of the tools it serves. A pool is what the catalog remembers and retires, never where work queues: jobs
 * go to the queue of their tool (`toolQueue`). The tools' names and, where given, their versions (§12.11, `name@version`):
 * a deploy that changes a tool's version starts a new pool, so the old one is remembered apart while tasks that last
 * ran its version wait (§24.9); a new pool of the same queue name sharing a tool supersedes it in `tools/list`.
 */
export function toolPool(queue: string, tools: ReadonlyArray<string | { name: string; version?: string }>): string {
  const entries = tools.map((t) => (typeof t === 'string' ? t : t.version ? `${t.name}@${t.version}` : t.name));
  const digest = createHash('sha256')
    .update([...new Set(entries)].sort().join('\n'))
    .digest('hex')
    .slice(0, 12);
  return `${queue}.${digest}`;
}

/** Our name of a queue from its BullMQ name (`Keys.queueName` adds `q-`): what a job's `queueName` says. */
export function queueOfBullName(bullQueueName: string): string {
  return bullQueueName.startsWith('q-') ? bullQueueName.slice(2) : bullQueueName;
}

/**
 * The BullMQ queue of one tool (PROTOCOL.md §3.2): the unit of queueing. Every worker that serves the tool under the
 * same `TASKRELAY_QUEUE` consumes it, whatever else it serves, so a call, a batch child, a hand-back, a takeover and a
 * resume all go to any live worker of the tool; BullMQ's per-queue pause, global concurrency and rate limit then act
 * on one tool. `~` is in neither a queue name nor a tool name (both `[A-Za-z0-9_.-]`), so the pair is unambiguous.
 */
export function toolQueue(queueName: string, tool: string): string {
  return `${queueName}~${tool}`;
}

/** The tool and `TASKRELAY_QUEUE` of a tool queue, or undefined for any other name (an old pool's). */
export function parseToolQueue(queue: string): { queueName: string; tool: string } | undefined {
  const at = queue.indexOf('~');
  if (at <= 0 || at === queue.length - 1) return undefined;
  return { queueName: queue.slice(0, at), tool: queue.slice(at + 1) };
}

/** The placement registry's field of one shard of a tool queue (PROTOCOL.md §1.1). */
export function placementField(queue: string, index: number): string {
  return `${queue}#${index}`;
}

/** A batch child's job id (PROTOCOL.md §26): `<parent task id>.<index>`. Task ids are hex, so the dot is unambiguous. */
export function batchChildId(parentId: string, index: number): string {
  return `${parentId}.${index}`;
}

/** The parent and index of a batch child's job id, or undefined for any other id. */
export function parseBatchChildId(jobId: string): { parentId: string; index: number } | undefined {
  const dot = jobId.lastIndexOf('.');
  if (dot <= 0) return undefined;
  const index = Number(jobId.slice(dot + 1));
  if (!Number.isSafeInteger(index) || index < 0 || String(index) !== jobId.slice(dot + 1)) return undefined;
  return { parentId: jobId.slice(0, dot), index };
}

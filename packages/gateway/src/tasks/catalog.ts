/**
 * The tool catalog, read from the workers' heartbeats (PROTOCOL.md §3): the tools of live workers, and those of pools
 * whose last worker left within the retention (§24), so a pool can scale to zero and back. The gateway never imports
 * tool code: what it knows of a tool is what a worker published.
 */
import {
  PoolCatalogSchema,
  type RedisClient,
  WorkerCatalogSchema,
  catalogQueueName,
  toolQueue,
  controlsWaitReason,
  readToolControls,
  type ToolControls,
  parseMessage,
  type Keys,
  type Logger,
  type PoolCatalog,
  type TaskRecord,
  type ToolDescriptor,
} from '@taskrelay/shared';
import { JsonSchemaValidator, type ErrorObject, type ValidateFunction } from './json-schema.js';

export interface CatalogTool extends ToolDescriptor {
  /**
   * The worker pool (BullMQ queue) this call goes to: one whose live workers serve the tool (PROTOCOL.md §3.2). When
   * several pools serve it, `find` picks one per call, weighted by their live workers.
   */
  queue: string;
  /** True while an operator has paused the tool (every queue of it, PROTOCOL.md §3.3). */
  paused: boolean;
}

/** A tool is paused when every queue it is listed with is (PROTOCOL.md §3.3). */
function isPaused(snapshot: CatalogSnapshot | undefined, queues: readonly string[]): boolean {
  return snapshot !== undefined && queues.length > 0 && queues.every((q) => snapshot.controls.get(q)?.paused === true);
}

/** One read of the catalogs. */
interface CatalogSnapshot {
  at: number;
  /**
   * Tool name → its newest descriptor and one pool entry per live worker serving it; for a tool no live worker
   * serves, the retained pool that served it last (`live: false`).
   */
  tools: Map<string, { descriptor: ToolDescriptor; queues: string[]; live: boolean }>;
  /** Pools with at least one live worker. */
  pools: Set<string>;
  /** The tool queues (§3.2) some live worker consumes. */
  queues: Set<string>;
  /** Each listed queue's controls (paused, limits, active runs), read with the catalog (§3.3). */
  controls: Map<string, ToolControls>;
}

export interface ToolCatalogOptions {
  /** The gateway's JSON Schema validator (shared with the answer check). Default: one of its own. */
  jsonSchemas?: JsonSchemaValidator;
  /** How long a read of the catalogs is reused. Default 1000 ms. */
  cacheMs?: number;
  /**
   * How long a pool's tools stay listed, and their calls accepted and queued, after its last worker has gone
   * (PROTOCOL.md §24). `0`: a tool goes with its last worker. Default 86400000 (24 h).
   */
  retentionMs?: number;
  /**
   * The tool versions live tasks last ran (PROTOCOL.md §24.9; `TaskStore.liveToolVersions`): a remembered pool
   * that published one is kept, past its retention and when superseded, while such tasks wait. Read once per
   * housekeeping round. Default: none kept.
   */
  versionsInUse?: () => Promise<ReadonlyArray<ToolVersion>>;
  /**
   * In the sharded layout, the placed shard codes of tool queues (`ShardPlacement.placedMany`): a tool's controls are
   * then read on every shard of its queue and summed (PROTOCOL.md §3.3). Default: the home queue's.
   */
  shardsOf?: (queues: readonly string[]) => Promise<ReadonlyMap<string, readonly string[]>>;
}

/** A tool at one version. */
export interface ToolVersion {
  tool: string;
  version: string;
}

/** Most live tasks a housekeeping round reads for their versions (oldest first: the ones waiting longest). */
export const VERSION_SCAN_LIMIT = 10_000;

/** How old a snapshot may be for a tool it does not list: a call for a tool a worker just started is found. */
const MISS_FRESH_MS = 50;

/** How often a gateway deletes pools past the retention from `P:pools` (and reads the versions in use). */
const PRUNE_EVERY_MS = 60_000;

/** The versions of `pool`'s tools that live tasks last ran: while there is one, the pool is kept (§24.9). */
export function versionsKeeping(pool: PoolCatalog, inUse: ReadonlyArray<ToolVersion>): ToolVersion[] {
  return pool.tools
    .filter((t) => t.version !== undefined && inUse.some((u) => u.tool === t.name && u.version === t.version))
    .map((t) => ({ tool: t.name, version: t.version ?? '' }));
}

/** What `retirePool` did. */
export type RetireOutcome = 'retired' | 'unknown' | 'live' | 'kept';

/**
 * Forgets a pool at once, before its retention ends (an operator's `pools-main.js retire <pool>`): its tools leave
 * `tools/list` and new calls for them get `Unknown tool` once no other pool serves them. A pool with live workers is
 * not retired (their next heartbeat would list it again): stop them first. Nor is one whose tool versions live tasks
 * last ran (`kept`, §24.9), unless `force`.
 */
export async function retirePool(
  redis: RedisClient,
  keys: Keys,
  pool: string,
  options: { inUse?: ReadonlyArray<ToolVersion>; force?: boolean } = {},
): Promise<RetireOutcome> {
  const workerIds = await redis.zrangebyscore(keys.workers, Date.now(), '+inf');
  const raws = workerIds.length > 0 ? await redis.mget(workerIds.map((id) => keys.workerCatalog(id))) : [];
  const live = raws.some((raw) => raw !== null && parseMessage(WorkerCatalogSchema, raw)?.queue === pool);
  if (live) return 'live';
  if (options.force !== true && options.inUse !== undefined) {
    const raw = await redis.hget(keys.pools, pool);
    const remembered = raw === null ? undefined : parseMessage(PoolCatalogSchema, raw);
    if (remembered && versionsKeeping(remembered, options.inUse).length > 0) return 'kept';
  }
  return (await redis.hdel(keys.pools, pool)) === 1 ? 'retired' : 'unknown';
}

/**
 * How a waiting task's message starts when the run it had is gone: handed back by its worker (the worker's
 * `HANDED_BACK_MESSAGE`, PROTOCOL.md §5.7) or lost with it (`orphanedReason`). The dashboard shows that state instead of
 * the last run's progress bar.
 */
export const RESUME_WAIT_PREFIX = 'Waiting to be resumed';

/**
 * A task as every read shows it: one no worker has started whose queue no live worker consumes, or that its tool's
 * controls hold back (paused, at its limit), says why in its `statusMessage` (PROTOCOL.md §3.2, §3.3), where it would
 * otherwise wait silently until the queue timeout; one that has run, whose queue no live worker consumes now, says its
 * run is gone instead of its stale progress. The stored record is unchanged; the same record comes back when
 * there is nothing to say. `tasks/get`, `subscriptions/listen` and the operator's pages all read tasks through this.
 */
export async function withWaitingReason(
  record: TaskRecord,
  catalog: Pick<ToolCatalog, 'unservedReason' | 'orphanedReason'>,
): Promise<TaskRecord> {
  if (record.status !== 'working') return record;
  if (record.attempt !== undefined) {
    // A task that ran, whose queue no live worker consumes now (its worker died or was stopped): its last run's
    // progress message is stale, so it says what it waits for instead (issue 48 P2).
    const orphaned = await catalog.orphanedReason(record.tool, record.queue).catch(() => undefined);
    return orphaned === undefined ? record : { ...record, statusMessage: orphaned };
  }
  if (record.statusMessage !== undefined) return record;
  const reason = await catalog.unservedReason(record.tool, record.queue).catch(() => undefined);
  return reason === undefined ? record : { ...record, statusMessage: reason };
}

/** The pools `P:pools` remembers, newest first (for an operator's listing). */
export async function rememberedPools(redis: RedisClient, keys: Keys): Promise<PoolCatalog[]> {
  const raws = Object.values(await redis.hgetall(keys.pools));
  return raws
    .map((raw) => parseMessage(PoolCatalogSchema, raw))
    .filter((p) => p !== undefined)
    .sort((a, b) => b.lastSeenAt - a.lastSeenAt);
}

export class ToolCatalog {
  private cached: CatalogSnapshot | undefined;
  private inflight: Promise<CatalogSnapshot> | undefined;
  /** Tools and pools seen served before: one warning when the last worker serving one goes. */
  private readonly served = new Set<string>();
  private readonly servedPools = new Set<string>();
  private readonly validators = new Map<string, { schemaJson: string; validate: ValidateFunction | undefined }>();
  private readonly jsonSchemas: JsonSchemaValidator;

  private readonly cacheMs: number;
  private readonly retentionMs: number;
  private readonly versionsInUse: (() => Promise<ReadonlyArray<ToolVersion>>) | undefined;
  private readonly shardsOf: ToolCatalogOptions['shardsOf'];
  /** The versions live tasks last ran, as of the last housekeeping round. */
  private inUse: ReadonlyArray<ToolVersion> = [];
  private prunedAt = 0;

  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
    private readonly log: Logger,
    options: ToolCatalogOptions = {},
  ) {
    this.cacheMs = options.cacheMs ?? 1000;
    this.retentionMs = options.retentionMs ?? 86_400_000;
    this.jsonSchemas = options.jsonSchemas ?? new JsonSchemaValidator(log);
    this.versionsInUse = options.versionsInUse;
    this.shardsOf = options.shardsOf;
  }

  async list(): Promise<CatalogTool[]> {
    const snapshot = await this.load();
    return [...snapshot.tools.values()].map(({ descriptor, queues }) => ({
      ...descriptor,
      queue: queues[0] ?? '',
      paused: isPaused(snapshot, queues),
    }));
  }

  /**
   * The tool, with the pool this call goes to; undefined when no live worker serves it and no pool did within the
   * retention.
   */
  async find(name: string): Promise<CatalogTool | undefined> {
    let snapshot = await this.load();
    // A miss looks again unless the snapshot is fresh (MISS_FRESH_MS): a worker that started since the cached read is
    // served at once, not up to `cacheMs` later, while unknown names cost Redis at most one read per MISS_FRESH_MS.
    if (!snapshot.tools.has(name)) snapshot = await this.load(MISS_FRESH_MS);
    const entry = snapshot.tools.get(name);
    if (!entry) return undefined;
    const queue = entry.queues[Math.floor(Math.random() * entry.queues.length)] ?? '';
    return { ...entry.descriptor, queue, paused: isPaused(snapshot, entry.queues) };
  }

  /**
   * Why a task that no worker has started yet may wait for ever, or undefined when a live worker of its pool serves
   * it: what `tasks/get` shows as its `statusMessage` (PROTOCOL.md §3.2).
   */
  async unservedReason(tool: string, queue: string): Promise<string | undefined> {
    const snapshot = await this.load();
    if (snapshot.queues.has(queue)) return controlsWaitReason(tool, snapshot.controls.get(queue));
    return snapshot.tools.get(tool)?.live
      ? `Waiting: no live worker consumes queue ${queue}, where this task was queued (tool ${tool} is served under another TASKRELAY_QUEUE now)`
      : `Waiting: no live worker serves tool ${tool}; the task runs once one starts`;
  }

  /**
   * Why a task that has run waits, when no live worker consumes its queue: its run is gone (PROTOCOL.md §5.7). Not the
   * tool's controls: a run in flight goes on whatever they say.
   */
  async orphanedReason(tool: string, queue: string): Promise<string | undefined> {
    const snapshot = await this.load();
    if (snapshot.queues.has(queue)) return undefined;
    return `${RESUME_WAIT_PREFIX}: no live worker serves tool ${tool}; its last run's progress is stale, and the task runs again once a worker starts`;
  }

  /**
   * Validates arguments against the tool's published JSON Schema. Returns undefined when they match, else a message
   * naming the field (docs/MCP.md: the caller gets it as an `isError` tool result, SEP-1303).
   */
  validate(tool: CatalogTool, args: Record<string, unknown>): string | undefined {
    const schemaJson = JSON.stringify(tool.inputSchema);
    let entry = this.validators.get(tool.name);
    if (entry?.schemaJson !== schemaJson) {
      entry = { schemaJson, validate: this.compile(tool) };
      this.validators.set(tool.name, entry);
    }
    // A schema Ajv cannot compile is checked by the worker alone (its zod schema), not refused here.
    if (!entry.validate || entry.validate(args)) return undefined;
    return `Invalid arguments for tool ${tool.name}: ${describeAjvError(entry.validate.errors?.[0])}`;
  }

  private compile(tool: CatalogTool): ValidateFunction | undefined {
    const validate = this.jsonSchemas.compile(tool.inputSchema);
    if (!validate) {
      this.log.warn(
        { tool: tool.name },
        'tool input schema does not compile; its arguments are checked by the worker only',
      );
    }
    return validate;
  }

  /** The cached snapshot when younger than `maxAgeMs`, else a read (one at a time). */
  private async load(maxAgeMs = this.cacheMs): Promise<CatalogSnapshot> {
    if (this.cached && Date.now() - this.cached.at < maxAgeMs) return this.cached;
    this.inflight ??= this.read().finally(() => {
      this.inflight = undefined;
    });
    return this.inflight;
  }

  private async read(): Promise<CatalogSnapshot> {
    const now = Date.now();
    const housekeeping = this.retentionMs > 0 && now - this.prunedAt >= PRUNE_EVERY_MS;
    if (housekeeping && this.versionsInUse) {
      // A failed read keeps the last answer: a pool kept a minute longer costs nothing, one forgotten early strands.
      this.inUse = await this.versionsInUse().catch((error: unknown) => {
        this.log.debug({ err: error }, 'could not read the tool versions live tasks last ran');
        return this.inUse;
      });
    }
    const [workerIds, remembered] = await Promise.all([
      this.redis.zrangebyscore(this.keys.workers, now, '+inf'),
      this.retentionMs > 0 ? this.redis.hgetall(this.keys.pools) : Promise.resolve({}),
    ]);
    const raws = workerIds.length > 0 ? await this.redis.mget(workerIds.map((id) => this.keys.workerCatalog(id))) : [];
    const catalogs = raws
      .map((raw) => (raw ? parseMessage(WorkerCatalogSchema, raw) : undefined))
      .filter((c) => c !== undefined)
      // Newest heartbeat last, so during a rolling deploy the newest definition of a tool wins.
      .sort((a, b) => a.heartbeatAt - b.heartbeatAt);
    const tools = new Map<string, { descriptor: ToolDescriptor; queues: string[]; live: boolean }>();
    const pools = new Set<string>();
    const queues = new Set<string>();
    for (const catalog of catalogs) {
      pools.add(catalog.queue);
      const queueName = catalogQueueName(catalog);
      for (const tool of catalog.tools) {
        // One entry per live worker: a call picks a queue weighted by the workers consuming it (one queue per tool
        // and TASKRELAY_QUEUE, §3.2).
        const queue = toolQueue(queueName, tool.name);
        queues.add(queue);
        const entry = tools.get(tool.name);
        if (entry) {
          entry.descriptor = tool;
          entry.queues.push(queue);
        } else {
          tools.set(tool.name, { descriptor: tool, queues: [queue], live: true });
        }
      }
    }
    for (const pool of this.retained(Object.values(remembered), pools, now)) {
      for (const tool of pool.tools) {
        // Newest retained pool first: it wins a tool no live worker serves.
        if (!tools.has(tool.name)) {
          tools.set(tool.name, { descriptor: tool, queues: [toolQueue(pool.queueName, tool.name)], live: false });
        }
      }
    }
    for (const name of this.served) {
      const entry = tools.get(name);
      if (entry?.live) continue;
      this.served.delete(name);
      if (entry) {
        this.log.warn(
          { tool: name, queue: entry.queues[0], retentionMs: this.retentionMs },
          'no live worker serves this tool any more; it stays listed for the catalog retention, and its calls wait until a worker starts',
        );
      } else {
        this.log.warn(
          { tool: name },
          'no live worker serves this tool any more; its queued calls wait until one starts',
        );
      }
    }
    for (const [name, entry] of tools) if (entry.live) this.served.add(name);
    for (const pool of this.servedPools) {
      if (pools.has(pool)) continue;
      this.servedPools.delete(pool);
      this.log.warn(
        { queue: pool },
        'no live worker consumes this pool any more; jobs waiting in it wait until one starts',
      );
    }
    for (const pool of pools) this.servedPools.add(pool);
    if (housekeeping) {
      this.prunedAt = now;
      this.prune(Object.entries(remembered), pools, now);
    }
    const listed = [...new Set([...tools.values()].flatMap((entry) => entry.queues))];
    const read = await Promise.resolve(this.shardsOf?.(listed))
      .then((shards) => readToolControls(this.redis, this.keys, listed, shards))
      .catch((error: unknown) => {
        this.log.debug({ err: error }, "could not read the tool queues' controls");
        return [];
      });
    const controls = new Map<string, ToolControls>();
    listed.forEach((queue, i) => {
      const c = read[i];
      if (c) controls.set(queue, c);
    });
    const snapshot: CatalogSnapshot = { at: now, tools, pools, queues, controls };
    this.cached = snapshot;
    this.log.trace({ workers: workerIds.length, tools: tools.size, pools: pools.size }, 'catalog refreshed');
    return snapshot;
  }

  /**
   * The remembered pools whose tools are still listed, newest first: not live, seen within the retention, and not
   * superseded. A pool is superseded by a newer one (live, or seen later) of the same `TASKRELAY_QUEUE` that shares a
   * tool with it: a deploy that changed the tool set, so a tool it dropped goes at once instead of waiting out the
   * retention. Pools of one queue name with disjoint tool sets (separate services) never supersede each other. Of a
   * pool dropped by these rules, the tools whose published version live tasks last ran stay (§24.9); a newer pool
   * still wins them.
   */
  private retained(raws: string[], live: Set<string>, now: number): PoolCatalog[] {
    const all = raws
      .map((raw) => parseMessage(PoolCatalogSchema, raw))
      .filter((p) => p !== undefined)
      .sort((a, b) => b.lastSeenAt - a.lastSeenAt);
    const isLive = (p: PoolCatalog) => live.has(p.pool);
    const listed = (pool: PoolCatalog, i: number): boolean => {
      if (now - pool.lastSeenAt > this.retentionMs) return false;
      const names = new Set(pool.tools.map((t) => t.name));
      const newer = all.filter((other, j) => other !== pool && (isLive(other) || j < i));
      return !newer.some((other) => other.queueName === pool.queueName && other.tools.some((t) => names.has(t.name)));
    };
    return all.flatMap((pool, i) => {
      if (isLive(pool)) return [];
      if (listed(pool, i)) return [pool];
      // Past its retention or superseded, but live tasks last ran some of its tool versions: those tools stay.
      const kept = new Set(versionsKeeping(pool, this.inUse).map((v) => v.tool));
      return kept.size === 0 ? [] : [{ ...pool, tools: pool.tools.filter((t) => kept.has(t.name)) }];
    });
  }

  /**
   * Deletes the pools past the retention that no live worker consumes and no live task's version keeps (§24.9); a
   * failure waits for the next round.
   */
  private prune(entries: Array<[string, string]>, live: Set<string>, now: number): void {
    const expired = entries
      .filter(([pool, raw]) => {
        if (live.has(pool)) return false;
        const parsed = parseMessage(PoolCatalogSchema, raw);
        if (parsed && versionsKeeping(parsed, this.inUse).length > 0) return false;
        return !parsed || now - parsed.lastSeenAt > this.retentionMs;
      })
      .map(([pool]) => pool);
    if (expired.length === 0) return;
    void this.redis.hdel(this.keys.pools, ...expired).then(
      () => this.log.info({ pools: expired }, 'pools past the catalog retention forgotten'),
      (error: unknown) => this.log.warn({ err: error }, 'pruning the catalog retention failed'),
    );
  }
}

function describeAjvError(error: ErrorObject | undefined): string {
  if (!error) return 'arguments do not match the input schema';
  const params = error.params as Record<string, unknown>;
  if (error.keyword === 'required')
    return `${fieldName(error.instancePath, String(params['missingProperty']))}: is required`;
  if (error.keyword === 'additionalProperties') {
    return `${fieldName(error.instancePath, String(params['additionalProperty']))}: is not allowed`;
  }
  const field = error.instancePath ? fieldName(error.instancePath) : 'arguments';
  return `${field}: ${error.message ?? 'is invalid'}`;
}

function fieldName(instancePath: string, child?: string): string {
  const parts = instancePath.split('/').filter(Boolean);
  if (child !== undefined) parts.push(child);
  return parts.join('.') || 'arguments';
}

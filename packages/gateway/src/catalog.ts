/**
 * The live tool catalog, read from the workers' heartbeats (PROTOCOL.md §3). The gateway never imports tool code:
 * what it knows of a tool is what a live worker published.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import type { Redis } from 'ioredis';
import {
  TaskrelayError,
  WorkerCatalogSchema,
  parseMessage,
  type Keys,
  type Logger,
  type ToolDescriptor,
} from '@taskrelay/shared';

export interface CatalogTool extends ToolDescriptor {
  /**
   * The worker pool (BullMQ queue) this call goes to: one whose live workers serve the tool (PROTOCOL.md §3.2). When
   * several pools serve it, `find` picks one per call, weighted by their live workers.
   */
  queue: string;
}

/** One read of the live catalogs. */
interface CatalogSnapshot {
  at: number;
  /** Tool name → its newest descriptor and one pool entry per live worker serving it. */
  tools: Map<string, { descriptor: ToolDescriptor; pools: string[] }>;
  /** Pools with at least one live worker. */
  pools: Set<string>;
}

export interface ToolCatalogOptions {
  /** How long a read of the live catalogs is reused. Default 1000 ms. */
  cacheMs?: number;
}

export class ToolCatalog {
  private cached: CatalogSnapshot | undefined;
  private inflight: Promise<CatalogSnapshot> | undefined;
  /** Tools and pools seen served before: one warning when the last worker serving one goes. */
  private readonly served = new Set<string>();
  private readonly servedPools = new Set<string>();
  private readonly validators = new Map<string, { schemaJson: string; validate: ValidateFunction }>();
  private readonly ajv = new Ajv({ allErrors: false, strict: false });
  private readonly cacheMs: number;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly log: Logger,
    options: ToolCatalogOptions = {},
  ) {
    this.cacheMs = options.cacheMs ?? 1000;
  }

  async list(): Promise<CatalogTool[]> {
    return [...(await this.load()).tools.values()].map(({ descriptor, pools }) => ({
      ...descriptor,
      queue: pools[0] ?? '',
    }));
  }

  /** The tool, with the pool this call goes to; undefined when no live worker serves it. */
  async find(name: string): Promise<CatalogTool | undefined> {
    const entry = (await this.load()).tools.get(name);
    if (!entry) return undefined;
    const queue = entry.pools[Math.floor(Math.random() * entry.pools.length)] ?? '';
    return { ...entry.descriptor, queue };
  }

  /**
   * Why a task that no worker has started yet may wait for ever, or undefined when a live worker of its pool serves
   * it: what `tasks/get` shows as its `statusMessage` (PROTOCOL.md §3.2).
   */
  async unservedReason(tool: string, queue: string): Promise<string | undefined> {
    const snapshot = await this.load();
    if (snapshot.pools.has(queue)) return undefined;
    return snapshot.tools.has(tool)
      ? `Waiting: no live worker consumes pool ${queue}, where this task was queued (tool ${tool} is served by another pool now)`
      : `Waiting: no live worker serves tool ${tool}; the task runs once one starts`;
  }

  /** Validates arguments against the tool's published JSON Schema; throws INVALID_ARGUMENTS naming the field. */
  validate(tool: CatalogTool, args: Record<string, unknown>): void {
    const schemaJson = JSON.stringify(tool.inputSchema);
    let entry = this.validators.get(tool.name);
    if (entry?.schemaJson !== schemaJson) {
      entry = { schemaJson, validate: this.ajv.compile(tool.inputSchema) };
      this.validators.set(tool.name, entry);
    }
    if (entry.validate(args)) return;
    const detail = describeAjvError(entry.validate.errors?.[0]);
    throw new TaskrelayError('INVALID_ARGUMENTS', `Invalid arguments for tool ${tool.name}: ${detail}`);
  }

  private async load(): Promise<CatalogSnapshot> {
    if (this.cached && Date.now() - this.cached.at < this.cacheMs) return this.cached;
    this.inflight ??= this.read().finally(() => {
      this.inflight = undefined;
    });
    return this.inflight;
  }

  private async read(): Promise<CatalogSnapshot> {
    const now = Date.now();
    const workerIds = await this.redis.zrangebyscore(this.keys.workers, now, '+inf');
    const raws = workerIds.length > 0 ? await this.redis.mget(workerIds.map((id) => this.keys.workerCatalog(id))) : [];
    const catalogs = raws
      .map((raw) => (raw ? parseMessage(WorkerCatalogSchema, raw) : undefined))
      .filter((c) => c !== undefined)
      // Newest heartbeat last, so during a rolling deploy the newest definition of a tool wins.
      .sort((a, b) => a.heartbeatAt - b.heartbeatAt);
    const tools = new Map<string, { descriptor: ToolDescriptor; pools: string[] }>();
    const pools = new Set<string>();
    for (const catalog of catalogs) {
      pools.add(catalog.queue);
      for (const tool of catalog.tools) {
        const entry = tools.get(tool.name);
        if (entry) {
          entry.descriptor = tool;
          entry.pools.push(catalog.queue);
        } else {
          tools.set(tool.name, { descriptor: tool, pools: [catalog.queue] });
        }
      }
    }
    for (const name of this.served) {
      if (tools.has(name)) continue;
      this.served.delete(name);
      this.log.warn({ tool: name }, 'no live worker serves this tool any more; its queued calls wait until one starts');
    }
    for (const name of tools.keys()) this.served.add(name);
    for (const pool of this.servedPools) {
      if (pools.has(pool)) continue;
      this.servedPools.delete(pool);
      this.log.warn(
        { queue: pool },
        'no live worker consumes this pool any more; jobs waiting in it wait until one starts',
      );
    }
    for (const pool of pools) this.servedPools.add(pool);
    const snapshot: CatalogSnapshot = { at: now, tools, pools };
    this.cached = snapshot;
    this.log.trace({ workers: workerIds.length, tools: tools.size, pools: pools.size }, 'catalog refreshed');
    return snapshot;
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

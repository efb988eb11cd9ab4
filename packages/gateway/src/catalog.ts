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
  /** The worker pool (queue) that runs this tool. */
  queue: string;
}

export interface ToolCatalogOptions {
  /** How long a read of the live catalogs is reused. Default 1000 ms. */
  cacheMs?: number;
}

export class ToolCatalog {
  private cached: { at: number; tools: Map<string, CatalogTool> } | undefined;
  private inflight: Promise<Map<string, CatalogTool>> | undefined;
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
    return [...(await this.load()).values()];
  }

  async find(name: string): Promise<CatalogTool | undefined> {
    return (await this.load()).get(name);
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

  private async load(): Promise<Map<string, CatalogTool>> {
    if (this.cached && Date.now() - this.cached.at < this.cacheMs) return this.cached.tools;
    this.inflight ??= this.read().finally(() => {
      this.inflight = undefined;
    });
    return this.inflight;
  }

  private async read(): Promise<Map<string, CatalogTool>> {
    const now = Date.now();
    const workerIds = await this.redis.zrangebyscore(this.keys.workers, now, '+inf');
    const raws = workerIds.length > 0 ? await this.redis.mget(workerIds.map((id) => this.keys.workerCatalog(id))) : [];
    const catalogs = raws
      .map((raw) => (raw ? parseMessage(WorkerCatalogSchema, raw) : undefined))
      .filter((c) => c !== undefined)
      // Newest heartbeat last, so during a rolling deploy the newest definition of a tool wins.
      .sort((a, b) => a.heartbeatAt - b.heartbeatAt);
    const tools = new Map<string, CatalogTool>();
    for (const catalog of catalogs) {
      for (const tool of catalog.tools) tools.set(tool.name, { ...tool, queue: catalog.queue });
    }
    this.cached = { at: now, tools };
    this.log.trace({ workers: workerIds.length, tools: tools.size }, 'catalog refreshed');
    return tools;
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

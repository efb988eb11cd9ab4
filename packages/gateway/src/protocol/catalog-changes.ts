/**
 * Tells `subscriptions/listen` streams that asked for `toolsListChanged` when the set of tools this gateway lists
 * changes (PROTOCOL.md §18.2). One watch per gateway, whatever the number of streams: it reads the catalog (cached,
 * one Redis read per `intervalMs` at most) only while at least one stream listens.
 */
import type { CatalogTool } from '../tasks/catalog.js';

export interface CatalogChangesOptions {
  /** The tools listed now (TaskService.listTools). */
  list: () => Promise<CatalogTool[]>;
  /** How often the catalog is compared while someone listens. Default 1000 ms (the catalog's own cache). */
  intervalMs?: number;
}

export class CatalogChanges {
  private readonly listeners = new Set<() => void>();
  private timer: NodeJS.Timeout | undefined;
  private last: string | undefined;

  constructor(private readonly options: CatalogChangesOptions) {}

  /** Calls `onChange` on each change of the listed tools until the returned function is called. */
  subscribe(onChange: () => void): () => void {
    this.listeners.add(onChange);
    if (this.timer === undefined) {
      // The baseline is what the tools are when the first stream starts listening.
      void this.digest().then((digest) => (this.last ??= digest));
      this.timer = setInterval(() => void this.check(), this.options.intervalMs ?? 1000);
      this.timer.unref();
    }
    return () => {
      this.listeners.delete(onChange);
      if (this.listeners.size === 0) {
        clearInterval(this.timer);
        this.timer = undefined;
        this.last = undefined;
      }
    };
  }

  private async check(): Promise<void> {
    const digest = await this.digest();
    if (digest === undefined || this.listeners.size === 0) return;
    if (this.last !== undefined && digest !== this.last) for (const listener of [...this.listeners]) listener();
    this.last = digest;
  }

  /** What a client would see change in tools/list: names, descriptions and schemas. */
  private async digest(): Promise<string | undefined> {
    const tools = await this.options.list().catch(() => undefined);
    if (!tools) return undefined;
    const described = [...tools]
      .sort((a, b) => a.name.localeCompare(b.name))
      .map((t) => [t.name, t.title, t.description, t.inputSchema, t.outputSchema, t.taskSupport]);
    return JSON.stringify(described);
  }
}

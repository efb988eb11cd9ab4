/**
 * Task output as MCP resources (PROTOCOL.md §34), once for both eras: the templates, `resources/read` (the task's
 * principal only; anything else is the not-found every unknown resource gets), and subscriptions to a task's output
 * (coalesced). A stored value is not read here: `read` answers how to stream it, and the transport writes it
 * (`http/resource-body.ts`), so a large value never sits whole in the gateway.
 */
import {
  Coalescer,
  JSON_RPC,
  TASK_RESOURCE_TEMPLATES,
  parseTaskResourceUri,
  type BlobMeta,
  type TaskOutputStore,
} from '@taskrelay/shared';
import type { ResourceFeed } from '../tasks/resource-feed.js';
import { WireError } from '../wire/errors.js';

/** How often one subscriber is told at most (newest wins: the notification names only the URI). */
export const RESOURCE_UPDATE_INTERVAL_MS = 100;
/** Most resource subscriptions of one session, or URIs of one listen stream. */
export const MAX_RESOURCE_SUBSCRIPTIONS = 100;

/** A stored value to stream: its description, size and a range reader. */
export interface StreamedResource {
  uri: string;
  meta: BlobMeta & { size: number };
  readRange: (start: number, end: number) => Promise<Buffer>;
}

export type ResourceRead =
  { kind: 'inline'; result: Record<string, unknown> } | { kind: 'stream'; value: StreamedResource };

export class TaskResources {
  constructor(
    private readonly store: TaskOutputStore,
    private readonly feed: ResourceFeed,
  ) {}

  templates(): Array<Record<string, unknown>> {
    return TASK_RESOURCE_TEMPLATES.map((template) => ({ ...template }));
  }

  /** Whether `uri` names a stored value (streamed by the transport), so the transport can take the request itself. */
  isStreamed(uri: unknown): boolean {
    return typeof uri === 'string' && parseTaskResourceUri(uri)?.kind === 'blob';
  }

  /** `resources/read`: the task's principal only; anything else (gone, foreign, unknown) is one not-found. */
  async read(principal: string, uri: unknown): Promise<ResourceRead> {
    const resource = await this.owned(principal, uri);
    if (resource.kind === 'output') {
      const text = await this.store.readOutput(resource.taskId);
      return {
        kind: 'inline',
        result: { contents: [{ uri: resource.uri, mimeType: 'text/plain; charset=utf-8', text }] },
      };
    }
    const meta = await this.store.blobInfo(resource.taskId, resource.blobId);
    if (!meta) throw notFound(resource.uri);
    const { taskId, blobId } = resource;
    return {
      kind: 'stream',
      value: {
        uri: resource.uri,
        meta,
        readRange: (start, end) => this.store.readBlobRange(taskId, blobId, start, end, meta),
      },
    };
  }

  /**
   * Follows a task's output for `principal`: `onUpdated` at most every {@link RESOURCE_UPDATE_INTERVAL_MS}, and once
   * after the last change. Refused (not found) as a read would be. Returns the stop.
   */
  async subscribe(principal: string, uri: unknown, onUpdated: (uri: string) => void): Promise<() => void> {
    const resource = await this.owned(principal, uri);
    await this.feed.follow(resource.taskId);
    const coalescer = new Coalescer<string>({ minIntervalMs: RESOURCE_UPDATE_INTERVAL_MS, send: onUpdated });
    const stop = this.feed.watch(resource.taskId, () => coalescer.push(resource.uri));
    return () => {
      stop();
      coalescer.cancel();
    };
  }

  /** The resource `uri` names, when `principal` may read it; else the not-found error. */
  private async owned(principal: string, uri: unknown) {
    if (typeof uri !== 'string') throw new WireError(JSON_RPC.INVALID_PARAMS, 'params.uri must be a string');
    const resource = parseTaskResourceUri(uri);
    if (!resource) throw notFound(uri);
    const owner = await this.store.ownerOf(resource.taskId);
    if (owner !== principal) throw notFound(uri);
    // Notifications carry the URI the client asked with.
    return { ...resource, uri };
  }
}

/** The one answer for a resource the caller cannot read: unknown, gone, or another principal's (no leak). */
export function notFound(uri: unknown): WireError {
  return new WireError(JSON_RPC.INVALID_PARAMS, 'Resource not found', { uri });
}

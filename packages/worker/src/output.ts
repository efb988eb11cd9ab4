/**
 * A run's output and the values it stores apart from its result (PROTOCOL.md §34): `ctx.output.write` / `set` (the
 * partial output resource), `ctx.artifact` (files returned as `resource_link`), and the result's blocks above the
 * inline threshold moved out by reference when the run completes. Writes of one run go out in order, and the run's
 * end waits for them, so a reader that sees the task ended sees its final output.
 */

import {
  blobUri,
  newBlobId,
  StoredBytesLimitError,
  type BlobMeta,
  type OutputWriteOutcome,
  type Logger,
  type OutputLock,
  type TaskOutputStore,
  type ToolResult,
} from '@taskrelay/shared';

/** `ctx.output`: the task's partial output, readable as `taskrelay://tasks/{taskId}/output` while the task runs. */
export interface TaskOutput {
  /**
   * Appends `chunk` to the output. Resolves once it is stored (subscribers are told then); writes of one run are
   * stored in order. The output keeps its newest `TASKRELAY_MAX_OUTPUT_BYTES` (default 1 MiB). A write of a run that
   * no longer owns the task, or after the task ended, is dropped (logged), never thrown.
   *
   * @throws TypeError when `chunk` is not a string.
   */
  write(chunk: string): Promise<void>;
  /** Replaces the whole output with `snapshot` (a progress table, a current summary). Otherwise as `write`. */
  set(snapshot: string): Promise<void>;
}

/** An MCP `resource_link` content block naming a stored value. */
export interface ResourceLink {
  type: 'resource_link';
  uri: string;
  name: string;
  mimeType: string;
  size: number;
  [key: string]: unknown;
}

/** What `ctx.artifact` stores: bytes, text (stored as UTF-8), or an async iterable of either. */
export type ArtifactData = Uint8Array | string | AsyncIterable<Uint8Array | string>;

/** The most bytes one `blobPut` call carries: a large value goes in several, each checked against the bounds. */
const PUT_CHUNK_BYTES = 4 * 1024 * 1024;

export interface RunOutputOptions {
  store: TaskOutputStore;
  taskId: string;
  principal: string;
  lock: OutputLock | undefined;
  log: Logger;
  /** Told when a write is refused because another run holds the job now. */
  onLockLost?: () => void;
}

/** The output side of one run: its writes in order, its artifacts, and its result by reference. */
export class RunOutput {
  private tail: Promise<unknown> = Promise.resolve();
  private readonly artifacts: ResourceLink[] = [];
  readonly output: TaskOutput;

  constructor(private readonly o: RunOutputOptions) {
    this.output = {
      write: (chunk) => this.enqueue('append', chunk),
      set: (snapshot) => this.enqueue('set', snapshot),
    };
  }

  private enqueue(mode: 'append' | 'set', text: unknown): Promise<void> {
    if (typeof text !== 'string') {
      return Promise.reject(new TypeError(`ctx.output.${mode === 'append' ? 'write' : 'set'} takes a string`));
    }
    const done = this.tail.then(async () => {
      const outcome = await this.o.store.writeOutput(this.o.taskId, mode, text, this.o.lock);
      if (outcome === 'lock_lost') {
        this.o.log.warn('output write refused: this worker no longer holds the job');
        this.o.onLockLost?.();
      } else if (outcome !== 'ok') {
        this.o.log.debug({ outcome }, 'output write dropped');
      }
    });
    // The chain goes on after a failed write; the caller sees its own write's failure.
    this.tail = done.catch(() => undefined);
    return done;
  }

  /**
   * Stores a file of the task and returns its `resource_link` (PROTOCOL.md §34.4); the link is also appended to the
   * result's content when the run completes.
   *
   * @throws TypeError for a bad name, data or MIME type; `StoredBytesLimitError` (a `NonRetryableError`) past a bound.
   */
  async artifact(name: string, data: ArtifactData, mimeType: string): Promise<ResourceLink> {
    if (typeof name !== 'string' || name.length === 0 || name.length > 200) {
      throw new TypeError('ctx.artifact: name must be a string of 1 to 200 characters');
    }
    if (typeof mimeType !== 'string' || !/^[\w.+-]+\/[\w.+-]+(\s*;.*)?$/.test(mimeType)) {
      throw new TypeError('ctx.artifact: mimeType must be a MIME type such as text/plain or image/png');
    }
    const text = /^text\/|^application\/(json|xml|yaml|x-ndjson)/.test(mimeType);
    const link = await this.store(chunksOf(data), { name, mimeType, text, kind: 'artifact' }, true);
    this.artifacts.push(link);
    return link;
  }

  /** Waits for the run's writes in flight (never rejects). */
  async settle(): Promise<void> {
    await this.tail;
  }

  /**
   * The result as it is stored (PROTOCOL.md §34.3): the run's artifacts appended (unless the tool placed them), then
   * each content block above `inlineBytes` moved out, then the whole result if it is still above it.
   */
  async finish(result: ToolResult, inlineAtMost?: number): Promise<ToolResult> {
    await this.settle();
    const inlineBytes = Math.min(this.o.store.limits.inlineResultBytes, inlineAtMost ?? Infinity);
    const placed = new Set(result.content.map((block) => block['uri']));
    const content: Array<Record<string, unknown>> = [];
    for (const [i, block] of result.content.entries()) content.push(await this.moveBlock(block, i, inlineBytes));
    for (const link of this.artifacts) if (!placed.has(link.uri)) content.push(link);
    const moved: ToolResult = { ...result, content };
    const json = JSON.stringify(moved);
    if (Buffer.byteLength(json) <= inlineBytes) return moved;
    const link = await this.store(
      one(Buffer.from(json)),
      { name: 'result.json', mimeType: 'application/json', text: true, kind: 'result' },
      false,
    );
    return moved.isError === true ? { content: [link], isError: true } : { content: [link] };
  }

  /** One content block, or its `resource_link` when its payload is above the threshold. */
  private async moveBlock(block: Record<string, unknown>, i: number, inlineBytes: number) {
    const kind = { kind: 'result' as const };
    if (block['type'] === 'text' && typeof block['text'] === 'string' && block['text'].length > inlineBytes / 4) {
      const bytes = Buffer.from(block['text']);
      if (bytes.length <= inlineBytes) return block;
      const meta = { name: `result-${i}.txt`, mimeType: 'text/plain; charset=utf-8', text: true, ...kind };
      return this.store(one(bytes), meta, false);
    }
    if ((block['type'] === 'image' || block['type'] === 'audio') && typeof block['data'] === 'string') {
      if (block['data'].length <= inlineBytes) return block;
      const mimeType = typeof block['mimeType'] === 'string' ? block['mimeType'] : 'application/octet-stream';
      const meta = { name: `result-${i}.bin`, mimeType, text: false, ...kind };
      return this.store(one(Buffer.from(block['data'], 'base64')), meta, false);
    }
    const resource = block['resource'] as Record<string, unknown> | undefined;
    if (block['type'] === 'resource' && resource !== undefined) {
      const payload = typeof resource['text'] === 'string' ? resource['text'] : resource['blob'];
      if (typeof payload !== 'string' || payload.length <= inlineBytes) return block;
      const text = typeof resource['text'] === 'string';
      const uri = typeof resource['uri'] === 'string' ? resource['uri'] : '';
      const name = uri.split('/').filter(Boolean).pop() ?? `result-${i}`;
      const mimeType = typeof resource['mimeType'] === 'string' ? resource['mimeType'] : 'application/octet-stream';
      const bytes = text ? Buffer.from(payload) : Buffer.from(payload, 'base64');
      return this.store(one(bytes), { name, mimeType, text, ...kind }, false);
    }
    return block;
  }

  /** Stores a value chunk by chunk (bounds checked on each) and returns its link. */
  private async store(chunks: AsyncIterable<Buffer>, meta: BlobMeta, notify: boolean): Promise<ResourceLink> {
    await this.settle();
    const blobId = newBlobId();
    const { store } = this.o;
    const target = { taskId: this.o.taskId, principal: this.o.principal, blobId, lock: this.o.lock, notify };
    const checked = (outcome: OutputWriteOutcome) => {
      if (outcome === 'lock_lost') this.o.onLockLost?.();
      if (outcome !== 'ok') throw new Error(`cannot store ${meta.name}: ${outcome.replace('_', ' ')}`);
    };
    let size = 0;
    if (store.objects) {
      // The object store takes a value whole (one PUT): gathered here, within the task's bound (§34.7).
      const parts: Buffer[] = [];
      for await (const chunk of chunks) {
        size += chunk.length;
        if (size > store.limits.maxTaskBytes) throw new StoredBytesLimitError('task', store.limits.maxTaskBytes);
        parts.push(chunk);
      }
      checked(await store.putBlobObject({ ...target, body: Buffer.concat(parts), meta }));
    } else {
      let first = true;
      const put = async (piece: Buffer) => {
        checked(await store.putBlobChunk({ ...target, chunk: piece, first, meta: first ? meta : undefined }));
        first = false;
        size += piece.length;
      };
      for await (const chunk of chunks) {
        for (let at = 0; at < chunk.length; at += PUT_CHUNK_BYTES) await put(chunk.subarray(at, at + PUT_CHUNK_BYTES));
      }
      // An empty value is still stored: its index entry is what makes it readable.
      if (first) await put(Buffer.alloc(0));
    }
    return {
      type: 'resource_link',
      uri: blobUri(this.o.taskId, blobId),
      name: meta.name,
      mimeType: meta.mimeType,
      size,
    };
  }
}

async function* one(bytes: Buffer): AsyncIterable<Buffer> {
  yield bytes;
}

async function* chunksOf(data: ArtifactData): AsyncIterable<Buffer> {
  if (typeof data === 'string') {
    yield Buffer.from(data);
  } else if (data instanceof Uint8Array) {
    yield Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  } else if (data !== null && typeof data === 'object' && Symbol.asyncIterator in data) {
    for await (const chunk of data) {
      if (typeof chunk === 'string') yield Buffer.from(chunk);
      else if (chunk instanceof Uint8Array) yield Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      else throw new TypeError('ctx.artifact: a stream must yield Uint8Array or string chunks');
    }
  } else {
    throw new TypeError('ctx.artifact: data must be a Uint8Array, a string or an async iterable of them');
  }
}

/**
 * A task's output and the values stored apart from its result (PROTOCOL.md §34): the resource URIs that name them,
 * the worker's writes (`outputWrite`, `blobPut`, both lock-checked Lua) and the gateway's reads (the owner first, then
 * the value in ranges, so a large value never leaves Redis whole).
 */
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';
import { publishCommand } from './pubsub.js';
import { ResultCode } from './protocol/script-results.js';
import { SCRIPTS, type ScriptRunner } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';
import { TASK_FIELDS } from './protocol/task-fields.js';
import { NonRetryableError, TaskrelayError } from './protocol/errors.js';
import type { BlobObjects } from './blob-objects.js';

/** The URI scheme and path of every task resource. */
const URI_PREFIX = 'taskrelay://tasks/';

/** `taskrelay://tasks/{taskId}/output`: the task's partial output. */
export function outputUri(taskId: string): string {
  return `${URI_PREFIX}${encodeURIComponent(taskId)}/output`;
}

/** `taskrelay://tasks/{taskId}/blobs/{blobId}`: a value stored apart from the result (a moved block, an artifact). */
export function blobUri(taskId: string, blobId: string): string {
  return `${URI_PREFIX}${encodeURIComponent(taskId)}/blobs/${encodeURIComponent(blobId)}`;
}

/** The resource templates the gateway offers (`resources/templates/list`). */
export const TASK_RESOURCE_TEMPLATES = [
  {
    uriTemplate: `${URI_PREFIX}{taskId}/output`,
    name: 'task-output',
    title: 'Task output',
    description: "A task's partial output while it runs and after (ctx.output); subscribe to be told when it changes",
    mimeType: 'text/plain; charset=utf-8',
  },
  {
    uriTemplate: `${URI_PREFIX}{taskId}/blobs/{blobId}`,
    name: 'task-blob',
    title: 'Task result part or artifact',
    description: 'A large result, a content block moved out of a result, or an artifact (ctx.artifact)',
  },
] as const;

export type TaskResource = { kind: 'output'; taskId: string } | { kind: 'blob'; taskId: string; blobId: string };

const ID = /^[A-Za-z0-9._:-]{1,200}$/;

/** The task resource a URI names, or undefined (not one of ours, or malformed). */
export function parseTaskResourceUri(uri: string): TaskResource | undefined {
  if (!uri.startsWith(URI_PREFIX)) return undefined;
  const parts = uri.slice(URI_PREFIX.length).split('/');
  const decoded = parts.map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return '';
    }
  });
  const [taskId, kind, blobId] = decoded;
  if (taskId === undefined || !ID.test(taskId)) return undefined;
  if (kind === 'output' && parts.length === 2) return { kind: 'output', taskId };
  if (kind === 'blobs' && parts.length === 3 && blobId !== undefined && ID.test(blobId)) {
    return { kind: 'blob', taskId, blobId };
  }
  return undefined;
}

/** What the index keeps of one stored value. */
export const BlobMetaSchema = z.object({
  name: z.string(),
  mimeType: z.string(),
  /** Stored as UTF-8 text (answered as `text`) or bytes (answered as base64 `blob`). */
  text: z.boolean(),
  /** `result` (moved out of the result, §34.3) or `artifact` (§34.4). */
  kind: z.enum(['result', 'artifact']),
  /** The object's key when the bytes live in the object store (§34.7), with their size. */
  object: z.string().optional(),
  size: z.number().int().nonnegative().optional(),
});
export type BlobMeta = z.infer<typeof BlobMetaSchema>;

/** The bounds of output and stored values (PROTOCOL.md §34); `TASKRELAY_*` variables of the worker. */
export interface OutputLimits {
  /** The most bytes an output keeps (its tail). `TASKRELAY_MAX_OUTPUT_BYTES`, default 1 MiB. */
  maxOutputBytes: number;
  /** How long output and stored values live after their last write. `TASKRELAY_BLOB_TTL_MS`, default 24 h. */
  blobTtlMs: number;
  /** The most bytes one task stores apart. `TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK`, default 64 MiB. */
  maxTaskBytes: number;
  /** The most bytes one principal stores within the TTL. `TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL`, default 1 GiB. */
  maxPrincipalBytes: number;
  /** Results and blocks above this many bytes go by reference. `TASKRELAY_INLINE_RESULT_BYTES`, default 1 MiB. */
  inlineResultBytes: number;
}

export const DEFAULT_OUTPUT_LIMITS: OutputLimits = {
  maxOutputBytes: 1024 * 1024,
  blobTtlMs: 24 * 3_600_000,
  maxTaskBytes: 64 * 1024 * 1024,
  maxPrincipalBytes: 1024 * 1024 * 1024,
  inlineResultBytes: 1024 * 1024,
};

/** The write's lock: the job whose lock the run holds (a batch child's job id is not its task's). */
export interface OutputLock {
  queue: string;
  jobId: string;
  token: string;
  /**
   * The sharded layout: the shard of the job's queue when it is not the task's (a batch child's, whose lock is on its
   * own shard, PROTOCOL.md §26.10). The lock is read there first; the write on the task's shard is then unlocked.
   */
  shard?: string;
}

/** The outcome of a write: done, or why not (a run never throws for these: a stale run's write is dropped). */
export type OutputWriteOutcome = 'ok' | 'task_missing' | 'task_terminal' | 'lock_lost';

const OUTCOMES: Partial<Record<ResultCode, OutputWriteOutcome>> = {
  [ResultCode.OK]: 'ok',
  [ResultCode.TASK_MISSING]: 'task_missing',
  [ResultCode.TASK_TERMINAL]: 'task_terminal',
  [ResultCode.LOCK_LOST]: 'lock_lost',
};

/** A stored-bytes bound would be passed (PROTOCOL.md §34.4): no retry can mend it, so the run fails for good. */
export class StoredBytesLimitError extends NonRetryableError {
  constructor(
    readonly bound: 'task' | 'principal',
    limit: number,
  ) {
    super(
      bound === 'task'
        ? `A task may store at most ${limit} bytes of results and artifacts (TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK)`
        : `A principal may store at most ${limit} bytes of results and artifacts within TASKRELAY_BLOB_TTL_MS (TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL)`,
    );
    this.name = 'StoredBytesLimitError';
  }
}

export function newBlobId(): string {
  return randomBytes(12)
    .toString('base64url')
    .replace(/[^A-Za-z0-9]/g, 'x');
}

export class TaskOutputStore {
  private readonly redis: RedisClient;
  private readonly keys: Keys;
  private readonly scripts: ScriptRunner;

  /** Over the runner of the connection it reads and writes on (store/store-runner.ts): one per connection. */
  constructor(
    runner: StoreRunner,
    readonly limits: OutputLimits = DEFAULT_OUTPUT_LIMITS,
    /** The object store the bytes go to (§34.7); undefined: Redis. */
    readonly objects?: BlobObjects,
  ) {
    this.redis = runner.redis;
    this.keys = runner.keys;
    this.scripts = runner.scripts;
  }

  private lockKey(taskId: string, lock: OutputLock | undefined): string {
    return lock && lock.shard === undefined
      ? this.keys.forTask(taskId).bullJobLock(lock.queue, lock.jobId)
      : this.keys.forTask(taskId).task(taskId);
  }

  /**
   * The token a write's script checks: the run's, or '' (unchecked) for a lock on another shard than the task's, which
   * is read here instead (no script spans two slots, §26.10): undefined when that lock is not the run's any more.
   */
  private async lockToken(lock: OutputLock | undefined): Promise<string | undefined> {
    if (lock === undefined) return '';
    if (lock.shard === undefined) return lock.token;
    const held = await this.redis.get(this.keys.forShard(lock.shard).bullJobLock(lock.queue, lock.jobId));
    return held === lock.token ? '' : undefined;
  }

  /** Appends to or replaces the task's output (PROTOCOL.md §34.2). */
  async writeOutput(
    taskId: string,
    mode: 'append' | 'set',
    chunk: string,
    lock: OutputLock | undefined,
  ): Promise<OutputWriteOutcome> {
    const lockToken = await this.lockToken(lock);
    if (lockToken === undefined) return 'lock_lost';
    const reply = await this.scripts.call(SCRIPTS.outputWrite, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.lockKey(taskId, lock),
        output: this.keys.forTask(taskId).output(taskId).text,
      },
      args: {
        lockToken,
        mode,
        chunk,
        maxBytes: this.limits.maxOutputBytes,
        ttlMs: this.limits.blobTtlMs,
        // The task's shard's channel (PROTOCOL.md §1.2): `SPUBLISH` in its own slot in the sharded layout.
        channel: this.keys.forTask(taskId).resourcesChannel,
        taskId,
        publish: publishCommand(this.keys),
      },
    });
    return OUTCOMES[reply.code] ?? 'ok';
  }

  /**
   * Stores one chunk of a value (the first with its `meta`). Throws `StoredBytesLimitError` past a bound; a stale or
   * ended run's write answers its outcome.
   */
  async putBlobChunk(input: {
    taskId: string;
    principal: string;
    blobId: string;
    chunk: Buffer;
    first: boolean;
    meta: BlobMeta | undefined;
    lock: OutputLock | undefined;
    notify: boolean;
    /** The value lives in the object store: this many bytes are counted, none stored here. */
    externalBytes?: number;
  }): Promise<OutputWriteOutcome> {
    const { taskId } = input;
    const keys = this.keys.forTask(taskId).output(taskId);
    const lockToken = await this.lockToken(input.lock);
    if (lockToken === undefined) return 'lock_lost';
    const reply = await this.scripts.call(SCRIPTS.blobPut, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.lockKey(taskId, input.lock),
        blobs: keys.blobs,
        blob: keys.blob(input.blobId),
        principalBytes: this.keys.forTask(taskId).principalBlobBytes(input.principal),
      },
      args: {
        lockToken,
        blobId: input.blobId,
        chunk: input.chunk,
        append: input.first ? '0' : '1',
        meta: input.meta ? JSON.stringify(input.meta) : '',
        taskMax: this.limits.maxTaskBytes,
        principalMax: this.limits.maxPrincipalBytes,
        ttlMs: this.limits.blobTtlMs,
        channel: input.notify ? this.keys.forTask(taskId).resourcesChannel : '',
        taskId,
        externalBytes: input.externalBytes ?? '',
        publish: publishCommand(this.keys),
      },
    });
    if (reply.code === ResultCode.LIMIT_FULL) {
      const bound = reply.values[0] === 'principal' ? 'principal' : 'task';
      throw new StoredBytesLimitError(
        bound,
        bound === 'task' ? this.limits.maxTaskBytes : this.limits.maxPrincipalBytes,
      );
    }
    return OUTCOMES[reply.code] ?? 'ok';
  }

  /**
   * Stores a whole value in the object store (§34.7), then its index entry and its bytes against the bounds (an
   * object refused by a bound is left to the bucket's lifecycle rule).
   */
  async putBlobObject(input: {
    taskId: string;
    principal: string;
    blobId: string;
    body: Buffer;
    meta: BlobMeta;
    lock: OutputLock | undefined;
    notify: boolean;
  }): Promise<OutputWriteOutcome> {
    const objects = this.objects;
    if (!objects) throw new TaskrelayError('INTERNAL', 'putBlobObject without an object store');
    const key = objects.keyOf(input.taskId, input.blobId);
    await objects.put(key, input.body, input.meta.mimeType);
    return this.putBlobChunk({
      ...input,
      chunk: Buffer.alloc(0),
      first: true,
      meta: { ...input.meta, object: key, size: input.body.length },
      externalBytes: input.body.length,
    });
  }

  /** The principal a task belongs to, or undefined when the task is gone. */
  async ownerOf(taskId: string): Promise<string | undefined> {
    const principal = await this.redis.hget(this.keys.forTask(taskId).task(taskId), TASK_FIELDS.principal);
    return principal ?? undefined;
  }

  /** The task's output so far ('' before the first write). */
  async readOutput(taskId: string): Promise<string> {
    return (await this.redis.get(this.keys.forTask(taskId).output(taskId).text)) ?? '';
  }

  /** A stored value's description and size, or undefined when it is not there (expired, never stored). */
  async blobInfo(taskId: string, blobId: string): Promise<(BlobMeta & { size: number }) | undefined> {
    const keys = this.keys.forTask(taskId).output(taskId);
    const [raw, size] = await Promise.all([this.redis.hget(keys.blobs, blobId), this.redis.strlen(keys.blob(blobId))]);
    if (raw === null) return undefined;
    let meta: unknown;
    try {
      meta = JSON.parse(raw);
    } catch {
      throw new TaskrelayError('INTERNAL', `blob index entry ${blobId} of task ${taskId} is not JSON`);
    }
    const parsed = BlobMetaSchema.parse(meta);
    return { ...parsed, size: parsed.object === undefined ? size : (parsed.size ?? 0) };
  }

  /** Bytes `start .. end − 1` of a stored value (GETRANGE): what a streamed read asks for, one chunk at a time. */
  async readBlobRange(taskId: string, blobId: string, start: number, end: number, meta?: BlobMeta): Promise<Buffer> {
    if (meta?.object !== undefined) {
      if (!this.objects) throw new TaskrelayError('INTERNAL', 'a value in the object store, and no object store here');
      return this.objects.getRange(meta.object, start, end);
    }
    return this.redis.getrangeBuffer(this.keys.forTask(taskId).output(taskId).blob(blobId), start, end - 1);
  }
}

import { TaskrelayError, type SerializedError } from '../protocol/errors.js';
import { MAX_FAIR_PRIORITY } from '../fair-share.js';
import { pipelineByShard } from '../placement.js';
import type { RedisClient } from '../redis.js';
import { ResultCode } from '../protocol/script-results.js';
import { SCRIPTS } from '../protocol/scripts.js';
import { TASK_FIELDS as F, TASK_FIELD_PREFIXES } from '../protocol/task-fields.js';
import type { CancelReason, ProgressToken, TaskRecord, TaskStatus } from '../protocol/task-model.js';
import { LargeReads } from './large-reads.js';
import type { StoreRunner } from './store-runner.js';
import { OpenCapReached, type CreateOutcome, type CreateTaskInput, type PreparedCreate } from './task-create.js';
import { asStatus, flatToHash, fromFlat, newTaskId, parseJson, parseRecord } from './task-codec.js';

export interface TaskPage {
  tasks: TaskRecord[];
  nextCursor?: string;
}

/** What `summaries` reads of a task: every field but its result. */
const SUMMARY_FIELDS: readonly string[] = Object.values(F).filter((field) => field !== F.result);

export interface TaskRecordsOptions {
  /** How soon after creation, and how often after that, the reaper looks at a live task. Default 5000 ms. */
  reaperIntervalMs?: number;
  /** How many task ids one principal's index keeps (newest win). Default 10000. */
  indexCap?: number;
  /** The index expires this long after its last task was added. Default 30 days. */
  indexTtlMs?: number;
  /**
   * Large results read apart (PROTOCOL.md §22.5): a result over `inlineMaxBytes` is read over one of `connections`,
   * never over the store's own connection, at most `perPrincipal` at once for one principal and one per connection
   * in all. Without it, `get` reads the whole hash (a worker's store).
   */
  largeReads?: { connections: RedisClient[]; inlineMaxBytes: number; perPrincipal: number };
}

/**
 * Task records (PROTOCOL.md §2, §10.8): creating a task, reading one or many, a principal's list, and the views over
 * the live set. Status writes are the runs' (`Runs`).
 */
export class TaskRecords {
  private readonly reaperIntervalMs: number;
  private readonly indexCap: number;
  private readonly indexTtlMs: number;
  private readonly largeReads: (LargeReads & { inlineMaxBytes: number }) | undefined;

  constructor(
    private readonly runner: StoreRunner,
    options: TaskRecordsOptions = {},
  ) {
    const large = options.largeReads;
    if (large !== undefined && large.connections.length > 0) {
      this.largeReads = Object.assign(new LargeReads(large.connections, large.perPrincipal), {
        inlineMaxBytes: large.inlineMaxBytes,
      });
    }
    this.reaperIntervalMs = options.reaperIntervalMs ?? 5_000;
    this.indexCap = options.indexCap ?? 10_000;
    this.indexTtlMs = options.indexTtlMs ?? 30 * 86_400_000;
  }

  async create(input: CreateTaskInput, now = new Date()): Promise<TaskRecord> {
    return (await this.createTask(input, now)).record;
  }

  /**
   * What `createTask` stores for `input` at `now`, built once: the record is what a gateway routes before the create,
   * when the create also adds the job (a worker may end the task before the create's reply arrives). Passed back to
   * `createTask`, it is not built again (the profile of a plain call showed it built twice).
   */
  prepareCreate(input: CreateTaskInput & { taskId: string }, now: Date): PreparedCreate {
    const { fields, idemKey } = this.fieldsOf(input, input.taskId, now);
    const record = parseRecord(fields);
    if (!record) throw new TaskrelayError('INTERNAL', `Task ${input.taskId} has no valid record`);
    return { taskId: input.taskId, now, fields, idemKey, record };
  }

  private fieldsOf(input: CreateTaskInput, taskId: string, now: Date) {
    const iso = now.toISOString();
    const idemKey =
      input.idempotencyKey !== undefined
        ? this.runner.forTask(taskId).idempotency(input.principal, input.idempotencyKey)
        : input.dedupe === undefined
          ? undefined
          : this.runner.forTask(taskId).dedupe(input.principal, input.mode, input.tool, input.dedupe.digest);
    const fields: Record<string, string> = {
      [F.taskId]: taskId,
      [F.status]: 'working',
      [F.createdAt]: iso,
      [F.lastUpdatedAt]: iso,
      [F.ttl]: String(input.ttl),
      [F.pollInterval]: String(input.pollInterval),
      [F.tool]: input.tool,
      [F.queue]: input.queue,
      [F.principal]: input.principal,
      [F.mode]: input.mode,
    };
    if (input.sessionId !== undefined) fields[F.sessionId] = input.sessionId;
    if (input.gatewayId !== undefined) fields[F.gatewayId] = input.gatewayId;
    if (input.progressToken !== undefined) fields[F.progressToken] = JSON.stringify(input.progressToken);
    if (input.deadlineAt !== undefined) fields[F.deadlineAt] = String(input.deadlineAt);
    if (idemKey !== undefined) fields[F.idemKey] = idemKey;
    if (input.idempotencyKey === undefined && input.dedupe !== undefined) fields[F.dedupe] = '1';
    if (input.webhook !== undefined) {
      fields[F.webhook] = input.webhook.url;
      fields[F.webhookCap] = String(input.webhook.cap);
    }
    if (input.clientCapabilities !== undefined) fields[F.clientCaps] = input.clientCapabilities.join(',');
    if (input.tags !== undefined && input.tags.length > 0) fields[F.tags] = input.tags.join(',');
    if (input.replayOf !== undefined) fields[F.replayOf] = input.replayOf;
    if (input.waitingMessage !== undefined) {
      fields[F.statusMessage] = input.waitingMessage;
      fields[F.backOff] = '1';
    }
    if (input.steps !== undefined) fields[F.steps] = input.steps;
    return { fields, idemKey };
  }

  /**
   * Stores a new task, indexed for its principal (task mode) and in the live set; or, when the idempotency key
   * already names a live task of the principal, returns that one (PROTOCOL.md §10.8). Throws `OpenCapReached` when
   * the principal is at its open-work cap (`openTasks`).
   */
  async createTask(input: CreateTaskInput, now = new Date(), prepared?: PreparedCreate): Promise<CreateOutcome> {
    const usable = prepared !== undefined && prepared.taskId === input.taskId && prepared.now === now;
    // In the sharded layout a task created without an id goes to its tool's first shard (PROTOCOL.md §1.1).
    const taskId = usable
      ? prepared.taskId
      : (input.taskId ??
        newTaskId(
          this.runner.placement === undefined ? undefined : (await this.runner.placement.codes(input.queue))[0],
        ));
    const { fields, idemKey } = usable ? prepared : this.fieldsOf(input, taskId, now);
    const taskKey = this.runner.forTask(taskId).task(taskId);
    const flat = Object.entries(fields).flat();
    const script = {
      keys: {
        task: taskKey,
        principalIndex: this.runner.forTask(taskId).principalTasks(input.principal),
        live: this.runner.forTask(taskId).live,
        idempotency: idemKey ?? taskKey,
        share: input.fairShare ? this.runner.forTask(taskId).fairShare(input.queue, input.principal) : taskKey,
        openTasks: input.openTasks ? this.runner.forTask(taskId).principalOpenTasks(input.principal) : taskKey,
        taskIndex: this.runner.forTask(taskId).taskIndex,
        arguments: this.runner.forTask(taskId).taskArguments(taskId),
      },
      args: {
        fieldCount: flat.length,
        createdAtMs: now.getTime(),
        taskId,
        firstLookAtMs: now.getTime() + this.reaperIntervalMs,
        indexed: input.mode === 'task' ? '1' : '0',
        indexCap: this.indexCap,
        indexTtlMs: this.indexTtlMs,
        hasIdempotency: idemKey === undefined ? '0' : input.idempotencyKey === undefined ? '2' : '1',
        taskKeyPrefix: this.runner.forTask(taskId).taskKeyPrefix,
        shareTtlMs: input.fairShare ? input.fairShare.ttlMs : '',
        maxPriority: MAX_FAIR_PRIORITY,
        openMax: input.openTasks ? input.openTasks.max : '',
        openTtlMs: input.openTasks ? input.openTasks.ttlMs : '',
        priorityBase: input.fairShare?.base ?? 0,
        dedupeTtlMs: input.idempotencyKey === undefined && input.dedupe ? input.dedupe.ttlMs : '',
        arguments: input.argumentsJson ?? '',
        replayOf: input.replayOf ?? '',
        fields: flat,
      },
    };
    const job = input.fairShare ? input.job : undefined;
    const reply = job
      ? await this.runner.scripts.callCreateWithJob(script, job)
      : await this.runner.call(SCRIPTS.create, script);
    if (reply.code === ResultCode.OPEN_CAP) throw new OpenCapReached(Number(reply.values[0]));
    if (reply.code === ResultCode.IDEMPOTENT_REPLAY) {
      const [existingId, existingTool] = reply.values as [string, string];
      if (existingTool !== input.tool) {
        throw new TaskrelayError(
          'INVALID_ARGUMENTS',
          `Idempotency key already used for a task of tool ${existingTool}; use a new key for ${input.tool}`,
        );
      }
      const existing = await this.get(existingId);
      if (existing) return { record: existing, created: false };
      // Expired between the two reads: the key is free again.
      return this.createTask(input, now, prepared);
    }
    if (reply.code === ResultCode.TASK_EXISTS) throw new TaskrelayError('INTERNAL', `Task ${taskId} already exists`);
    // A copy of the prepared record: the caller's route holds that one.
    const record = usable ? { ...prepared.record } : parseRecord(fields);
    if (!record) throw new TaskrelayError('INTERNAL', `Task ${taskId} could not be read back`);
    if (!input.fairShare) return { record, created: true };
    // An add that did not answer the job's id stored no job: `jobAdded` false, the caller fails the task.
    return {
      record,
      created: true,
      priority: Number(reply.values[1]),
      jobAdded: job !== undefined && reply.values[2] === taskId,
    };
  }

  /**
   * Writes the deployment's retention policy (PROTOCOL.md §30.1): how long a task stays after it ended, per ending
   * status; a status left out keeps the task's own ttl. Every gateway writes it as it starts: the newest decides.
   */
  async setRetention(policy: Partial<Record<'completed' | 'failed' | 'cancelled', number>>): Promise<void> {
    const statuses = ['completed', 'failed', 'cancelled'] as const;
    const set = statuses.filter((s) => policy[s] !== undefined);
    const unset = statuses.filter((s) => policy[s] === undefined);
    // The sharded layout keeps a copy on every shard, beside the scripts that read it (PROTOCOL.md §1.1); a shard
    // placed later gets it from the next gateway start.
    const copies =
      this.runner.placement === undefined
        ? [this.runner.keys]
        : [this.runner.keys, ...(await this.runner.everyShard())];
    for (const keys of copies) {
      const tx = this.runner.redis.multi();
      if (set.length > 0) tx.hset(keys.retention, Object.fromEntries(set.map((s) => [s, String(policy[s])])));
      if (unset.length > 0) tx.hdel(keys.retention, ...unset);
      await tx.exec();
    }
  }

  async get(taskId: string): Promise<TaskRecord | undefined> {
    if (this.largeReads === undefined)
      return parseRecord(await this.runner.redis.hgetall(this.runner.forTask(taskId).task(taskId)));
    const reply = await this.runner.call(SCRIPTS.read, {
      keys: { task: this.runner.forTask(taskId).task(taskId) },
      args: { inlineMax: this.largeReads.inlineMaxBytes },
    });
    return parseRecord(await this.withLargeResult(taskId, flatToHash(reply.values[0]), reply.values[1]));
  }

  /** `h` with its result read apart when the script left it out for its size (§22.5). */
  private async withLargeResult(
    taskId: string,
    h: Record<string, string>,
    resultBytes: unknown,
  ): Promise<Record<string, string>> {
    const large = this.largeReads;
    if (large === undefined || Number(resultBytes ?? 0) <= large.inlineMaxBytes || h[F.status] === undefined) return h;
    const result = await large.read(h[F.principal] ?? '', (client) =>
      client.hget(this.runner.forTask(taskId).task(taskId), F.result),
    );
    if (result !== null) h[F.result] = result;
    return h;
  }

  /**
   * Reads a task and, while it is not terminal, registers `gatewayId` to receive its status events (a waiter on
   * another gateway than the owner): one round trip (PROTOCOL.md §10.9).
   */
  async watch(taskId: string, gatewayId: string): Promise<TaskRecord | undefined> {
    const reply = await this.runner.call(SCRIPTS.watch, {
      keys: { task: this.runner.forTask(taskId).task(taskId) },
      // Without large reads (a worker's store) every result comes inline, as before.
      args: { gatewayId, inlineMax: this.largeReads?.inlineMaxBytes ?? Number.MAX_SAFE_INTEGER },
    });
    const h = reply.code === ResultCode.OK ? fromFlat(reply.values[0] as string[]) : undefined;
    return h === undefined ? undefined : parseRecord(await this.withLargeResult(taskId, h, reply.values[1]));
  }

  /**
   * A plain call becomes a task of its principal (PROTOCOL.md §17.4): mode `task`, the granted ttl, listed in the
   * principal's index. False when the call is gone, is not a call, or has ended.
   */
  async becomeTask(record: Pick<TaskRecord, 'taskId' | 'principal' | 'createdAt'>, ttl: number): Promise<boolean> {
    const reply = await this.runner.call(SCRIPTS.becomeTask, {
      keys: {
        task: this.runner.forTask(record.taskId).task(record.taskId),
        principalIndex: this.runner.forTask(record.taskId).principalTasks(record.principal),
        taskIndex: this.runner.forTask(record.taskId).taskIndex,
      },
      args: {
        ttl: String(ttl),
        indexCap: String(this.indexCap),
        indexTtlMs: String(this.indexTtlMs),
        taskId: record.taskId,
        createdAtMs: String(Date.parse(record.createdAt) || Date.now()),
      },
    });
    return reply.code === ResultCode.OK;
  }

  /**
   * A plain call's retried input round takes its route (PROTOCOL.md §17.3): `gatewayId` becomes its owner, with the
   * retry's progress token (none: its progress goes nowhere); the previous owner stays a watcher. False when the call
   * is gone, is not a plain call, or has ended.
   */
  async routeCall(taskId: string, gatewayId: string, progressToken: ProgressToken | undefined): Promise<boolean> {
    const reply = await this.runner.call(SCRIPTS.routeCall, {
      keys: { task: this.runner.forTask(taskId).task(taskId) },
      args: { gatewayId, progressToken: progressToken === undefined ? '' : JSON.stringify(progressToken) },
    });
    return reply.code === ResultCode.OK;
  }

  /** The live set (tasks not terminal yet), oldest first, at most `limit` ids. */
  async liveIds(limit: number): Promise<string[]> {
    if (limit <= 0) return [];
    if (this.runner.placement === undefined) return this.runner.redis.zrange(this.runner.keys.live, 0, limit - 1);
    // Sharded: each shard's oldest, merged, at most `limit` in all (PROTOCOL.md §1.1).
    const pages = await Promise.all(
      (await this.runner.everyShard()).map((keys) => this.runner.redis.zrange(keys.live, 0, limit - 1, 'WITHSCORES')),
    );
    const entries: Array<{ id: string; score: number }> = [];
    for (const rows of pages) {
      for (let i = 0; i + 1 < rows.length; i += 2) entries.push({ id: rows[i] ?? '', score: Number(rows[i + 1]) });
    }
    return entries
      .sort((a, b) => a.score - b.score)
      .slice(0, limit)
      .map((e) => e.id);
  }

  /**
   * Many tasks in one round trip, for operators' views: missing ones skipped, in the order given. The result is left
   * out (a page shows none, and many large ones read at once would hold Redis up, §22.5); `get` reads one whole. Of
   * the input requests (§12.2), only those waiting for an answer are read (`inputRequests` holds just them), in a
   * second round trip made only when some task waits for one.
   */
  async summaries(taskIds: readonly string[]): Promise<TaskRecord[]> {
    if (taskIds.length === 0) return [];
    const hashes = await this.readFields(taskIds.map((id) => ({ id, fields: SUMMARY_FIELDS })));
    const asking = hashes.flatMap((h) => {
      const pending = h[F.pendingInput]?.split(',').filter(Boolean) ?? [];
      const fields = pending.map((n) => `${TASK_FIELD_PREFIXES.input}${n}`);
      return fields.length > 0 ? [{ h, id: h[F.taskId] ?? '', fields }] : [];
    });
    if (asking.length > 0) {
      const questions = await this.readFields(asking);
      asking.forEach(({ h }, i) => Object.assign(h, questions[i]));
    }
    return hashes.map((h) => parseRecord(h)).filter((record) => record !== undefined);
  }

  /** Some fields of each task hash, in one round trip: each as a hash of the fields present (empty when missing). */
  private async readFields(reads: ReadonlyArray<{ id: string; fields: readonly string[] }>) {
    const ids = reads.map((r) => r.id);
    const replies = await pipelineByShard(this.runner.redis, this.runner.keys, ids, (pipeline, id, i) =>
      pipeline.hmget(this.runner.forTask(id).task(id), ...(reads[i]?.fields ?? [])),
    );
    return reads.map(({ fields }, at) => {
      const h: Record<string, string> = {};
      ((replies[at]?.[1] as Array<string | null> | null) ?? []).forEach((v, i) => {
        if (v !== null) h[fields[i] as string] = v;
      });
      return h;
    });
  }

  /** Live tasks counted by tool and status, from two fields of each of at most `limit` live tasks. */
  async liveCounts(limit: number): Promise<Array<{ tool: string; status: string; count: number }>> {
    const ids = await this.liveIds(limit);
    const counts = new Map<string, { tool: string; status: string; count: number }>();
    if (ids.length === 0) return [];
    const replies = await pipelineByShard(this.runner.redis, this.runner.keys, ids, (pipeline, id) =>
      pipeline.hmget(this.runner.forTask(id).task(id), F.tool, F.status),
    );
    for (const [, value] of replies) {
      const [tool, status] = (value ?? []) as Array<string | null>;
      if (!tool || !status) continue;
      const key = `${tool}\u0000${status}`;
      const entry = counts.get(key) ?? { tool, status, count: 0 };
      entry.count++;
      counts.set(key, entry);
    }
    return [...counts.values()];
  }

  /**
   * The tool versions live tasks last ran (PROTOCOL.md §24.9), each pair once, from two fields of each of at most
   * `limit` live tasks: a task that has not run yet records none.
   */
  async liveToolVersions(limit: number): Promise<Array<{ tool: string; version: string }>> {
    const ids = await this.liveIds(limit);
    if (ids.length === 0) return [];
    const replies = await pipelineByShard(this.runner.redis, this.runner.keys, ids, (pipeline, id) =>
      pipeline.hmget(this.runner.forTask(id).task(id), F.tool, F.toolVersion),
    );
    const pairs = new Map<string, { tool: string; version: string }>();
    for (const [, value] of replies) {
      const [tool, version] = (value ?? []) as Array<string | null>;
      if (tool && version) pairs.set(`${tool}\u0000${version}`, { tool, version });
    }
    return [...pairs.values()];
  }

  /**
   * Statuses of many tasks in one round trip (undefined for missing ones). A read that failed (Redis unreachable
   * mid-pipeline, a failover) throws: it is no missing task.
   */
  async statuses(taskIds: readonly string[]): Promise<Array<TaskStatus | undefined>> {
    if (taskIds.length === 0) return [];
    const replies = await pipelineByShard(this.runner.redis, this.runner.keys, taskIds, (pipeline, id) =>
      pipeline.hget(this.runner.forTask(id).task(id), F.status),
    );
    return replies.map(([error, value]) => {
      if (error) throw error;
      return asStatus(value);
    });
  }

  /**
   * Why each of many tasks is no longer live, in one round trip: its status, and for a terminal one the cancel reason
   * or error code (a worker's sweep turns these into the abort reason of a run it still has). A task whose read
   * failed (Redis unreachable for its slot, a failover) has no entry (`undefined`), never a missing status
   * (PROTOCOL.md §10.10): the sweep must not abort a run for a task it could not read.
   */
  async endStates(
    taskIds: readonly string[],
  ): Promise<Array<{ status: TaskStatus | undefined; cancelReason?: CancelReason; errorCode?: string } | undefined>> {
    if (taskIds.length === 0) return [];
    const replies = await pipelineByShard(this.runner.redis, this.runner.keys, taskIds, (pipeline, id) =>
      pipeline.hmget(this.runner.forTask(id).task(id), F.status, F.cancelReason, F.error),
    );
    return taskIds.map((_, i) => {
      const [failed, value] = replies[i] ?? [new Error('no reply'), null];
      if (failed) return undefined;
      const [status, cancelReason, error] = (value as Array<string | null> | null) ?? [];
      const state: { status: TaskStatus | undefined; cancelReason?: CancelReason; errorCode?: string } = {
        status: asStatus(status),
      };
      if (cancelReason) state.cancelReason = cancelReason as CancelReason;
      const code = parseJson<SerializedError>(error ?? undefined)?.code;
      if (code !== undefined) state.errorCode = code;
      return state;
    });
  }

  /** A task-mode task's arguments as its call sent them (JSON, PROTOCOL.md §30.2), while the task is kept. */
  async getArguments(taskId: string): Promise<string | undefined> {
    return (await this.runner.redis.get(this.runner.forTask(taskId).taskArguments(taskId))) ?? undefined;
  }

  /**
   * One principal's task-mode tasks, newest first, after an opaque cursor: no duplicates or gaps between pages. In the
   * sharded layout each shard's index gives its first page after the cursor and the pages merge in the same order
   * (score, then id, both descending), so the merged page is the one a single index would give (PROTOCOL.md §1.1).
   */
  async list(principal: string, cursor: string | undefined, limit = 50): Promise<TaskPage> {
    const after = cursor === undefined ? undefined : decodeCursor(cursor);
    const pages = await Promise.all(
      (await this.runner.everyShard()).map(async (keys) => {
        const indexKey = keys.principalTasks(principal);
        const reply = await this.runner.call(SCRIPTS.list, {
          keys: { index: indexKey },
          args: { cursorScore: after === undefined ? '' : String(after.s), cursorId: after?.id ?? '', limit },
        });
        const rows = (reply.values[0] as string[] | undefined) ?? [];
        const found: Array<{ id: string; score: number; indexKey: string }> = [];
        for (let i = 0; i + 1 < rows.length; i += 2) {
          found.push({ id: rows[i] ?? '', score: Number(rows[i + 1]), indexKey });
        }
        return found;
      }),
    );
    const entries = pages.length === 1 ? (pages[0] ?? []) : pages.flat().sort(newestFirst);
    const pageEntries = entries.slice(0, limit);
    let replies: Array<[unknown, unknown]>;
    if (this.largeReads !== undefined) {
      // A page lists tasks, not their results: no result is read, however large (§22.5).
      replies = await Promise.all(
        pageEntries.map(async ({ id }) => {
          const reply = await this.runner.call(SCRIPTS.read, {
            keys: { task: this.runner.forTask(id).task(id) },
            args: { inlineMax: -1 },
          });
          return [null, flatToHash(reply.values[0])] as [unknown, unknown];
        }),
      );
    } else {
      const ids = pageEntries.map((e) => e.id);
      replies = await pipelineByShard(this.runner.redis, this.runner.keys, ids, (pipeline, id) =>
        pipeline.hgetall(this.runner.forTask(id).task(id)),
      );
    }
    const tasks: TaskRecord[] = [];
    const expired = new Map<string, string[]>();
    replies.forEach(([, value], i) => {
      const record = parseRecord(value as Record<string, string>);
      const entry = pageEntries[i];
      if (record) tasks.push(record);
      else if (entry) expired.set(entry.indexKey, [...(expired.get(entry.indexKey) ?? []), entry.id]);
    });
    // Expired hashes leave their index entries behind; tidy them lazily.
    for (const [indexKey, ids] of expired) await this.runner.redis.zrem(indexKey, ...ids);
    const page: TaskPage = { tasks };
    const last = pageEntries.at(-1);
    if (entries.length > limit && last) page.nextCursor = encodeCursor({ s: last.score, id: last.id });
    return page;
  }
}

interface Cursor {
  /** Score (createdAt ms) of the last entry of the previous page. */
  s: number;
  /** Its task id: ties on the score are ordered by id. */
  id: string;
}

/** The index's order: newest first, ties by id descending (what `list-1.lua` pages by). */
function newestFirst(a: { id: string; score: number }, b: { id: string; score: number }): number {
  return b.score - a.score || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

function encodeCursor(cursor: Cursor): string {
  return Buffer.from(JSON.stringify(cursor)).toString('base64url');
}

function decodeCursor(cursor: string): Cursor {
  try {
    const parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as Partial<Cursor>;
    if (typeof parsed.s === 'number' && Number.isFinite(parsed.s) && typeof parsed.id === 'string') {
      return { s: parsed.s, id: parsed.id };
    }
  } catch {
    // fall through
  }
  throw new TaskrelayError('INVALID_ARGUMENTS', 'Invalid cursor');
}

import { randomFillSync } from 'node:crypto';
import { TaskrelayError, type SerializedError } from './protocol/errors.js';
import type { RedisClient } from './redis.js';
import type { Keys } from './protocol/keys.js';
import { ShardPlacement, pipelineByShard } from './placement.js';
import { MAX_FAIR_PRIORITY } from './fair-share.js';
import { parseMessage, type StatusEvent } from './protocol/messages.js';
import { ResultCode, type ScriptReply } from './protocol/script-results.js';
import { SCRIPTS, ScriptRunner, scriptsGeneration, type JobAddScript, type ScriptInput } from './protocol/scripts.js';

/** How long a scripts generation stays known in `P:protocol` after its last announcement (§29.2). */
const GENERATION_KEPT_MS = 30 * 86_400_000;

export type { JobAddScript } from './protocol/scripts.js';
import { TASK_FIELDS as F, TASK_FIELD_PREFIXES } from './protocol/task-fields.js';
import { WaitpointRecordSchema, type WaitpointRecord } from './waitpoints.js';
import {
  MAX_TAGS,
  TASK_STATUSES,
  isTerminal,
  type CancelReason,
  type InputRequest,
  type LogLevel,
  type ProgressToken,
  type TaskMode,
  type TaskRecord,
  type TaskStatus,
  type ToolResult,
} from './protocol/task-model.js';

export interface CreateTaskInput {
  /** Defaults to a fresh 128-bit random id. */
  taskId?: string;
  tool: string;
  queue: string;
  principal: string;
  mode: TaskMode;
  ttl: number;
  pollInterval: number;
  sessionId?: string;
  gatewayId?: string;
  progressToken?: ProgressToken;
  /** When the reaper fails the task if it is still not terminal (ms since epoch). Default: no deadline. */
  deadlineAt?: number;
  /** The principal's idempotency key (task mode): a second create with it returns the first task. */
  idempotencyKey?: string;
  /**
   * A dedupe digest (§25.2), when there is no idempotency key: a create with the same principal, mode, tool and digest
   * while the task it named is unfinished returns that task; the mapping lives `ttlMs` at most, and goes when the
   * task ends.
   */
  dedupe?: { digest: string; ttlMs: number };
  /** What the caller's client can answer (`elicitation`, `sampling`): `ctx.elicit` refuses what it cannot (§12). */
  clientCapabilities?: readonly string[];
  /** The call's tags (`_meta["dev.taskrelay/tags"]`, already checked: §30.2). */
  tags?: readonly string[];
  /** The call's arguments as JSON: a task-mode task keeps them for a replay (§30.2). */
  argumentsJson?: string;
  /** The task this one replays (§30.3): linked both ways as it is created. */
  replayOf?: string;
  /**
   * A `statusMessage` that says why the task waits before its first run (a delayed start, PROTOCOL.md §33.1): stored
   * with the back-off mark, so the run's start clears it as it clears a back-off's message (§3.4).
   */
  waitingMessage?: string;
  /** Completed `ctx.step` results the task starts with (a redrive, §30.3), JSON. */
  steps?: string;
  /**
   * The completion webhook the caller named, already checked by the gateway (PROTOCOL.md §27.1), and the most events
   * of this principal that may wait for delivery at once (`cap`).
   */
  webhook?: { url: string; cap: number };
  /**
   * Enter the task's job in its principal's fair share of `queue` in the same step (PROTOCOL.md §25), the share
   * outliving it by `ttlMs`; the outcome's `priority` is what to add the job with.
   */
  fairShare?: { ttlMs: number; /** The job's priority level's base (§25.1); 0 (level 1) when absent. */ base?: number };
  /**
   * The principal's open-work cap (PROTOCOL.md §25), checked and counted in the same step: the task joins the
   * principal's open-work set unless it holds `max` or more members already (then nothing is created). The set
   * outlives its newest member by `ttlMs`.
   */
  openTasks?: { max: number; ttlMs: number };
  /**
   * The task's job, added in the same round trip once the task is created (with the fair-share priority, so
   * `fairShare` must be given too). A create that creates nothing adds no job.
   */
  job?: JobAddScript;
}

/** The most log lines a task keeps (PROTOCOL.md §30.4), and the longest one, in bytes (a longer one is cut). */
export const MAX_KEPT_LOG_LINES = 1_000;
export const MAX_KEPT_LOG_LINE_BYTES = 2_048;

/** A kept log line as readers get it: its stream id and time, then the line's own fields. */
export type KeptLogLine = Record<string, unknown> & { id: string; time: string };

export interface CreateOutcome {
  record: TaskRecord;
  /** false when the idempotency key named a live task, which `record` is. */
  created: boolean;
  /** The job's fair-share priority, when created with `fairShare`. */
  priority?: number;
  /** true when `job` was added with the task; false when it was given and its add refused (no job exists). */
  jobAdded?: boolean;
}

/** A create refused at the principal's open-work cap (`CreateTaskInput.openTasks`): nothing was created. */
/** What `summaries` reads of a task: every field but its result. */
const SUMMARY_FIELDS: readonly string[] = Object.values(F).filter((field) => field !== F.result);

export class OpenCapReached extends TaskrelayError {
  constructor(
    /** How many members the principal's open-work set holds. */
    readonly open: number,
  ) {
    super('TOO_MANY_OPEN_TASKS', `Open-work cap reached (${open} open)`);
    this.name = 'OpenCapReached';
  }
}

export interface RedisTaskStoreOptions {
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

/** A worker's proof that it holds the job's BullMQ lock (PROTOCOL.md §10.4). */
export interface JobLock {
  queue: string;
  token: string;
}

export interface TransitionOptions {
  /** Refuse the write unless this lock is held (a worker's write). */
  lock?: JobLock;
  /** The gateway answering a cancel for a task owned by another gateway: the owner acks on its channel (§10.9). */
  ackTo?: string;
  /** Move the task's deadline (ms since epoch). */
  deadlineAt?: number;
  /** On a terminal write, free the task's idempotency key at once (the task never ran: a retry starts anew). */
  dropIdempotency?: boolean;
}

export interface ReapedTask {
  taskId: string;
  code: string;
  message: string;
}

export interface ReapOutcome {
  /** false when another process holds the reaper lease. */
  ran: boolean;
  looked: number;
  reaped: ReapedTask[];
}

export interface TransitionFields {
  statusMessage?: string;
  result?: ToolResult;
  error?: SerializedError;
  cancelReason?: CancelReason;
}

/** A create's fields and record, built once (`prepareCreate`) for the route and the create script alike. */
export interface PreparedCreate {
  taskId: string;
  now: Date;
  fields: Record<string, string>;
  idemKey: string | undefined;
  record: TaskRecord;
}

export type TransitionOutcome =
  | { ok: true; status: TaskStatus }
  /**
   * `status` is what the task already was (the write that won), or undefined when the task does not exist;
   * `lockLost` when the write was a worker's and another run holds the job now.
   */
  | { ok: false; status: TaskStatus | undefined; lockLost?: true };

export type ProgressOutcome = 'accepted' | 'stale' | 'missing' | 'terminal' | 'lock_lost';

/** How `recordLog` ended: `unrouted` when no gateway holds the caller's session (nobody to tell). */
/** `dropped`: not published, the gateway's backlog was full (PROTOCOL.md §22.4). */
export type LogOutcome = 'published' | 'unrouted' | 'dropped' | 'missing' | 'terminal' | 'lock_lost';

/** One tool log message (PROTOCOL.md §15): MCP's `notifications/message` params. */
export interface LogMessage {
  level: LogLevel;
  /** Any JSON value. */
  data: unknown;
  logger?: string;
}

/** What `startRun` finds: the task (undefined when missing), or that the lock is no longer this run's. */
export type StartOutcome =
  | {
      lockLost: false;
      record: TaskRecord | undefined;
      /** The task records this other tool version (§12.11). */ versionOther?: string;
    }
  | { lockLost: true };

/** What a run's start records (PROTOCOL.md §10.2, §21.2.1). */
export interface RunStart {
  taskId: string;
  lock: JobLock;
  attempt: number;
  deadlineAt: number;
  /** The principal whose waiting share of the pool the job leaves (§25). */
  sharePrincipal?: string | undefined;
  version?: { toolVersion?: string; deferIfOther?: boolean; reset?: boolean };
  /** When the run began: its `startedAt` when the task has none (default: now). */
  startedAt?: Date;
}

export interface ProgressUpdate {
  progress: number;
  total?: number;
  message?: string;
}

/** How `suspend` ended (PROTOCOL.md §12.2). */
export type SuspendOutcome =
  /**
   * `answers` holds the requests that were already answered (by number): the run goes on when every request it
   * asked is in there, and is suspended otherwise (the others are pending now).
   */
  | { outcome: 'suspended'; answers: Record<string, unknown> }
  | { outcome: 'lock_lost' }
  /** The task is missing or terminal (`status` undefined when missing). */
  | { outcome: 'gone'; status: TaskStatus | undefined };

export interface SuspendInput {
  /** The input requests to ask (asked at once), each as request number `n`; empty or omitted for a timed suspension. */
  requests?: Array<{ n: number } & InputRequest>;
  /** The task's deadline while it is suspended (ms since epoch). */
  deadlineAt: number;
  /** A timed suspension's status message (a back-off says why and until when, PROTOCOL.md §3.4). */
  statusMessage?: string;
}

/**
 * How `answerInput` ended: `queue` is the task's job queue; `resumed` when that was the last pending request, so the
 * task is `working` again and the caller promotes its delayed job (§12.3).
 */
export type AnswerOutcome =
  { ok: true; queue: string; resumed: boolean } | { ok: false; status: TaskStatus | undefined };

/** The largest serialised `ctx.state` (and `ctx.step` results together) a task may keep: 64 KiB. */
export const MAX_STATE_BYTES = 65_536;

export interface TaskPage {
  tasks: TaskRecord[];
  nextCursor?: string;
}

/** Random bytes for task ids, drawn 256 ids at a time (as `crypto.randomUUID` caches its entropy). */
const ID_POOL = Buffer.alloc(16 * 256);
let idPoolOffset = ID_POOL.length;

/**
 * Task ids are 128 random bits, hex: unguessable, so an id alone reveals nothing (the MCP tasks specification,
 * security considerations). One `randomBytes(16)` per id was 2% of the gateway's CPU on the SDK-client task cycle
 * (`pnpm bench:profile --client sdk`): the bytes now come from a pool refilled by one call per 256 ids.
 */
export function newTaskId(shard?: string): string {
  // The sharded layout's ids start with their shard's code (PROTOCOL.md §1.1), the 128 random bits after it.
  if (shard !== undefined) return `${shard}${newTaskId()}`;
  if (idPoolOffset === ID_POOL.length) {
    randomFillSync(ID_POOL);
    idPoolOffset = 0;
  }
  const id = ID_POOL.toString('hex', idPoolOffset, idPoolOffset + 16);
  idPoolOffset += 16;
  return id;
}

/** Largest outcome (result + error JSON, in UTF-16 units) a terminal status event carries; a bigger one is read. */
export const MAX_EVENT_OUTCOME_CHARS = 64 * 1024;

/**
 * Reads of large results, apart from everything else (PROTOCOL.md §22.5): each on a connection of its own, one at a
 * time per connection, at most `perPrincipal` at once for one principal; the others wait their turn in order. Before,
 * ten concurrent 16 MiB results went over the gateway's one command connection: nine of them timed out as `Task store
 * unavailable`, and every other principal's commands queued behind them. Hand-written: two counting semaphores.
 */
class LargeReads {
  private readonly idle: RedisClient[];
  private readonly waiting: Array<() => void> = [];
  private readonly perPrincipalActive = new Map<string, number>();
  private readonly perPrincipalWaiting = new Map<string, Array<() => void>>();

  constructor(
    connections: RedisClient[],
    private readonly perPrincipal: number,
  ) {
    this.idle = [...connections];
  }

  async read<T>(principal: string, fn: (client: RedisClient) => Promise<T>): Promise<T> {
    await this.enterPrincipal(principal);
    try {
      const client = await this.takeConnection();
      try {
        return await fn(client);
      } finally {
        this.idle.push(client);
        this.waiting.shift()?.();
      }
    } finally {
      this.leavePrincipal(principal);
    }
  }

  private async takeConnection(): Promise<RedisClient> {
    while (this.idle.length === 0) await new Promise<void>((resolve) => this.waiting.push(resolve));
    return this.idle.pop() as RedisClient;
  }

  private async enterPrincipal(principal: string): Promise<void> {
    while ((this.perPrincipalActive.get(principal) ?? 0) >= this.perPrincipal) {
      await new Promise<void>((resolve) => {
        const queue = this.perPrincipalWaiting.get(principal) ?? [];
        queue.push(resolve);
        this.perPrincipalWaiting.set(principal, queue);
      });
    }
    this.perPrincipalActive.set(principal, (this.perPrincipalActive.get(principal) ?? 0) + 1);
  }

  private leavePrincipal(principal: string): void {
    const left = (this.perPrincipalActive.get(principal) ?? 1) - 1;
    if (left > 0) this.perPrincipalActive.set(principal, left);
    else this.perPrincipalActive.delete(principal);
    const queue = this.perPrincipalWaiting.get(principal);
    const next = queue?.shift();
    if (queue !== undefined && queue.length === 0) this.perPrincipalWaiting.delete(principal);
    next?.();
  }
}

/** A script's flat `name, value, ...` reply as a hash. */
function flatToHash(flat: unknown): Record<string, string> {
  const h: Record<string, string> = {};
  if (!Array.isArray(flat)) return h;
  for (let i = 0; i + 1 < flat.length; i += 2) h[String(flat[i])] = String(flat[i + 1]);
  return h;
}

/**
 * The Redis task store. Gateway and worker both use it; every status change goes through `transition`, which checks
 * the state machine atomically (Lua), so a terminal task never changes.
 */
export class RedisTaskStore {
  private readonly scripts: ScriptRunner;
  private readonly reaperIntervalMs: number;
  private readonly indexCap: number;
  private readonly indexTtlMs: number;

  private readonly largeReads: (LargeReads & { inlineMaxBytes: number }) | undefined;
  /** The placement registry, in the sharded layout (PROTOCOL.md §1.1): what a reader of every shard reads. */
  readonly placement: ShardPlacement | undefined;

  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
    options: RedisTaskStoreOptions = {},
  ) {
    this.scripts = new ScriptRunner(redis);
    const large = options.largeReads;
    if (large !== undefined && large.connections.length > 0) {
      this.largeReads = Object.assign(new LargeReads(large.connections, large.perPrincipal), {
        inlineMaxBytes: large.inlineMaxBytes,
      });
    }
    this.reaperIntervalMs = options.reaperIntervalMs ?? 5_000;
    this.indexCap = options.indexCap ?? 10_000;
    this.indexTtlMs = options.indexTtlMs ?? 30 * 86_400_000;
    this.placement = keys.layout === 'sharded' ? new ShardPlacement(redis, keys) : undefined;
  }

  /** The keys of every shard tasks may be on: this layout's one set, or every placed shard's (PROTOCOL.md §1.1). */
  async everyShard(): Promise<Keys[]> {
    if (this.placement === undefined) return [this.keys];
    return (await this.placement.all()).map((code) => this.keys.forShard(code));
  }

  async create(input: CreateTaskInput, now = new Date()): Promise<TaskRecord> {
    return (await this.createTask(input, now)).record;
  }

  /**
   * Stores a new task, indexed for its principal (task mode) and in the live set; or, when the idempotency key
   * already names a live task of the principal, returns that one (PROTOCOL.md §10.8). Throws `OpenCapReached` when
   * the principal is at its open-work cap (`openTasks`).
   */
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
        ? this.keys.forTask(taskId).idempotency(input.principal, input.idempotencyKey)
        : input.dedupe === undefined
          ? undefined
          : this.keys.forTask(taskId).dedupe(input.principal, input.mode, input.tool, input.dedupe.digest);
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

  async createTask(input: CreateTaskInput, now = new Date(), prepared?: PreparedCreate): Promise<CreateOutcome> {
    const usable = prepared !== undefined && prepared.taskId === input.taskId && prepared.now === now;
    // In the sharded layout a task created without an id goes to its tool's first shard (PROTOCOL.md §1.1).
    const taskId = usable
      ? prepared.taskId
      : (input.taskId ??
        newTaskId(this.placement === undefined ? undefined : (await this.placement.codes(input.queue))[0]));
    const { fields, idemKey } = usable ? prepared : this.fieldsOf(input, taskId, now);
    const taskKey = this.keys.forTask(taskId).task(taskId);
    const script = {
      keys: {
        task: taskKey,
        principalIndex: this.keys.forTask(taskId).principalTasks(input.principal),
        live: this.keys.forTask(taskId).live,
        idempotency: idemKey ?? taskKey,
        share: input.fairShare ? this.keys.forTask(taskId).fairShare(input.queue, input.principal) : taskKey,
        openTasks: input.openTasks ? this.keys.forTask(taskId).principalOpenTasks(input.principal) : taskKey,
        taskIndex: this.keys.forTask(taskId).taskIndex,
        arguments: this.keys.forTask(taskId).taskArguments(taskId),
      },
      args: {
        fields: JSON.stringify(fields),
        createdAtMs: now.getTime(),
        taskId,
        firstLookAtMs: now.getTime() + this.reaperIntervalMs,
        indexed: input.mode === 'task' ? '1' : '0',
        indexCap: this.indexCap,
        indexTtlMs: this.indexTtlMs,
        hasIdempotency: idemKey === undefined ? '0' : input.idempotencyKey === undefined ? '2' : '1',
        taskKeyPrefix: this.keys.forTask(taskId).taskKeyPrefix,
        shareTtlMs: input.fairShare ? input.fairShare.ttlMs : '',
        maxPriority: MAX_FAIR_PRIORITY,
        openMax: input.openTasks ? input.openTasks.max : '',
        openTtlMs: input.openTasks ? input.openTasks.ttlMs : '',
        priorityBase: input.fairShare?.base ?? 0,
        dedupeTtlMs: input.idempotencyKey === undefined && input.dedupe ? input.dedupe.ttlMs : '',
        arguments: input.argumentsJson ?? '',
      },
    };
    const job = input.fairShare ? input.job : undefined;
    const reply = job
      ? await this.scripts.callCreateWithJob(script, job)
      : await this.scripts.call(SCRIPTS.create, script);
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
   * Records that a process running this build's scripts started (PROTOCOL.md §29.2): `P:protocol` maps each generation
   * to when it was last announced. Generations not announced for 30 days are dropped, so a worker of a long-gone
   * generation is refused again. Returns this build's generation.
   */
  async announceScriptsGeneration(now = Date.now()): Promise<string> {
    const generation = scriptsGeneration();
    const seen = await this.redis.hgetall(this.keys.protocol);
    const stale = Object.entries(seen)
      .filter(([other, at]) => other !== generation && now - Number(at) > GENERATION_KEPT_MS)
      .map(([other]) => other);
    const tx = this.redis.multi().hset(this.keys.protocol, generation, String(now));
    if (stale.length > 0) tx.hdel(this.keys.protocol, ...stale);
    await tx.exec();
    return generation;
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
    const copies = this.placement === undefined ? [this.keys] : [this.keys, ...(await this.everyShard())];
    for (const keys of copies) {
      const tx = this.redis.multi();
      if (set.length > 0) tx.hset(keys.retention, Object.fromEntries(set.map((s) => [s, String(policy[s])])));
      if (unset.length > 0) tx.hdel(keys.retention, ...unset);
      await tx.exec();
    }
  }

  async get(taskId: string): Promise<TaskRecord | undefined> {
    if (this.largeReads === undefined)
      return parseRecord(await this.redis.hgetall(this.keys.forTask(taskId).task(taskId)));
    const reply = await this.scripts.call(SCRIPTS.read, {
      keys: { task: this.keys.forTask(taskId).task(taskId) },
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
      client.hget(this.keys.forTask(taskId).task(taskId), F.result),
    );
    if (result !== null) h[F.result] = result;
    return h;
  }

  /**
   * Reads a task and, while it is not terminal, registers `gatewayId` to receive its status events (a waiter on
   * another gateway than the owner): one round trip (PROTOCOL.md §10.9).
   */
  async watch(taskId: string, gatewayId: string): Promise<TaskRecord | undefined> {
    const reply = await this.scripts.call(SCRIPTS.watch, {
      keys: { task: this.keys.forTask(taskId).task(taskId) },
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
    const reply = await this.scripts.call(SCRIPTS.becomeTask, {
      keys: {
        task: this.keys.forTask(record.taskId).task(record.taskId),
        principalIndex: this.keys.forTask(record.taskId).principalTasks(record.principal),
        taskIndex: this.keys.forTask(record.taskId).taskIndex,
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
    const reply = await this.scripts.call(SCRIPTS.routeCall, {
      keys: { task: this.keys.forTask(taskId).task(taskId) },
      args: { gatewayId, progressToken: progressToken === undefined ? '' : JSON.stringify(progressToken) },
    });
    return reply.code === ResultCode.OK;
  }

  /** The live set (tasks not terminal yet), oldest first, at most `limit` ids. */
  async liveIds(limit: number): Promise<string[]> {
    if (limit <= 0) return [];
    if (this.placement === undefined) return this.redis.zrange(this.keys.live, 0, limit - 1);
    // Sharded: each shard's oldest, merged, at most `limit` in all (PROTOCOL.md §1.1).
    const pages = await Promise.all(
      (await this.everyShard()).map((keys) => this.redis.zrange(keys.live, 0, limit - 1, 'WITHSCORES')),
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
    const replies = await pipelineByShard(this.redis, this.keys, ids, (pipeline, id, i) =>
      pipeline.hmget(this.keys.forTask(id).task(id), ...(reads[i]?.fields ?? [])),
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
    const replies = await pipelineByShard(this.redis, this.keys, ids, (pipeline, id) =>
      pipeline.hmget(this.keys.forTask(id).task(id), F.tool, F.status),
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
    const replies = await pipelineByShard(this.redis, this.keys, ids, (pipeline, id) =>
      pipeline.hmget(this.keys.forTask(id).task(id), F.tool, F.toolVersion),
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
    const replies = await pipelineByShard(this.redis, this.keys, taskIds, (pipeline, id) =>
      pipeline.hget(this.keys.forTask(id).task(id), F.status),
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
    const replies = await pipelineByShard(this.redis, this.keys, taskIds, (pipeline, id) =>
      pipeline.hmget(this.keys.forTask(id).task(id), F.status, F.cancelReason, F.error),
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

  /** Atomically moves a task to `to` if the state machine allows it from its current status. */
  async transition(
    taskId: string,
    to: TaskStatus,
    fields: TransitionFields = {},
    options: TransitionOptions = {},
    now = new Date(),
  ): Promise<TransitionOutcome> {
    const reply = await this.scripts.call(SCRIPTS.transition, this.transitionInput(taskId, to, fields, options, now));
    return transitionOutcome(reply, to);
  }

  private transitionInput(
    taskId: string,
    to: TaskStatus,
    fields: TransitionFields,
    options: TransitionOptions,
    now: Date,
  ): ScriptInput<typeof SCRIPTS.transition> {
    const extra: Record<string, string> = {};
    if (fields.statusMessage !== undefined) extra[F.statusMessage] = fields.statusMessage;
    if (fields.result !== undefined) extra[F.result] = JSON.stringify(fields.result);
    if (fields.error !== undefined) extra[F.error] = JSON.stringify(fields.error);
    if (fields.cancelReason !== undefined) extra[F.cancelReason] = fields.cancelReason;
    const taskKey = this.keys.forTask(taskId).task(taskId);
    const outcomeChars = (extra[F.result]?.length ?? 0) + (extra[F.error]?.length ?? 0);
    return {
      keys: {
        task: taskKey,
        live: this.keys.forTask(taskId).live,
        lock: options.lock ? this.keys.forTask(taskId).bullJobLock(options.lock.queue, taskId) : taskKey,
        webhookDue: this.keys.forTask(taskId).webhooks.due,
        webhookPending: this.keys.forTask(taskId).webhooks.pending,
        webhookDead: this.keys.forTask(taskId).webhooks.dead,
        retention: this.keys.forTask(taskId).retention,
      },
      args: {
        to,
        now: now.toISOString(),
        fields: JSON.stringify(extra),
        lockToken: options.lock?.token ?? '',
        channelPrefix: this.keys.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.keys.forTask(taskId).gatewayChannelSuffix,
        ackTo: options.ackTo ?? '',
        deadlineAt: options.deadlineAt === undefined ? '' : String(options.deadlineAt),
        dropIdempotency: options.dropIdempotency === true ? '1' : '0',
        // A terminal event carries the outcome when it is small (§6.7): the routing gateway then needs no read.
        eventOutcome: isTerminal(to) && outcomeChars <= MAX_EVENT_OUTCOME_CHARS ? '1' : '0',
        webhookPrefix: this.keys.forTask(taskId).webhooks.eventPrefix,
      },
    };
  }

  /**
   * A run starts (PROTOCOL.md §10.2); with `sharePrincipal`, its job leaves that principal's waiting share of the
   * pool in the same step unless the lock is another run's (§25). With `version` (§12.11) the run records the tool
   * version it runs; `deferIfOther` makes it not start a task recorded under another version (`versionOther`), and
   * `reset` clears the task's state, steps, questions and answers as it starts.
   */
  async startRun(
    taskId: string,
    lock: JobLock,
    attempt: number,
    deadlineAt: number,
    sharePrincipal?: string,
    version: { toolVersion?: string; deferIfOther?: boolean; reset?: boolean } = {},
    startedAt?: Date,
  ): Promise<StartOutcome> {
    const start: RunStart = { taskId, lock, attempt, deadlineAt, sharePrincipal, version };
    if (startedAt !== undefined) start.startedAt = startedAt;
    const reply = await this.scripts.call(SCRIPTS.startRun, this.startRunInput(start));
    if (reply.code === ResultCode.LOCK_LOST) return { lockLost: true };
    if (reply.code === ResultCode.VERSION_OTHER) {
      const recorded = reply.values[0];
      return { lockLost: false, record: undefined, versionOther: typeof recorded === 'string' ? recorded : '' };
    }
    if (reply.code === ResultCode.TASK_MISSING) return { lockLost: false, record: undefined };
    return { lockLost: false, record: parseRecord(fromFlat(reply.values[0] as string[])) };
  }

  private startRunInput(start: RunStart): ScriptInput<typeof SCRIPTS.startRun> {
    const { taskId, lock, sharePrincipal, version = {} } = start;
    const taskKey = this.keys.forTask(taskId).task(taskId);
    return {
      keys: {
        task: taskKey,
        lock: this.keys.forTask(taskId).bullJobLock(lock.queue, taskId),
        share: sharePrincipal === undefined ? taskKey : this.keys.forTask(taskId).fairShare(lock.queue, sharePrincipal),
      },
      args: {
        lockToken: lock.token,
        deadlineAt: start.deadlineAt,
        now: (start.startedAt ?? new Date()).toISOString(),
        attempt: start.attempt,
        jobId: taskId,
        toolVersion: version.toolVersion ?? '',
        deferIfOther: version.deferIfOther === true ? '1' : '0',
        reset: version.reset === true ? '1' : '0',
      },
    };
  }

  /** Records progress on the task and wakes the gateway that holds its session (PROTOCOL.md §6). */
  async recordProgress(
    taskId: string,
    update: ProgressUpdate,
    lock?: JobLock,
    now = new Date(),
  ): Promise<ProgressOutcome> {
    const taskKey = this.keys.forTask(taskId).task(taskId);
    const reply = await this.scripts.call(SCRIPTS.progress, {
      keys: { task: taskKey, lock: lock ? this.keys.forTask(taskId).bullJobLock(lock.queue, taskId) : taskKey },
      args: {
        progress: update.progress,
        total: update.total === undefined ? '' : String(update.total),
        message: update.message === undefined ? '' : JSON.stringify(update.message),
        now: now.toISOString(),
        channelPrefix: this.keys.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.keys.forTask(taskId).gatewayChannelSuffix,
        lockToken: lock?.token ?? '',
        backlogPrefix: this.keys.forTask(taskId).gatewayBacklogPrefix,
        backlogSuffix: this.keys.forTask(taskId).gatewayBacklogSuffix,
      },
    });
    return writeOutcome<'accepted' | 'stale'>(reply.code, 'accepted', { [ResultCode.PROGRESS_STALE]: 'stale' });
  }

  /**
   * Publishes a tool's log message to the gateway holding the caller's session (PROTOCOL.md §15); nothing is stored.
   * Refused once the task is terminal, and for a run that no longer holds `lock`.
   */
  async recordLog(taskId: string, message: LogMessage, lock?: JobLock): Promise<LogOutcome> {
    const taskKey = this.keys.forTask(taskId).task(taskId);
    const reply = await this.scripts.call(SCRIPTS.log, {
      keys: { task: taskKey, lock: lock ? this.keys.forTask(taskId).bullJobLock(lock.queue, taskId) : taskKey },
      args: {
        level: message.level,
        data: JSON.stringify(message.data ?? null),
        logger: message.logger === undefined ? '' : JSON.stringify(message.logger),
        channelPrefix: this.keys.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.keys.forTask(taskId).gatewayChannelSuffix,
        lockToken: lock?.token ?? '',
        backlogPrefix: this.keys.forTask(taskId).gatewayBacklogPrefix,
        backlogSuffix: this.keys.forTask(taskId).gatewayBacklogSuffix,
      },
    });
    return writeOutcome<'published' | 'unrouted' | 'dropped'>(reply.code, 'published', {
      [ResultCode.UNROUTED]: 'unrouted',
      [ResultCode.CHANNEL_FULL]: 'dropped',
    });
  }

  /**
   * A run suspends (PROTOCOL.md §12.2, §12.6): lock-checked. With `request`, stores it as pending and moves the task to
   * `input_required`, unless the request is already answered.
   */
  async suspend(taskId: string, lock: JobLock, input: SuspendInput, now = new Date()): Promise<SuspendOutcome> {
    const requests = input.requests ?? [];
    const reply = await this.scripts.call(SCRIPTS.suspend, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.keys.forTask(taskId).bullJobLock(lock.queue, taskId),
        webhookDue: this.keys.forTask(taskId).webhooks.due,
        webhookPending: this.keys.forTask(taskId).webhooks.pending,
        webhookDead: this.keys.forTask(taskId).webhooks.dead,
      },
      args: {
        lockToken: lock.token,
        requests:
          requests.length === 0
            ? ''
            : JSON.stringify(
                requests.map((r) => [
                  r.n,
                  JSON.stringify({
                    method: r.method,
                    params: r.params,
                    ...(r.key === undefined ? {} : { key: r.key }),
                    ...(r.position === undefined ? {} : { position: r.position }),
                  }),
                ]),
              ),
        now: now.toISOString(),
        deadlineAt: input.deadlineAt,
        channelPrefix: this.keys.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.keys.forTask(taskId).gatewayChannelSuffix,
        webhookPrefix: this.keys.forTask(taskId).webhooks.eventPrefix,
        statusMessage: input.statusMessage ?? '',
      },
    });
    if (reply.code === ResultCode.OK) {
      const flat = Array.isArray(reply.values[0]) ? (reply.values[0] as string[]) : [];
      const answers: Record<string, unknown> = {};
      for (let i = 0; i + 1 < flat.length; i += 2) answers[flat[i] ?? ''] = parseJson<unknown>(flat[i + 1]);
      return { outcome: 'suspended', answers };
    }
    if (reply.code === ResultCode.LOCK_LOST) return { outcome: 'lock_lost' };
    return { outcome: 'gone', status: asStatus(reply.values[0]) };
  }

  /**
   * Stores the answer to input request `n` while it is pending and moves the task back to `working` with `deadlineAt`
   * (PROTOCOL.md §12.3). A second answer, an unknown request or a task that moved on is refused, unchanged.
   */
  async answerInput(
    taskId: string,
    n: number | string,
    answer: unknown,
    deadlineAt: number,
    now = new Date(),
  ): Promise<AnswerOutcome> {
    const reply = await this.scripts.call(SCRIPTS.answer, {
      keys: { task: this.keys.forTask(taskId).task(taskId) },
      args: {
        n: String(n),
        answer: JSON.stringify(answer ?? null),
        now: now.toISOString(),
        deadlineAt,
        channelPrefix: this.keys.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.keys.forTask(taskId).gatewayChannelSuffix,
      },
    });
    const [value, resumed] = reply.values as [string | undefined, number | undefined];
    if (reply.code === ResultCode.OK) return { ok: true, queue: value ?? '', resumed: resumed === 1 };
    return { ok: false, status: asStatus(value) };
  }

  /**
   * A run's durable state write (PROTOCOL.md §12.1): `field` is `state` (the tool's value) or `steps` (`ctx.step`
   * results). Lock-checked; refused once the task is terminal.
   * @throws RangeError when the value serialises to more than `MAX_STATE_BYTES`.
   */
  async setState(
    taskId: string,
    lock: JobLock,
    field: 'state' | 'steps',
    value: unknown,
  ): Promise<'written' | 'gone' | 'lock_lost'> {
    const json = JSON.stringify(value ?? null);
    if (Buffer.byteLength(json) > MAX_STATE_BYTES) {
      throw new RangeError(
        `ctx.${field === 'state' ? 'state' : 'step'} value is over ${MAX_STATE_BYTES} bytes as JSON`,
      );
    }
    const reply = await this.scripts.call(SCRIPTS.setState, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.keys.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, field: field === 'state' ? F.state : F.steps, json },
    });
    if (reply.code === ResultCode.OK) return 'written';
    return reply.code === ResultCode.LOCK_LOST ? 'lock_lost' : 'gone';
  }

  /**
   * Keeps a run's log lines (each a JSON object as text) with its task (PROTOCOL.md §30.4): at most `MAX_KEPT_LOG_LINES`
   * per task. Nothing is written for a task that is gone.
   */
  async keepLogs(taskId: string, lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    await this.scripts.call(SCRIPTS.logKeep, {
      keys: { task: this.keys.forTask(taskId).task(taskId), logs: this.keys.forTask(taskId).taskLogs(taskId) },
      args: { maxLen: MAX_KEPT_LOG_LINES, lines: JSON.stringify(lines) },
    });
  }

  /** Up to `limit` kept log lines of a task after the line `after` (oldest first), each with its stream id. */
  async readLogs(taskId: string, after: string | undefined, limit: number): Promise<KeptLogLine[]> {
    const start = after === undefined ? '-' : `(${after}`;
    const entries = await this.redis.xrange(this.keys.forTask(taskId).taskLogs(taskId), start, '+', 'COUNT', limit);
    return entries.map(([id, fields]) => {
      const text = fields[fields.indexOf('line') + 1] ?? '{}';
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text) as Record<string, unknown>;
      } catch {
        line = { msg: text };
      }
      return { id, time: new Date(Number(id.split('-')[0])).toISOString(), ...line };
    });
  }

  /** A task-mode task's arguments as its call sent them (JSON, PROTOCOL.md §30.2), while the task is kept. */
  async getArguments(taskId: string): Promise<string | undefined> {
    return (await this.redis.get(this.keys.forTask(taskId).taskArguments(taskId))) ?? undefined;
  }

  /**
   * Opens waitpoint `name` of a running task (PROTOCOL.md §32.1), lock-checked: the stored one when an earlier run
   * opened it (ended as `timedOut` here once past its time), else a new one with `token` that waits `timeoutMs`.
   */
  async openWaitpoint(
    taskId: string,
    lock: JobLock,
    name: string,
    token: string,
    timeoutMs: number,
  ): Promise<{ ok: true; record: WaitpointRecord } | { ok: false; reason: 'gone' | 'lock_lost' }> {
    const reply = await this.scripts.call(SCRIPTS.waitpointOpen, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.keys.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, field: `${TASK_FIELD_PREFIXES.waitpoint}${name}`, token, timeoutMs },
    });
    if (reply.code === ResultCode.LOCK_LOST) return { ok: false, reason: 'lock_lost' };
    if (reply.code !== ResultCode.OK) return { ok: false, reason: 'gone' };
    const record = parseMessage(WaitpointRecordSchema, String(reply.values[0]));
    if (!record) throw new TaskrelayError('INTERNAL', `waitpoint ${name} of task ${taskId} is not a waitpoint record`);
    return { ok: true, record };
  }

  /** Waitpoint `name` of a task as stored, if any. */
  async readWaitpoint(taskId: string, name: string): Promise<WaitpointRecord | undefined> {
    const raw = await this.redis.hget(
      this.keys.forTask(taskId).task(taskId),
      `${TASK_FIELD_PREFIXES.waitpoint}${name}`,
    );
    return raw === null ? undefined : parseMessage(WaitpointRecordSchema, raw);
  }

  /**
   * A waitpoint's URL was called with `value` (JSON text the caller checked; PROTOCOL.md §32.4). `queue`, when
   * stored: the task's job queue, whose delayed job the caller promotes.
   */
  async resolveWaitpoint(
    taskId: string,
    name: string,
    token: string,
    value: string,
  ): Promise<{ ok: true; queue: string } | { ok: false; reason: 'gone' | 'ended' | 'unknown' | 'used' | 'expired' }> {
    const reply = await this.scripts.call(SCRIPTS.waitpointResolve, {
      keys: { task: this.keys.forTask(taskId).task(taskId) },
      args: { field: `${TASK_FIELD_PREFIXES.waitpoint}${name}`, token, value },
    });
    switch (reply.code) {
      case ResultCode.OK:
        return { ok: true, queue: typeof reply.values[0] === 'string' ? reply.values[0] : '' };
      case ResultCode.TASK_TERMINAL:
        return { ok: false, reason: 'ended' };
      case ResultCode.WAITPOINT_UNKNOWN:
        return { ok: false, reason: 'unknown' };
      case ResultCode.WAITPOINT_USED:
        return { ok: false, reason: 'used' };
      case ResultCode.WAITPOINT_EXPIRED:
        return { ok: false, reason: 'expired' };
      default:
        return { ok: false, reason: 'gone' };
    }
  }

  /**
   * Adds `tags` (checked: `tagsProblem`) to a running task's (PROTOCOL.md §30.2), lock-checked. `full`: the task would
   * carry more than `MAX_TAGS`, and nothing was written.
   */
  async addTags(
    taskId: string,
    lock: JobLock,
    tags: readonly string[],
  ): Promise<'written' | 'full' | 'gone' | 'lock_lost'> {
    const reply = await this.scripts.call(SCRIPTS.tag, {
      keys: {
        task: this.keys.forTask(taskId).task(taskId),
        lock: this.keys.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, tags: tags.join(','), max: MAX_TAGS },
    });
    if (reply.code === ResultCode.OK) return 'written';
    if (reply.code === ResultCode.LIMIT_FULL) return 'full';
    return reply.code === ResultCode.LOCK_LOST ? 'lock_lost' : 'gone';
  }

  /**
   * One reaper pass (PROTOCOL.md §10.3), when `holder` gets (or already has) the lease: fails the due tasks whose
   * deadline passed or whose job is gone or failed, and schedules the others' next look.
   */
  async reap(
    holder: string,
    options: { batch?: number; leaseMs?: number } = {},
    now = new Date(),
  ): Promise<ReapOutcome> {
    if (this.placement === undefined) return this.reapShard(this.keys, holder, options, now);
    // Sharded: each shard has its live set and its lease (PROTOCOL.md §1.1); one pass looks at every shard.
    const outcome: ReapOutcome = { ran: false, looked: 0, reaped: [] };
    for (const keys of await this.everyShard()) {
      const one = await this.reapShard(keys, holder, options, now);
      outcome.ran ||= one.ran;
      outcome.looked += one.looked;
      outcome.reaped.push(...one.reaped);
    }
    return outcome;
  }

  private async reapShard(
    keys: Keys,
    holder: string,
    options: { batch?: number; leaseMs?: number },
    now: Date,
  ): Promise<ReapOutcome> {
    const reply = await this.scripts.call(SCRIPTS.reap, {
      keys: {
        live: keys.live,
        lease: keys.reaperLease,
        webhookDue: keys.webhooks.due,
        webhookPending: keys.webhooks.pending,
        webhookDead: keys.webhooks.dead,
        retention: keys.retention,
      },
      args: {
        nowMs: now.getTime(),
        now: now.toISOString(),
        batch: options.batch ?? 500,
        lookAgainMs: this.reaperIntervalMs,
        taskKeyPrefix: keys.taskKeyPrefix,
        queueKeyPrefix: keys.bullQueueKeyPrefix,
        channelPrefix: keys.gatewayChannelPrefix,
        channelSuffix: keys.gatewayChannelSuffix,
        holder,
        leaseMs: Math.max(100, options.leaseMs ?? this.reaperIntervalMs * 2),
        webhookPrefix: keys.webhooks.eventPrefix,
      },
    });
    if (reply.code === ResultCode.LEASE_HELD) return { ran: false, looked: 0, reaped: [] };
    const [looked, flat] = reply.values as [number, string[] | undefined];
    const reaped: ReapedTask[] = [];
    for (let i = 0; flat && i + 2 < flat.length; i += 3) {
      reaped.push({ taskId: flat[i] ?? '', code: flat[i + 1] ?? '', message: flat[i + 2] ?? '' });
    }
    return { ran: true, looked, reaped };
  }

  /**
   * One principal's task-mode tasks, newest first, after an opaque cursor: no duplicates or gaps between pages. In the
   * sharded layout each shard's index gives its first page after the cursor and the pages merge in the same order
   * (score, then id, both descending), so the merged page is the one a single index would give (PROTOCOL.md §1.1).
   */
  async list(principal: string, cursor: string | undefined, limit = 50): Promise<TaskPage> {
    const after = cursor === undefined ? undefined : decodeCursor(cursor);
    const pages = await Promise.all(
      (await this.everyShard()).map(async (keys) => {
        const indexKey = keys.principalTasks(principal);
        const reply = await this.scripts.call(SCRIPTS.list, {
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
          const reply = await this.scripts.call(SCRIPTS.read, {
            keys: { task: this.keys.forTask(id).task(id) },
            args: { inlineMax: -1 },
          });
          return [null, flatToHash(reply.values[0])] as [unknown, unknown];
        }),
      );
    } else {
      const ids = pageEntries.map((e) => e.id);
      replies = await pipelineByShard(this.redis, this.keys, ids, (pipeline, id) =>
        pipeline.hgetall(this.keys.forTask(id).task(id)),
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
    for (const [indexKey, ids] of expired) await this.redis.zrem(indexKey, ...ids);
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

function fromFlat(flat: readonly string[]): Record<string, string> | undefined {
  if (flat.length === 0) return undefined;
  const h: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i] ?? ''] = flat[i + 1] ?? '';
  return h;
}

function asStatus(value: unknown): TaskStatus | undefined {
  return typeof value === 'string' && (TASK_STATUSES as readonly string[]).includes(value)
    ? (value as TaskStatus)
    : undefined;
}

/**
 * A task as its terminal status event tells it (PROTOCOL.md §6.7): `base` (what the gateway knew of it: the record it
 * created) with the event's status, time, message and outcome. Only for an event with `final`.
 */
export function terminalRecord(base: TaskRecord, event: StatusEvent): TaskRecord {
  const {
    statusMessage: _message,
    result: _result,
    error: _error,
    cancelReason: _reason,
    pendingInput: _pending,
    pendingInputs: _pendings,
    ...rest
  } = base;
  const record: TaskRecord = { ...rest, status: event.status, lastUpdatedAt: event.lastUpdatedAt };
  if (event.statusMessage !== undefined) record.statusMessage = event.statusMessage;
  if (event.cancelReason !== undefined) record.cancelReason = event.cancelReason;
  const result = parseJson<ToolResult>(event.result);
  if (result !== undefined) record.result = result;
  const error = parseJson<SerializedError>(event.error);
  if (error !== undefined) record.error = error;
  return record;
}

function parseJson<T>(value: string | undefined): T | undefined {
  if (value === undefined || value === '') return undefined;
  try {
    return JSON.parse(value) as T;
  } catch {
    return undefined;
  }
}

function parseNumber(value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  return Number.isFinite(n) ? n : undefined;
}

export function parseRecord(h: Record<string, string> | null | undefined): TaskRecord | undefined {
  const status = asStatus(h?.[F.status]);
  const taskId = h?.[F.taskId];
  if (!h || !status || !taskId) return undefined;
  const pending = h[F.pendingInput];
  const caps = h[F.clientCaps];
  const record: TaskRecord = {
    taskId,
    status,
    createdAt: h[F.createdAt] ?? '',
    lastUpdatedAt: h[F.lastUpdatedAt] ?? '',
    ttl: parseNumber(h[F.ttl]) ?? 0,
    pollInterval: parseNumber(h[F.pollInterval]) ?? 1000,
    tool: h[F.tool] ?? '',
    queue: h[F.queue] ?? '',
    principal: h[F.principal] ?? '',
    mode: h[F.mode] === 'call' ? 'call' : 'task',
  };
  const optional: Partial<TaskRecord> = {
    statusMessage: h[F.statusMessage],
    sessionId: h[F.sessionId],
    gatewayId: h[F.gatewayId],
    progressToken: parseJson<ProgressToken>(h[F.progressToken]),
    progress: parseNumber(h[F.progress]),
    total: parseNumber(h[F.total]),
    progressMessage: h[F.progressMessage],
    result: parseJson<ToolResult>(h[F.result]),
    error: parseJson<SerializedError>(h[F.error]),
    cancelReason: h[F.cancelReason] as CancelReason | undefined,
    deadlineAt: parseNumber(h[F.deadlineAt]),
    attempt: parseNumber(h[F.attempt]),
    toolVersion: h[F.toolVersion],
    inputFloor: parseNumber(h[F.inputFloor]),
    state: parseJson<unknown>(h[F.state]),
    steps: parseJson<Record<string, unknown>>(h[F.steps]),
    pendingInput: pending,
    pendingInputs: pending === undefined ? undefined : pending.split(',').filter(Boolean),
    clientCapabilities: caps === undefined ? undefined : caps.split(',').filter(Boolean),
    webhookUrl: h[F.webhook],
    tags: h[F.tags]?.split(',').filter(Boolean),
    replayOf: h[F.replayOf],
    replayedBy: h[F.replayedBy],
  };
  let inputRequests: Record<string, InputRequest> | undefined;
  let inputResponses: Record<string, unknown> | undefined;
  for (const [field, value] of Object.entries(h)) {
    if (field.startsWith(TASK_FIELD_PREFIXES.input)) {
      const request = parseJson<InputRequest>(value);
      if (request) (inputRequests ??= {})[field.slice(TASK_FIELD_PREFIXES.input.length)] = request;
    } else if (field.startsWith(TASK_FIELD_PREFIXES.answer)) {
      (inputResponses ??= {})[field.slice(TASK_FIELD_PREFIXES.answer.length)] = parseJson<unknown>(value);
    }
  }
  if (inputRequests) optional.inputRequests = inputRequests;
  if (inputResponses) optional.inputResponses = inputResponses;
  for (const [key, value] of Object.entries(optional)) {
    if (value !== undefined) (record as unknown as Record<string, unknown>)[key] = value;
  }
  return record;
}

/** A lock-checked write's outcome from its result code: `ok` for R.OK, `extra` for the script's own codes. */
function writeOutcome<T extends string>(
  code: ResultCode,
  ok: T,
  extra: Partial<Record<ResultCode, T>>,
): T | 'missing' | 'terminal' | 'lock_lost' {
  if (code === ResultCode.OK) return ok;
  const own = extra[code];
  if (own !== undefined) return own;
  if (code === ResultCode.TASK_TERMINAL) return 'terminal';
  if (code === ResultCode.LOCK_LOST) return 'lock_lost';
  return 'missing';
}

function transitionOutcome(reply: ScriptReply, to: TaskStatus): TransitionOutcome {
  if (reply.code === ResultCode.OK) return { ok: true, status: to };
  const status = asStatus(reply.values[0]);
  if (reply.code === ResultCode.LOCK_LOST) return { ok: false, status, lockLost: true };
  return { ok: false, status };
}

import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { TaskrelayError, type SerializedError } from './errors.js';
import type { Keys } from './keys.js';
import type { StatusEvent } from './messages.js';
import {
  ANSWER_SCRIPT,
  CREATE_SCRIPT,
  LIST_SCRIPT,
  LOG_SCRIPT,
  PROGRESS_SCRIPT,
  REAP_SCRIPT,
  SET_STATE_SCRIPT,
  START_SCRIPT,
  SUSPEND_SCRIPT,
  TRANSITION_SCRIPT,
  WATCH_SCRIPT,
} from './task-store-scripts.js';
import {
  TASK_STATUSES,
  TERMINAL_STATUSES,
  allowedSources,
  isTerminal,
  type CancelReason,
  type InputRequest,
  type LogLevel,
  type ProgressToken,
  type TaskMode,
  type TaskRecord,
  type TaskStatus,
  type ToolResult,
} from './task-model.js';

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
  /** What the caller's client can answer (`elicitation`, `sampling`): `ctx.elicit` refuses what it cannot (§12). */
  clientCapabilities?: readonly string[];
  /**
   * The completion webhook the caller named, already checked by the gateway (PROTOCOL.md §27.1), and the most events
   * of this principal that may wait for delivery at once (`cap`).
   */
  webhook?: { url: string; cap: number };
}

export interface CreateOutcome {
  record: TaskRecord;
  /** false when the idempotency key named a live task, which `record` is. */
  created: boolean;
}

export interface RedisTaskStoreOptions {
  /** How soon after creation, and how often after that, the reaper looks at a live task. Default 5000 ms. */
  reaperIntervalMs?: number;
  /** How many task ids one principal's index keeps (newest win). Default 10000. */
  indexCap?: number;
  /** The index expires this long after its last task was added. Default 30 days. */
  indexTtlMs?: number;
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

export type TransitionOutcome =
  | { ok: true; status: TaskStatus }
  /**
   * `status` is what the task already was (the write that won), or undefined when the task does not exist;
   * `lockLost` when the write was a worker's and another run holds the job now.
   */
  | { ok: false; status: TaskStatus | undefined; lockLost?: true };

export type ProgressOutcome = 'accepted' | 'stale' | 'missing' | 'terminal' | 'lock_lost';

/** How `recordLog` ended: `unrouted` when no gateway holds the caller's session (nobody to tell). */
export type LogOutcome = 'published' | 'unrouted' | 'missing' | 'terminal' | 'lock_lost';

/** One tool log message (PROTOCOL.md §15): MCP's `notifications/message` params. */
export interface LogMessage {
  level: LogLevel;
  /** Any JSON value. */
  data: unknown;
  logger?: string;
}

/** What `startRun` finds: the task (undefined when missing), or that the lock is no longer this run's. */
export type StartOutcome = { lockLost: false; record: TaskRecord | undefined } | { lockLost: true };

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

/** Task ids are 128 random bits, hex: unguessable, so an id alone reveals nothing (the MCP tasks specification, security considerations). */
export function newTaskId(): string {
  return randomBytes(16).toString('hex');
}

const TERMINAL_LIST = TERMINAL_STATUSES.join(',');

/** Largest outcome (result + error JSON, in UTF-16 units) a terminal status event carries; a bigger one is read. */
export const MAX_EVENT_OUTCOME_CHARS = 64 * 1024;

/**
 * The Redis task store. Gateway and worker both use it; every status change goes through `transition`, which checks
 * the state machine atomically (Lua), so a terminal task never changes.
 */
export class RedisTaskStore {
  private readonly scripts: ScriptCommands;
  private readonly reaperIntervalMs: number;
  private readonly indexCap: number;
  private readonly indexTtlMs: number;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    options: RedisTaskStoreOptions = {},
  ) {
    this.scripts = defineScripts(redis);
    this.reaperIntervalMs = options.reaperIntervalMs ?? 5_000;
    this.indexCap = options.indexCap ?? 10_000;
    this.indexTtlMs = options.indexTtlMs ?? 30 * 86_400_000;
  }

  async create(input: CreateTaskInput, now = new Date()): Promise<TaskRecord> {
    return (await this.createTask(input, now)).record;
  }

  /**
   * Stores a new task, indexed for its principal (task mode) and in the live set; or, when the idempotency key
   * already names a live task of the principal, returns that one (PROTOCOL.md §10.8).
   */
  async createTask(input: CreateTaskInput, now = new Date()): Promise<CreateOutcome> {
    const taskId = input.taskId ?? newTaskId();
    const iso = now.toISOString();
    const idemKey =
      input.idempotencyKey === undefined ? undefined : this.keys.idempotency(input.principal, input.idempotencyKey);
    const fields: Record<string, string> = {
      taskId,
      status: 'working',
      createdAt: iso,
      lastUpdatedAt: iso,
      ttl: String(input.ttl),
      pollInterval: String(input.pollInterval),
      tool: input.tool,
      queue: input.queue,
      principal: input.principal,
      mode: input.mode,
    };
    if (input.sessionId !== undefined) fields['sessionId'] = input.sessionId;
    if (input.gatewayId !== undefined) fields['gatewayId'] = input.gatewayId;
    if (input.progressToken !== undefined) fields['progressToken'] = JSON.stringify(input.progressToken);
    if (input.deadlineAt !== undefined) fields['deadlineAt'] = String(input.deadlineAt);
    if (idemKey !== undefined) fields['idemKey'] = idemKey;
    if (input.clientCapabilities !== undefined) fields['clientCaps'] = input.clientCapabilities.join(',');
    if (input.webhook !== undefined) {
      fields['webhook'] = input.webhook.url;
      fields['webhookCap'] = String(input.webhook.cap);
    }
    const taskKey = this.keys.task(taskId);
    const reply = (await this.scripts.taskrelayCreate(
      taskKey,
      this.keys.principalTasks(input.principal),
      this.keys.live,
      idemKey ?? taskKey,
      JSON.stringify(fields),
      String(now.getTime()),
      taskId,
      String(now.getTime() + this.reaperIntervalMs),
      input.mode === 'task' ? '1' : '0',
      String(this.indexCap),
      String(this.indexTtlMs),
      idemKey === undefined ? '0' : '1',
      this.keys.taskKeyPrefix,
    )) as [number, string?, string?];
    if (reply[0] === 0 && reply[1] !== undefined) {
      if (reply[2] !== input.tool) {
        throw new TaskrelayError(
          'INVALID_ARGUMENTS',
          `Idempotency key already used for a task of tool ${reply[2] ?? 'unknown'}; use a new key for ${input.tool}`,
        );
      }
      const existing = await this.get(reply[1]);
      if (existing) return { record: existing, created: false };
      // Expired between the two reads: the key is free again.
      return this.createTask(input, now);
    }
    if (reply[0] !== 1) throw new TaskrelayError('INTERNAL', `Task ${taskId} already exists`);
    const record = parseRecord(fields);
    if (!record) throw new TaskrelayError('INTERNAL', `Task ${taskId} could not be read back`);
    return { record, created: true };
  }

  async get(taskId: string): Promise<TaskRecord | undefined> {
    return parseRecord(await this.redis.hgetall(this.keys.task(taskId)));
  }

  /**
   * Reads a task and, while it is not terminal, registers `gatewayId` to receive its status events (a waiter on
   * another gateway than the owner): one round trip (PROTOCOL.md §10.9).
   */
  async watch(taskId: string, gatewayId: string): Promise<TaskRecord | undefined> {
    const flat = (await this.scripts.taskrelayWatch(this.keys.task(taskId), gatewayId, TERMINAL_LIST)) as string[];
    return parseRecord(fromFlat(flat));
  }

  /** Statuses of many tasks in one round trip (undefined for missing ones). */
  async statuses(taskIds: readonly string[]): Promise<Array<TaskStatus | undefined>> {
    if (taskIds.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of taskIds) pipeline.hget(this.keys.task(id), 'status');
    const replies = (await pipeline.exec()) ?? [];
    return replies.map(([, value]) => asStatus(value));
  }

  /**
   * Why each of many tasks is no longer live, in one round trip: its status, and for a terminal one the cancel reason
   * or error code (a worker's sweep turns these into the abort reason of a run it still has).
   */
  async endStates(
    taskIds: readonly string[],
  ): Promise<Array<{ status: TaskStatus | undefined; cancelReason?: CancelReason; errorCode?: string }>> {
    if (taskIds.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of taskIds) pipeline.hmget(this.keys.task(id), 'status', 'cancelReason', 'error');
    const replies = (await pipeline.exec()) ?? [];
    return replies.map(([, value]) => {
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
    const extra: Record<string, string> = {};
    if (fields.statusMessage !== undefined) extra['statusMessage'] = fields.statusMessage;
    if (fields.result !== undefined) extra['result'] = JSON.stringify(fields.result);
    if (fields.error !== undefined) extra['error'] = JSON.stringify(fields.error);
    if (fields.cancelReason !== undefined) extra['cancelReason'] = fields.cancelReason;
    const taskKey = this.keys.task(taskId);
    const [ok, status] = (await this.scripts.taskrelayTransition(
      taskKey,
      this.keys.live,
      options.lock ? this.keys.bullJobLock(options.lock.queue, taskId) : taskKey,
      this.keys.webhooks.due,
      this.keys.webhooks.pending,
      this.keys.webhooks.dead,
      to,
      now.toISOString(),
      allowedSources(to).join(','),
      isTerminal(to) ? '1' : '0',
      JSON.stringify(extra),
      options.lock?.token ?? '',
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
      options.ackTo ?? '',
      options.deadlineAt === undefined ? '' : String(options.deadlineAt),
      options.dropIdempotency === true ? '1' : '0',
      // A terminal event carries the outcome when it is small (§6.7): the routing gateway then needs no read.
      isTerminal(to) && (extra['result']?.length ?? 0) + (extra['error']?.length ?? 0) <= MAX_EVENT_OUTCOME_CHARS
        ? '1'
        : '0',
      this.keys.webhooks.eventPrefix,
    )) as [number, string];
    if (ok === 1) return { ok: true, status: to };
    if (ok === -1) return { ok: false, status: asStatus(status), lockLost: true };
    return { ok: false, status: asStatus(status) };
  }

  /**
   * A worker's run starts: checks it holds the job's lock, records the attempt and moves the deadline, and returns
   * the task (PROTOCOL.md §10.2). A missing or terminal task is returned as is, unchanged.
   */
  async startRun(taskId: string, lock: JobLock, attempt: number, deadlineAt: number): Promise<StartOutcome> {
    const flat = (await this.scripts.taskrelayStart(
      this.keys.task(taskId),
      this.keys.bullJobLock(lock.queue, taskId),
      lock.token,
      String(deadlineAt),
      new Date().toISOString(),
      String(attempt),
      TERMINAL_LIST,
    )) as string[];
    if (flat[0] === '__lock_lost') return { lockLost: true };
    return { lockLost: false, record: parseRecord(fromFlat(flat)) };
  }

  /** Records progress on the task and wakes the gateway that holds its session (PROTOCOL.md §6). */
  async recordProgress(
    taskId: string,
    update: ProgressUpdate,
    lock?: JobLock,
    now = new Date(),
  ): Promise<ProgressOutcome> {
    const taskKey = this.keys.task(taskId);
    const reply = (await this.scripts.taskrelayProgress(
      taskKey,
      lock ? this.keys.bullJobLock(lock.queue, taskId) : taskKey,
      String(update.progress),
      update.total === undefined ? '' : String(update.total),
      update.message === undefined ? '' : JSON.stringify(update.message),
      now.toISOString(),
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
      TERMINAL_LIST,
      lock?.token ?? '',
    )) as number;
    switch (reply) {
      case 1:
        return 'accepted';
      case 0:
        return 'stale';
      case -2:
        return 'terminal';
      case -3:
        return 'lock_lost';
      default:
        return 'missing';
    }
  }

  /**
   * Publishes a tool's log message to the gateway holding the caller's session (PROTOCOL.md §15); nothing is stored.
   * Refused once the task is terminal, and for a run that no longer holds `lock`.
   */
  async recordLog(taskId: string, message: LogMessage, lock?: JobLock): Promise<LogOutcome> {
    const taskKey = this.keys.task(taskId);
    const reply = (await this.scripts.taskrelayLog(
      taskKey,
      lock ? this.keys.bullJobLock(lock.queue, taskId) : taskKey,
      message.level,
      JSON.stringify(message.data ?? null),
      message.logger === undefined ? '' : JSON.stringify(message.logger),
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
      TERMINAL_LIST,
      lock?.token ?? '',
    )) as number;
    switch (reply) {
      case 1:
        return 'published';
      case 0:
        return 'unrouted';
      case -2:
        return 'terminal';
      case -3:
        return 'lock_lost';
      default:
        return 'missing';
    }
  }

  /**
   * A run suspends (PROTOCOL.md §12.2, §12.6): lock-checked. With `request`, stores it as pending and moves the task to
   * `input_required`, unless the request is already answered.
   */
  async suspend(taskId: string, lock: JobLock, input: SuspendInput, now = new Date()): Promise<SuspendOutcome> {
    const requests = input.requests ?? [];
    const reply = (await this.scripts.taskrelaySuspend(
      this.keys.task(taskId),
      this.keys.bullJobLock(lock.queue, taskId),
      this.keys.webhooks.due,
      this.keys.webhooks.pending,
      this.keys.webhooks.dead,
      lock.token,
      requests.length === 0
        ? ''
        : JSON.stringify(requests.map((r) => [r.n, JSON.stringify({ method: r.method, params: r.params })])),
      now.toISOString(),
      String(input.deadlineAt),
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
      TERMINAL_LIST,
      this.keys.webhooks.eventPrefix,
    )) as [number, (string[] | string)?];
    if (reply[0] === 1) {
      const flat = Array.isArray(reply[1]) ? reply[1] : [];
      const answers: Record<string, unknown> = {};
      for (let i = 0; i + 1 < flat.length; i += 2) answers[flat[i] ?? ''] = parseJson<unknown>(flat[i + 1]);
      return { outcome: 'suspended', answers };
    }
    if (reply[0] === -1) return { outcome: 'lock_lost' };
    return { outcome: 'gone', status: asStatus(reply[1]) };
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
    const [ok, value, resumed] = (await this.scripts.taskrelayAnswer(
      this.keys.task(taskId),
      String(n),
      JSON.stringify(answer ?? null),
      now.toISOString(),
      String(deadlineAt),
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
    )) as [number, string, number?];
    if (ok === 1) return { ok: true, queue: value, resumed: resumed === 1 };
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
    const reply = (await this.scripts.taskrelaySetState(
      this.keys.task(taskId),
      this.keys.bullJobLock(lock.queue, taskId),
      lock.token,
      field,
      json,
      TERMINAL_LIST,
    )) as number;
    if (reply === 1) return 'written';
    return reply === -1 ? 'lock_lost' : 'gone';
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
    const reply = (await this.scripts.taskrelayReap(
      this.keys.live,
      this.keys.reaperLease,
      this.keys.webhooks.due,
      this.keys.webhooks.pending,
      this.keys.webhooks.dead,
      String(now.getTime()),
      now.toISOString(),
      String(options.batch ?? 500),
      String(this.reaperIntervalMs),
      this.keys.taskKeyPrefix,
      this.keys.bullQueueKeyPrefix,
      this.keys.gatewayChannelPrefix,
      this.keys.gatewayChannelSuffix,
      holder,
      String(Math.max(100, options.leaseMs ?? this.reaperIntervalMs * 2)),
      TERMINAL_LIST,
      this.keys.webhooks.eventPrefix,
    )) as [number, string[]?];
    if (reply[0] === -1) return { ran: false, looked: 0, reaped: [] };
    const flat = reply[1] ?? [];
    const reaped: ReapedTask[] = [];
    for (let i = 0; i + 2 < flat.length; i += 3) {
      reaped.push({ taskId: flat[i] ?? '', code: flat[i + 1] ?? '', message: flat[i + 2] ?? '' });
    }
    return { ran: true, looked: reply[0], reaped };
  }

  /** One principal's task-mode tasks, newest first, after an opaque cursor: no duplicates or gaps between pages. */
  async list(principal: string, cursor: string | undefined, limit = 50): Promise<TaskPage> {
    const after = cursor === undefined ? undefined : decodeCursor(cursor);
    const indexKey = this.keys.principalTasks(principal);
    const rows = (await this.scripts.taskrelayList(
      indexKey,
      after === undefined ? '' : String(after.s),
      after?.id ?? '',
      String(limit),
    )) as string[];
    const entries: Array<{ id: string; score: number }> = [];
    for (let i = 0; i + 1 < rows.length; i += 2) entries.push({ id: rows[i] ?? '', score: Number(rows[i + 1]) });
    const pageEntries = entries.slice(0, limit);
    const pipeline = this.redis.pipeline();
    for (const { id } of pageEntries) pipeline.hgetall(this.keys.task(id));
    const replies = pageEntries.length > 0 ? ((await pipeline.exec()) ?? []) : [];
    const tasks: TaskRecord[] = [];
    const expired: string[] = [];
    replies.forEach(([, value], i) => {
      const record = parseRecord(value as Record<string, string>);
      if (record) tasks.push(record);
      else expired.push(pageEntries[i]?.id ?? '');
    });
    // Expired hashes leave their index entries behind; tidy them lazily.
    if (expired.length > 0) await this.redis.zrem(indexKey, ...expired);
    const page: TaskPage = { tasks };
    const last = pageEntries.at(-1);
    if (entries.length > limit && last) page.nextCursor = encodeCursor({ s: last.score, id: last.id });
    return page;
  }
}

type ScriptCommand = (...args: Array<string | number>) => Promise<unknown>;
const SCRIPTS = {
  taskrelayCreate: { numberOfKeys: 4, lua: CREATE_SCRIPT },
  taskrelayTransition: { numberOfKeys: 6, lua: TRANSITION_SCRIPT },
  taskrelayProgress: { numberOfKeys: 2, lua: PROGRESS_SCRIPT },
  taskrelayLog: { numberOfKeys: 2, lua: LOG_SCRIPT },
  taskrelayStart: { numberOfKeys: 2, lua: START_SCRIPT },
  taskrelayWatch: { numberOfKeys: 1, lua: WATCH_SCRIPT },
  taskrelayReap: { numberOfKeys: 5, lua: REAP_SCRIPT },
  taskrelayList: { numberOfKeys: 1, lua: LIST_SCRIPT },
  taskrelaySuspend: { numberOfKeys: 5, lua: SUSPEND_SCRIPT },
  taskrelayAnswer: { numberOfKeys: 1, lua: ANSWER_SCRIPT },
  taskrelaySetState: { numberOfKeys: 2, lua: SET_STATE_SCRIPT },
} as const;
type ScriptName = keyof typeof SCRIPTS;
type ScriptCommands = Record<ScriptName, ScriptCommand>;

/** Registers the scripts as ioredis commands: sent by SHA (EVALSHA) after the first call, not as text each time. */
function defineScripts(redis: Redis): ScriptCommands {
  const commands = redis as unknown as Partial<ScriptCommands>;
  const bound = {} as ScriptCommands;
  for (const [name, definition] of Object.entries(SCRIPTS) as Array<[ScriptName, (typeof SCRIPTS)[ScriptName]]>) {
    if (!commands[name]) redis.defineCommand(name, definition);
    bound[name] = (...args) => (redis as unknown as ScriptCommands)[name](...args);
  }
  return bound;
}

interface Cursor {
  /** Score (createdAt ms) of the last entry of the previous page. */
  s: number;
  /** Its task id: ties on the score are ordered by id. */
  id: string;
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
  const status = asStatus(h?.['status']);
  if (!h || !status || !h['taskId']) return undefined;
  const record: TaskRecord = {
    taskId: h['taskId'],
    status,
    createdAt: h['createdAt'] ?? '',
    lastUpdatedAt: h['lastUpdatedAt'] ?? '',
    ttl: parseNumber(h['ttl']) ?? 0,
    pollInterval: parseNumber(h['pollInterval']) ?? 1000,
    tool: h['tool'] ?? '',
    queue: h['queue'] ?? '',
    principal: h['principal'] ?? '',
    mode: h['mode'] === 'call' ? 'call' : 'task',
  };
  const optional: Partial<TaskRecord> = {
    statusMessage: h['statusMessage'],
    sessionId: h['sessionId'],
    gatewayId: h['gatewayId'],
    progressToken: parseJson<ProgressToken>(h['progressToken']),
    progress: parseNumber(h['progress']),
    total: parseNumber(h['total']),
    progressMessage: h['progressMessage'],
    result: parseJson<ToolResult>(h['result']),
    error: parseJson<SerializedError>(h['error']),
    cancelReason: h['cancelReason'] as CancelReason | undefined,
    deadlineAt: parseNumber(h['deadlineAt']),
    attempt: parseNumber(h['attempt']),
    state: parseJson<unknown>(h['state']),
    steps: parseJson<Record<string, unknown>>(h['steps']),
    pendingInput: h['pendingInput'],
    pendingInputs: h['pendingInput'] === undefined ? undefined : h['pendingInput'].split(',').filter(Boolean),
    clientCapabilities: h['clientCaps'] === undefined ? undefined : h['clientCaps'].split(',').filter(Boolean),
    webhookUrl: h['webhook'],
  };
  let inputRequests: Record<string, InputRequest> | undefined;
  let inputResponses: Record<string, unknown> | undefined;
  for (const [field, value] of Object.entries(h)) {
    if (field.startsWith('input:')) {
      const request = parseJson<InputRequest>(value);
      if (request) (inputRequests ??= {})[field.slice(6)] = request;
    } else if (field.startsWith('answer:')) {
      (inputResponses ??= {})[field.slice(7)] = parseJson<unknown>(value);
    }
  }
  if (inputRequests) optional.inputRequests = inputRequests;
  if (inputResponses) optional.inputResponses = inputResponses;
  for (const [key, value] of Object.entries(optional)) {
    if (value !== undefined) (record as unknown as Record<string, unknown>)[key] = value;
  }
  return record;
}

import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { TaskrelayError, type SerializedError } from './errors.js';
import type { Keys } from './keys.js';
import { CREATE_SCRIPT, PROGRESS_SCRIPT, TRANSITION_SCRIPT } from './task-store-scripts.js';
import {
  TASK_STATUSES,
  TERMINAL_STATUSES,
  allowedSources,
  isTerminal,
  type CancelReason,
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
}

export interface TransitionFields {
  statusMessage?: string;
  result?: ToolResult;
  error?: SerializedError;
  cancelReason?: CancelReason;
}

export type TransitionOutcome =
  | { ok: true; status: TaskStatus }
  /** `status` is what the task already was (the write that won), or undefined when the task does not exist. */
  | { ok: false; status: TaskStatus | undefined };

export type ProgressOutcome = 'accepted' | 'stale' | 'missing' | 'terminal';

export interface ProgressUpdate {
  progress: number;
  total?: number;
  message?: string;
}

export interface TaskPage {
  tasks: TaskRecord[];
  nextCursor?: string;
}

/** Task ids are 128 random bits, hex: unguessable, so an id alone reveals nothing (reference §9). */
export function newTaskId(): string {
  return randomBytes(16).toString('hex');
}

const TERMINAL_LIST = TERMINAL_STATUSES.join(',');

/**
 * The Redis task store. Gateway and worker both use it; every status change goes through `transition`, which checks
 * the state machine atomically (Lua), so a terminal task never changes.
 */
export class RedisTaskStore {
  private readonly scripts: ScriptCommands;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {
    this.scripts = defineScripts(redis);
  }

  async create(input: CreateTaskInput, now = new Date()): Promise<TaskRecord> {
    const taskId = input.taskId ?? newTaskId();
    const iso = now.toISOString();
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
    const created = (await this.scripts.taskrelayCreate(
      this.keys.task(taskId),
      this.keys.principalTasks(input.principal),
      JSON.stringify(fields),
      String(now.getTime()),
      taskId,
    )) as number;
    if (created !== 1) throw new TaskrelayError('INTERNAL', `Task ${taskId} already exists`);
    const record = parseRecord(fields);
    if (!record) throw new TaskrelayError('INTERNAL', `Task ${taskId} could not be read back`);
    return record;
  }

  async get(taskId: string): Promise<TaskRecord | undefined> {
    return parseRecord(await this.redis.hgetall(this.keys.task(taskId)));
  }

  /** Statuses of many tasks in one round trip (undefined for missing ones). */
  async statuses(taskIds: readonly string[]): Promise<Array<TaskStatus | undefined>> {
    if (taskIds.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of taskIds) pipeline.hget(this.keys.task(id), 'status');
    const replies = (await pipeline.exec()) ?? [];
    return replies.map(([, value]) => asStatus(value));
  }

  /** Atomically moves a task to `to` if the state machine allows it from its current status. */
  async transition(
    taskId: string,
    to: TaskStatus,
    fields: TransitionFields = {},
    now = new Date(),
  ): Promise<TransitionOutcome> {
    const extra: Record<string, string> = {};
    if (fields.statusMessage !== undefined) extra['statusMessage'] = fields.statusMessage;
    if (fields.result !== undefined) extra['result'] = JSON.stringify(fields.result);
    if (fields.error !== undefined) extra['error'] = JSON.stringify(fields.error);
    if (fields.cancelReason !== undefined) extra['cancelReason'] = fields.cancelReason;
    const [ok, status] = (await this.scripts.taskrelayTransition(
      this.keys.task(taskId),
      to,
      now.toISOString(),
      allowedSources(to).join(','),
      isTerminal(to) ? '1' : '0',
      this.keys.statusChannel,
      JSON.stringify(extra),
    )) as [number, string];
    return ok === 1 ? { ok: true, status: to } : { ok: false, status: asStatus(status) };
  }

  /** Records progress on the task and wakes the gateway that holds its session (PROTOCOL.md §6). */
  async recordProgress(taskId: string, update: ProgressUpdate, now = new Date()): Promise<ProgressOutcome> {
    const reply = (await this.scripts.taskrelayProgress(
      this.keys.task(taskId),
      String(update.progress),
      update.total === undefined ? '' : String(update.total),
      update.message === undefined ? '' : JSON.stringify(update.message),
      now.toISOString(),
      this.keys.gatewayProgressChannelPrefix,
      ':progress',
      TERMINAL_LIST,
    )) as number;
    switch (reply) {
      case 1:
        return 'accepted';
      case 0:
        return 'stale';
      case -2:
        return 'terminal';
      default:
        return 'missing';
    }
  }

  /** One principal's tasks, newest first. The cursor is opaque to callers. */
  async list(principal: string, cursor: string | undefined, limit = 50): Promise<TaskPage> {
    const offset = cursor === undefined ? 0 : decodeCursor(cursor);
    const indexKey = this.keys.principalTasks(principal);
    const ids = await this.redis.zrevrange(indexKey, offset, offset + limit - 1);
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hgetall(this.keys.task(id));
    const replies = (await pipeline.exec()) ?? [];
    const tasks: TaskRecord[] = [];
    const expired: string[] = [];
    replies.forEach(([, value], i) => {
      const record = parseRecord(value as Record<string, string>);
      if (record) tasks.push(record);
      else expired.push(ids[i] ?? '');
    });
    // Expired hashes leave their index entries behind; tidy them lazily.
    if (expired.length > 0) await this.redis.zrem(indexKey, ...expired);
    const page: TaskPage = { tasks };
    if (ids.length === limit) page.nextCursor = encodeCursor(offset + limit - expired.length);
    return page;
  }
}

type ScriptCommand = (...args: Array<string | number>) => Promise<unknown>;
type ScriptCommands = Record<'taskrelayCreate' | 'taskrelayTransition' | 'taskrelayProgress', ScriptCommand>;

/** Registers the scripts as ioredis commands: sent by SHA (EVALSHA) after the first call, not as text each time. */
function defineScripts(redis: Redis): ScriptCommands {
  const commands = redis as unknown as Partial<ScriptCommands>;
  if (!commands.taskrelayCreate) redis.defineCommand('taskrelayCreate', { numberOfKeys: 2, lua: CREATE_SCRIPT });
  if (!commands.taskrelayTransition) {
    redis.defineCommand('taskrelayTransition', { numberOfKeys: 1, lua: TRANSITION_SCRIPT });
  }
  if (!commands.taskrelayProgress) redis.defineCommand('taskrelayProgress', { numberOfKeys: 1, lua: PROGRESS_SCRIPT });
  const defined = redis as unknown as ScriptCommands;
  return {
    taskrelayCreate: (...args) => defined.taskrelayCreate(...args),
    taskrelayTransition: (...args) => defined.taskrelayTransition(...args),
    taskrelayProgress: (...args) => defined.taskrelayProgress(...args),
  };
}

function encodeCursor(offset: number): string {
  return Buffer.from(JSON.stringify({ o: offset })).toString('base64url');
}

function decodeCursor(cursor: string): number {
  try {
    const parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { o?: unknown };
    if (typeof parsed.o === 'number' && Number.isInteger(parsed.o) && parsed.o >= 0) return parsed.o;
  } catch {
    // fall through
  }
  throw new TaskrelayError('INVALID_ARGUMENTS', 'Invalid cursor');
}

function asStatus(value: unknown): TaskStatus | undefined {
  return typeof value === 'string' && (TASK_STATUSES as readonly string[]).includes(value)
    ? (value as TaskStatus)
    : undefined;
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
  };
  for (const [key, value] of Object.entries(optional)) {
    if (value !== undefined) (record as unknown as Record<string, unknown>)[key] = value;
  }
  return record;
}

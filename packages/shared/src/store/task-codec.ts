/**
 * The task hash as records (PROTOCOL.md §2): reading a hash or a script's flat reply into a `TaskRecord`, and the
 * small decoders the store aggregates share.
 */
import { randomFillSync } from 'node:crypto';
import type { SerializedError } from '../protocol/errors.js';
import type { StatusEvent } from '../protocol/messages.js';
import { ResultCode } from '../protocol/script-results.js';
import { TASK_FIELDS as F, TASK_FIELD_PREFIXES } from '../protocol/task-fields.js';
import {
  TASK_STATUSES,
  type CancelReason,
  type InputRequest,
  type ProgressToken,
  type TaskRecord,
  type TaskStatus,
  type ToolResult,
} from '../protocol/task-model.js';

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

export function fromFlat(flat: readonly string[]): Record<string, string> | undefined {
  if (flat.length === 0) return undefined;
  const h: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i] ?? ''] = flat[i + 1] ?? '';
  return h;
}

export function asStatus(value: unknown): TaskStatus | undefined {
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
  if (event.ttl !== undefined) record.ttl = event.ttl;
  const result =
    event.resultJson !== undefined ? (event.resultJson as ToolResult) : parseJson<ToolResult>(event.result);
  if (result !== undefined) record.result = result;
  const error =
    event.errorJson !== undefined ? (event.errorJson as SerializedError) : parseJson<SerializedError>(event.error);
  if (error !== undefined) record.error = error;
  return record;
}

export function parseJson<T>(value: string | undefined): T | undefined {
  if (value === undefined || value === '') return undefined;
  try {
    return JSON.parse(value) as T;
  } catch {
    return undefined;
  }
}

export function parseNumber(value: string | undefined): number | undefined {
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

/** A script's flat `name, value, ...` reply as a hash. */
export function flatToHash(flat: unknown): Record<string, string> {
  const h: Record<string, string> = {};
  if (!Array.isArray(flat)) return h;
  for (let i = 0; i + 1 < flat.length; i += 2) h[String(flat[i])] = String(flat[i + 1]);
  return h;
}

/** A lock-checked write's outcome from its result code: `ok` for R.OK, `extra` for the script's own codes. */
export function writeOutcome<T extends string>(
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

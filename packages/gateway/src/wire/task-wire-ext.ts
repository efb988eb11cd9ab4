/**
 * The `io.modelcontextprotocol/tasks` extension (SEP-2663) rendering of a stored task (PROTOCOL.md §13): flat
 * `CreateTaskResult`, `DetailedTask` with the result, error or pending input requests inline. Same record, same
 * `outcomeOf` as the 2025-11-25 rendering; only the shapes differ.
 */
import { RELATED_TASK_META_KEY } from '@modelcontextprotocol/sdk/types.js';
import {
  JSON_RPC,
  inputKeyOf,
  type InputRequest,
  type TaskRecord,
  type TaskStatus,
  suggestedPollInterval,
  firstPollInterval,
} from '@taskrelay/shared';
import { WireError } from './errors.js';
import { outcomeOf, type RpcErrorObject } from './task-wire.js';

/** The extension's id, as clients declare it per request and servers advertise it. */
export const TASKS_EXTENSION_ID = 'io.modelcontextprotocol/tasks';
/** `_meta` key of the client capabilities a request carries (SEP-2575). */
export const CLIENT_CAPABILITIES_META_KEY = 'io.modelcontextprotocol/clientCapabilities';
/** JSON-RPC "Missing Required Client Capability": only a task will do, and the request did not declare the extension. */

/** The extension's `Task`: integer milliseconds under their new names, no `ttl` / `pollInterval`. */
export interface ExtTask {
  taskId: string;
  status: TaskStatus;
  statusMessage?: string;
  createdAt: string;
  lastUpdatedAt: string;
  ttlMs: number | null;
  pollIntervalMs?: number;
  /** A JSON-RPC result is an open object. */
  [key: string]: unknown;
}

export type ExtCreateTaskResult = ExtTask & { resultType: 'task' };

export type ExtDetailedTask = ExtTask & {
  resultType: 'complete';
  result?: Record<string, unknown>;
  error?: RpcErrorObject;
  inputRequests?: Record<string, Pick<InputRequest, 'method' | 'params'>>;
};

/** True when a request's `_meta` declares the extension (the choice is per request, docs/MCP.md). */
export function declaresTasksExtension(meta: Record<string, unknown> | undefined): boolean {
  const capabilities = meta?.[CLIENT_CAPABILITIES_META_KEY];
  if (typeof capabilities !== 'object' || capabilities === null) return false;
  const extensions = (capabilities as { extensions?: unknown }).extensions;
  return typeof extensions === 'object' && extensions !== null && TASKS_EXTENSION_ID in extensions;
}

/** `-32021` with `data.requiredCapabilities` for `method`, asked without declaring the extension (SEP-2575). */
export function requireTasksExtension(meta: Record<string, unknown> | undefined, method: string): void {
  if (declaresTasksExtension(meta)) return;
  throw new WireError(
    JSON_RPC.MISSING_CLIENT_CAPABILITY,
    `${method} needs the ${TASKS_EXTENSION_ID} extension: declare it in _meta["${CLIENT_CAPABILITIES_META_KEY}"].extensions`,
    { requiredCapabilities: { extensions: { [TASKS_EXTENSION_ID]: {} } } },
  );
}

/**
 * What a request's per-request client capabilities say the client can answer (`elicitation`, `sampling`): the
 * extension's clients declare them with the request, not at a session's `initialize`.
 */
export function requestClientCapabilities(meta: Record<string, unknown> | undefined): string[] {
  const capabilities = meta?.[CLIENT_CAPABILITIES_META_KEY];
  if (typeof capabilities !== 'object' || capabilities === null) return [];
  return ['elicitation', 'sampling', 'roots'].filter((name) => name in capabilities);
}

function baseTask(record: TaskRecord, status: TaskStatus, pollIntervalMs = suggestedPollInterval(record)): ExtTask {
  const task: ExtTask = {
    taskId: record.taskId,
    status,
    createdAt: record.createdAt,
    lastUpdatedAt: record.lastUpdatedAt,
    ttlMs: Math.round(record.ttl),
    pollIntervalMs: Math.max(1, pollIntervalMs),
  };
  if (record.statusMessage !== undefined) task.statusMessage = record.statusMessage;
  return task;
}

/** A create's answer in the extension's rendering; it suggests `firstPollInterval` (PROTOCOL.md §28.2). */
export function renderCreateTaskExt(record: TaskRecord): ExtCreateTaskResult {
  const status = record.status === 'input_required' ? 'input_required' : 'working';
  return { ...baseTask(record, status, firstPollInterval(record)), resultType: 'task' };
}

/**
 * `tasks/get` (and `notifications/tasks`): a tool error is a `completed` task whose result has `isError` (SEP-2663
 * keeps `failed` for JSON-RPC errors); a JSON-RPC error is `failed` with `error` and no result; an
 * `input_required` task lists its pending request.
 */
export function renderDetailedTask(record: TaskRecord): ExtDetailedTask {
  const outcome = outcomeOf(record);
  switch (outcome.kind) {
    case 'pending': {
      if (record.status !== 'input_required') return { ...baseTask(record, 'working'), resultType: 'complete' };
      // Keyed by the tool's name for a request, else its number (PROTOCOL.md §17.6); the key is not part of it.
      const inputRequests: Record<string, Pick<InputRequest, 'method' | 'params'>> = {};
      for (const n of record.pendingInputs ?? []) {
        const request = record.inputRequests?.[n];
        if (request) inputRequests[inputKeyOf(n, request)] = { method: request.method, params: request.params };
      }
      return { ...baseTask(record, 'input_required'), resultType: 'complete', inputRequests };
    }
    case 'cancelled':
      return { ...baseTask(record, 'cancelled'), resultType: 'complete' };
    case 'result':
      // The inlined result is a 2026-07-28 CallToolResult, which names its own `resultType`.
      return {
        ...baseTask(record, 'completed'),
        resultType: 'complete',
        result: { resultType: 'complete', ...withoutRelatedTask(outcome.result) },
      };
    case 'error':
      return { ...baseTask(record, 'failed'), resultType: 'complete', error: outcome.error };
  }
}

/** The related-task `_meta` key is 2025-11-25 vocabulary: the extension's `taskId` is at the root. */
function withoutRelatedTask(result: Record<string, unknown>): Record<string, unknown> {
  const meta = result['_meta'];
  if (typeof meta !== 'object' || meta === null || !(RELATED_TASK_META_KEY in meta)) return { ...result };
  const { [RELATED_TASK_META_KEY]: _dropped, ...rest } = meta as Record<string, unknown>;
  const copy: Record<string, unknown> = { ...result };
  if (Object.keys(rest).length > 0) copy['_meta'] = rest;
  else delete copy['_meta'];
  return copy;
}

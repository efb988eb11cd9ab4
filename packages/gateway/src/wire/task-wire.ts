/**
 * The renderings of one stored task (PROTOCOL.md §13). The stored `TaskRecord` knows no wire format; each era's
 * shapes are made here: `renderTask` / `renderResult` for 2025-11-25 `tasks/*`, and (task-wire-ext.ts) the
 * `io.modelcontextprotocol/tasks` extension. `outcomeOf` is the one classification both use, so they always agree.
 */
import { RELATED_TASK_META_KEY, type CallToolResult, type Task } from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC, type ErrorCode, type TaskRecord, suggestedPollInterval } from '@taskrelay/shared';
import { WireError, rpcErrorOf, type RpcErrorObject } from './errors.js';

export type { RpcErrorObject } from './errors.js';

/**
 * How a task ended, independent of the wire (§13):
 * - `result`: the tool answered, possibly with a tool error (`isError: true`, which a model can read and correct);
 * - `error`: a JSON-RPC error — the tool threw `ProtocolError`, or taskrelay could not run it (`JOB_LOST`, ...);
 * - `cancelled`; or `pending` while the task is not terminal.
 */
export type TaskOutcome =
  | { kind: 'pending' }
  | { kind: 'cancelled' }
  | { kind: 'result'; result: CallToolResult }
  | { kind: 'error'; error: RpcErrorObject; result: CallToolResult };

/** Failures that are taskrelay's, not the tool's: a JSON-RPC internal error in the extension rendering. */
const SYSTEM_FAILURES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'JOB_LOST',
  'LOCK_LOST',
  'INTERNAL',
  'TOOL_NOT_FOUND',
  'REDIS_UNAVAILABLE',
]);

export function outcomeOf(record: TaskRecord): TaskOutcome {
  switch (record.status) {
    case 'working':
    case 'input_required':
      return { kind: 'pending' };
    case 'cancelled':
      return { kind: 'cancelled' };
    case 'completed':
      return { kind: 'result', result: storedResult(record) };
    case 'failed': {
      const error = record.error;
      if (error?.code === 'PROTOCOL_ERROR')
        return { kind: 'error', error: rpcErrorOf(error), result: storedResult(record) };
      // A run taskrelay could not carry out is the server's failure, whatever the code says of a request (a tool gone
      // from the fleet is -32602 when a call names it, and -32603 when a queued task meets it).
      if (error && SYSTEM_FAILURES.has(error.code as ErrorCode)) {
        return {
          kind: 'error',
          error: { code: JSON_RPC.INTERNAL_ERROR, message: error.message, data: { code: error.code } },
          result: storedResult(record),
        };
      }
      return { kind: 'result', result: storedResult(record) };
    }
  }
}

/** The tool's stored CallToolResult, or one made from the error (a task failed before its tool could answer). */
function storedResult(record: TaskRecord): CallToolResult {
  if (record.result) return record.result as CallToolResult;
  const message = record.error?.message ?? `Task ended ${record.status} without a result`;
  return { content: [{ type: 'text', text: message }], isError: true };
}

/** `_meta` keys of a replay's links (PROTOCOL.md §30.3): the task it replays, and the newest task replaying it. */
export const REPLAY_OF_META_KEY = 'dev.taskrelay/replay-of';
export const REPLAYED_BY_META_KEY = 'dev.taskrelay/replayed-by';

/** A task's replay links as `_meta` entries of its `tasks/get` result (both eras); undefined when it has none. */
export function replayLinks(record: TaskRecord): Record<string, string> | undefined {
  if (record.replayOf === undefined && record.replayedBy === undefined) return undefined;
  return {
    ...(record.replayOf === undefined ? {} : { [REPLAY_OF_META_KEY]: record.replayOf }),
    ...(record.replayedBy === undefined ? {} : { [REPLAYED_BY_META_KEY]: record.replayedBy }),
  };
}

/** A task as 2025-11-25 shows it; `pollInterval`: what it suggests (a create's answer: `firstPollInterval`, §28.2). */
export function renderTask(record: TaskRecord, pollInterval: number = suggestedPollInterval(record)): Task {
  const task: Task = {
    taskId: record.taskId,
    status: record.status,
    createdAt: record.createdAt,
    lastUpdatedAt: record.lastUpdatedAt,
    ttl: record.ttl,
    pollInterval,
  };
  if (record.statusMessage !== undefined) task.statusMessage = record.statusMessage;
  return task;
}

/**
 * What 2025-11-25 `tasks/result` (and a plain call) answers for a terminal task: the tool's CallToolResult (a tool
 * error is `isError`); a cancelled task gets an error one.
 * @throws WireError the stored JSON-RPC error, when the tool ended its task with `ProtocolError`.
 */
export function renderResult(record: TaskRecord): CallToolResult {
  const outcome = outcomeOf(record);
  switch (outcome.kind) {
    case 'result':
      return outcome.result;
    case 'error':
      // taskrelay's own failures keep their isError result here, as before the extension existed; a tool's
      // ProtocolError has none and is answered as the JSON-RPC error it is.
      if (record.error?.code !== 'PROTOCOL_ERROR') return outcome.result;
      throw new WireError(outcome.error.code, outcome.error.message, outcome.error.data);
    case 'cancelled':
      return { content: [{ type: 'text', text: 'Task was cancelled' }], isError: true };
    case 'pending':
      return { content: [{ type: 'text', text: `Task is still ${record.status}` }], isError: true };
  }
}

export function relatedTaskMeta(taskId: string): Record<string, unknown> {
  return { [RELATED_TASK_META_KEY]: { taskId } };
}

/**
 * The gateway's wire edge: the only place a taskrelay error code becomes a JSON-RPC number. One table, code → number,
 * in the shape of BullMQ's `finishedErrors`: a domain error names its code and the table says how the wire answers
 * it, so no class ladder decides it and a new code cannot go out unmapped (the table is total over `ERROR_CODES`).
 */
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import {
  JSON_RPC,
  TaskrelayError,
  isRedisUnavailableError,
  type ErrorCode,
  type SerializedError,
} from '@taskrelay/shared';

/** An error as a task record stores it: its code may be one a newer or older build wrote. */
type StoredError = Omit<SerializedError, 'code'> & { code: string };

/** How the wire answers each domain error code (docs/MCP.md, "Errors"). */
export const JSON_RPC_CODE_OF: Readonly<Record<ErrorCode, number>> = {
  // The request names something that is not there, or cannot be: the caller's params are wrong.
  TASK_NOT_FOUND: JSON_RPC.INVALID_PARAMS,
  TASK_TERMINAL: JSON_RPC.INVALID_PARAMS,
  TOOL_NOT_FOUND: JSON_RPC.INVALID_PARAMS,
  REPLAY_REFUSED: JSON_RPC.INVALID_PARAMS,
  SCHEDULE_NOT_FOUND: JSON_RPC.INVALID_PARAMS,
  SCHEDULE_REFUSED: JSON_RPC.INVALID_PARAMS,
  INVALID_ARGUMENTS: JSON_RPC.INVALID_PARAMS,
  WEBHOOK_REFUSED: JSON_RPC.INVALID_PARAMS,
  // The spec's answer to a call whose task augmentation does not fit the tool's `taskSupport`.
  TASK_SUPPORT_MISMATCH: JSON_RPC.METHOD_NOT_FOUND,
  // A per-principal cap: the request is refused as it stands (PROTOCOL.md §25, §27.1).
  TOO_MANY_OPEN_TASKS: JSON_RPC.INVALID_REQUEST,
  TOO_MANY_PENDING_WEBHOOKS: JSON_RPC.INVALID_REQUEST,
  JSON_TOO_DEEP: JSON_RPC.INVALID_REQUEST,
  // A tool's own protocol error carries its number (`data.rpcCode`, see `rpcErrorOf`); this is the fallback.
  PROTOCOL_ERROR: JSON_RPC.INTERNAL_ERROR,
  // Everything else is the gateway's or the run's failure, not the request's.
  CONFIG_INVALID: JSON_RPC.INTERNAL_ERROR,
  REDIS_UNAVAILABLE: JSON_RPC.INTERNAL_ERROR,
  GATEWAY_SHUTDOWN: JSON_RPC.INTERNAL_ERROR,
  INVALID_TRANSITION: JSON_RPC.INTERNAL_ERROR,
  TOOL_FAILED: JSON_RPC.INTERNAL_ERROR,
  NON_RETRYABLE: JSON_RPC.INTERNAL_ERROR,
  CANCELLED: JSON_RPC.INTERNAL_ERROR,
  TIMEOUT: JSON_RPC.INTERNAL_ERROR,
  JOB_LOST: JSON_RPC.INTERNAL_ERROR,
  LOCK_LOST: JSON_RPC.INTERNAL_ERROR,
  CAPABILITY_MISSING: JSON_RPC.INTERNAL_ERROR,
  VERSION_CHANGED: JSON_RPC.INTERNAL_ERROR,
  WEBHOOK_UNRESOLVED: JSON_RPC.INTERNAL_ERROR,
  RETRY_AFTER: JSON_RPC.INTERNAL_ERROR,
  SUSPENDED: JSON_RPC.INTERNAL_ERROR,
  UPSTREAM_UNAVAILABLE: JSON_RPC.INTERNAL_ERROR,
  INVALID_PATH_VALUE: JSON_RPC.INTERNAL_ERROR,
  MEMORY_LIMIT: JSON_RPC.INTERNAL_ERROR,
  INTERNAL: JSON_RPC.INTERNAL_ERROR,
};

/**
 * A JSON-RPC error as the client should read it. The SDK puts `error.message` on the wire, and McpError's message is
 * prefixed `MCP error <code>: ` (which the client's McpError adds again): this one sends the message alone.
 */
export class WireError extends McpError {
  constructor(code: number, message: string, data?: unknown) {
    super(code, message, data);
    this.message = message;
  }
}

/**
 * An error as a JSON-RPC error object for the wire: McpError prefixes its message with `MCP error <code>: `, and the
 * wire carries the message alone (the client's McpError adds the prefix again). The one place that strips it.
 */
export function toWireErrorObject(error: unknown): RpcErrorObject {
  const mcp = toMcpError(error);
  const message = mcp.message.replace(/^MCP error -?\d+: /, '');
  return mcp.data === undefined ? { code: mcp.code, message } : { code: mcp.code, message, data: mcp.data };
}

/** A JSON-RPC error object, as a task's failure renders it. */
export interface RpcErrorObject {
  code: number;
  message: string;
  data?: unknown;
}

/**
 * The JSON-RPC error a stored failure stands for: a tool's `ProtocolError` keeps its own number and data, any other
 * code goes by the table with `data.code` naming it.
 */
export function rpcErrorOf(error: StoredError): RpcErrorObject {
  if (error.code === 'PROTOCOL_ERROR') {
    const rpcCode = error.data?.['rpcCode'];
    const rpc: RpcErrorObject = {
      code: typeof rpcCode === 'number' && Number.isInteger(rpcCode) ? rpcCode : JSON_RPC_CODE_OF.PROTOCOL_ERROR,
      message: error.message,
    };
    if (error.data?.['rpcData'] !== undefined) rpc.data = error.data['rpcData'];
    return rpc;
  }
  const code = (JSON_RPC_CODE_OF as Partial<Record<string, number>>)[error.code] ?? JSON_RPC.INTERNAL_ERROR;
  return { code, message: error.message, data: { code: error.code } };
}

/** What every request that needs Redis answers while Redis is unreachable (docs/MCP.md). */
export function taskStoreUnavailable(): WireError {
  return new WireError(
    JSON_RPC_CODE_OF.REDIS_UNAVAILABLE,
    'Task store unavailable: Redis is not answering; retry shortly',
    {
      code: 'REDIS_UNAVAILABLE' satisfies ErrorCode,
    },
  );
}

/** A plain call still running when the drain's grace ran out: its task was cancelled with `GATEWAY_SHUTDOWN`. */
export function callEndedByShutdown(): WireError {
  return new WireError(
    JSON_RPC_CODE_OF.GATEWAY_SHUTDOWN,
    'Gateway shut down before the call finished; the call was cancelled (GATEWAY_SHUTDOWN)',
    { code: 'GATEWAY_SHUTDOWN' satisfies ErrorCode },
  );
}

/** A `tasks/result` wait on a draining gateway: the task goes on, and any gateway can be asked again. */
export function waitEndedByShutdown(): WireError {
  return new WireError(
    JSON_RPC_CODE_OF.GATEWAY_SHUTDOWN,
    'Gateway is shutting down; the task goes on: ask for its result again (another gateway can answer)',
    { code: 'GATEWAY_SHUTDOWN' satisfies ErrorCode },
  );
}

export function toMcpError(error: unknown): McpError {
  if (error instanceof McpError) return error;
  if (isRedisUnavailableError(error)) return taskStoreUnavailable();
  if (error instanceof TaskrelayError) {
    const { code, message, data } = rpcErrorOf(error);
    return new WireError(code, message, data);
  }
  return new WireError(JSON_RPC.INTERNAL_ERROR, error instanceof Error ? error.message : String(error));
}

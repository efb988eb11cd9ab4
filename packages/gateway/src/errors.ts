/**
 * The gateway's wire edge: the only place a taskrelay error code becomes a JSON-RPC number.
 */
import { ErrorCode as JsonRpcCode, McpError } from '@modelcontextprotocol/sdk/types.js';
import { TaskrelayError, type ErrorCode } from '@taskrelay/shared';

const JSON_RPC_CODES: Partial<Record<ErrorCode, number>> = {
  TASK_NOT_FOUND: JsonRpcCode.InvalidParams,
  TASK_TERMINAL: JsonRpcCode.InvalidParams,
  TOOL_NOT_FOUND: JsonRpcCode.InvalidParams,
  INVALID_ARGUMENTS: JsonRpcCode.InvalidParams,
};

/** JSON-RPC -32601: the spec's answer to a taskSupport mismatch. */
export class TaskSupportError extends McpError {
  constructor(message: string) {
    super(JsonRpcCode.MethodNotFound, message);
  }
}

export function toMcpError(error: unknown): McpError {
  if (error instanceof McpError) return error;
  if (error instanceof TaskrelayError) {
    return new McpError(JSON_RPC_CODES[error.code] ?? JsonRpcCode.InternalError, error.message, { code: error.code });
  }
  return new McpError(JsonRpcCode.InternalError, error instanceof Error ? error.message : String(error));
}

export function taskNotFound(taskId: string): TaskrelayError {
  return new TaskrelayError('TASK_NOT_FOUND', `Task not found: ${taskId}`);
}

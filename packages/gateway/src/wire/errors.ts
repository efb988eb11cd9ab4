/**
 * The gateway's wire edge: the only place a taskrelay error code becomes a JSON-RPC number.
 */
import { ErrorCode as JsonRpcCode, McpError } from '@modelcontextprotocol/sdk/types.js';
import { TaskrelayError, isRedisUnavailableError, type ErrorCode } from '@taskrelay/shared';
import { TaskSupportMismatchError } from '../tasks/errors.js';
import { PendingWebhooksCapError, WebhookRefusedError } from '../ops/webhooks/url-policy.js';

const JSON_RPC_CODES: Partial<Record<ErrorCode, number>> = {
  TASK_NOT_FOUND: JsonRpcCode.InvalidParams,
  TASK_TERMINAL: JsonRpcCode.InvalidParams,
  TOOL_NOT_FOUND: JsonRpcCode.InvalidParams,
  INVALID_ARGUMENTS: JsonRpcCode.InvalidParams,
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

/** What every request that needs Redis answers while Redis is unreachable (docs/MCP.md). */
export function taskStoreUnavailable(): WireError {
  return new WireError(JsonRpcCode.InternalError, 'Task store unavailable: Redis is not answering; retry shortly', {
    code: 'REDIS_UNAVAILABLE' satisfies ErrorCode,
  });
}

/** A plain call still running when the drain's grace ran out: its task was cancelled with `GATEWAY_SHUTDOWN`. */
export function callEndedByShutdown(): WireError {
  return new WireError(
    JsonRpcCode.InternalError,
    'Gateway shut down before the call finished; the call was cancelled (GATEWAY_SHUTDOWN)',
    { code: 'GATEWAY_SHUTDOWN' satisfies ErrorCode },
  );
}

/** A `tasks/result` wait on a draining gateway: the task goes on, and any gateway can be asked again. */
export function waitEndedByShutdown(): WireError {
  return new WireError(
    JsonRpcCode.InternalError,
    'Gateway is shutting down; the task goes on: ask for its result again (another gateway can answer)',
    { code: 'GATEWAY_SHUTDOWN' satisfies ErrorCode },
  );
}

export function toMcpError(error: unknown): McpError {
  if (error instanceof McpError) return error;
  if (isRedisUnavailableError(error)) return taskStoreUnavailable();
  // The spec's answer to a taskSupport mismatch.
  if (error instanceof TaskSupportMismatchError) return new WireError(JsonRpcCode.MethodNotFound, error.message);
  // PROTOCOL.md §27.1.
  if (error instanceof WebhookRefusedError) {
    return new WireError(JsonRpcCode.InvalidParams, error.message, { code: 'WEBHOOK_REFUSED' });
  }
  if (error instanceof PendingWebhooksCapError) {
    return new WireError(JsonRpcCode.InvalidRequest, error.message, { code: 'TOO_MANY_PENDING_WEBHOOKS' });
  }
  if (error instanceof TaskrelayError) {
    return new WireError(JSON_RPC_CODES[error.code] ?? JsonRpcCode.InternalError, error.message, { code: error.code });
  }
  return new WireError(JsonRpcCode.InternalError, error instanceof Error ? error.message : String(error));
}

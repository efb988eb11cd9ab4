/**
 * Typed errors with stable string codes: one list, `ERROR_CODES`, and every error class of the packages' sources is a
 * `TaskrelayError` with one of them. Callers branch on `code`, never on message text or class. The JSON-RPC number of
 * each code is chosen only at the gateway's wire edge, in one table (`wire/errors.ts`); the numbers themselves are
 * named once, in `JSON_RPC`.
 */

/** Every JSON-RPC error number the packages send or read, named once (JSON-RPC 2.0, MCP, SEP-2575, SEP-2243). */
export const JSON_RPC = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  /** The implementation-defined server error the transports answer HTTP-level refusals with. */
  SERVER_ERROR: -32000,
  /** A 2025-11-25 session id this gateway does not hold (the SDK's own number for it). */
  SESSION_NOT_FOUND: -32001,
  /** 2026-07-28: an `Mcp-*` header missing, malformed or not matching the body (SEP-2243). */
  HEADER_MISMATCH: -32020,
  /** 2026-07-28: the client did not declare a capability the request needs (SEP-2575). */
  MISSING_CLIENT_CAPABILITY: -32021,
  /** 2026-07-28: an `MCP-Protocol-Version` the endpoint does not serve. */
  UNSUPPORTED_PROTOCOL_VERSION: -32022,
} as const;

export const ERROR_CODES = [
  'CONFIG_INVALID',
  'REDIS_UNAVAILABLE',
  'GATEWAY_SHUTDOWN',
  'TASK_NOT_FOUND',
  'TASK_TERMINAL',
  'INVALID_TRANSITION',
  'TOOL_NOT_FOUND',
  'REPLAY_REFUSED',
  'SCHEDULE_NOT_FOUND',
  'SCHEDULE_REFUSED',
  'INVALID_ARGUMENTS',
  'TOOL_FAILED',
  'NON_RETRYABLE',
  'CANCELLED',
  'TIMEOUT',
  'JOB_LOST',
  'LOCK_LOST',
  'CAPABILITY_MISSING',
  'PROTOCOL_ERROR',
  'VERSION_CHANGED',
  'TASK_SUPPORT_MISMATCH',
  'TOO_MANY_OPEN_TASKS',
  'TOO_MANY_PENDING_WEBHOOKS',
  'WEBHOOK_REFUSED',
  'WEBHOOK_UNRESOLVED',
  'JSON_TOO_DEEP',
  'RETRY_AFTER',
  'SUSPENDED',
  'UPSTREAM_UNAVAILABLE',
  'INVALID_PATH_VALUE',
  'MEMORY_LIMIT',
  'INTERNAL',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

export class TaskrelayError extends Error {
  readonly code: ErrorCode;
  readonly data: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown; data?: Record<string, unknown> }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'TaskrelayError';
    this.code = code;
    this.data = options?.data;
  }
}

/** Configuration could not be loaded; the message is a single line meant for a terminal. */
export class ConfigError extends TaskrelayError {
  constructor(message: string) {
    super('CONFIG_INVALID', message);
    this.name = 'ConfigError';
  }
}

/**
 * Thrown by a tool to fail its task at once, without retries (maps to BullMQ's `UnrecoverableError`).
 */
export class NonRetryableError extends TaskrelayError {
  constructor(message: string, options?: { cause?: unknown; data?: Record<string, unknown> }) {
    super('NON_RETRYABLE', message, options);
    this.name = 'NonRetryableError';
  }
}

/**
 * Thrown by a tool to end its task with a JSON-RPC error rather than a tool error (PROTOCOL.md §13): the task is
 * `failed` with `error {code, message, data}` in both renderings, and `tasks/result` / a plain call answers that
 * JSON-RPC error. Never retried. Use it for protocol-level failures (`-32602` invalid params the schema could not
 * express, say); an ordinary `throw` is a tool execution error, which a model can read and correct.
 */
export class ProtocolError extends TaskrelayError {
  /** The JSON-RPC error code (an integer; `JSON_RPC.INTERNAL_ERROR` when given anything else). */
  readonly rpcCode: number;
  readonly rpcData: unknown;

  constructor(code: number, message: string, data?: unknown) {
    const rpcCode = Number.isInteger(code) ? code : JSON_RPC.INTERNAL_ERROR;
    super('PROTOCOL_ERROR', message, { data: data === undefined ? { rpcCode } : { rpcCode, rpcData: data } });
    this.name = 'ProtocolError';
    this.rpcCode = rpcCode;
    this.rpcData = data;
  }
}

/** The serialised form of an error that crosses Redis. */
export interface SerializedError {
  code: ErrorCode;
  message: string;
  data?: Record<string, unknown>;
}

export function serializeError(error: unknown): SerializedError {
  if (error instanceof TaskrelayError) {
    return error.data === undefined
      ? { code: error.code, message: error.message }
      : { code: error.code, message: error.message, data: error.data };
  }
  // A tools module may bundle its own copy of this package: trust the shape of a ProtocolError too.
  const foreign = error as { name?: unknown; rpcCode?: unknown; rpcData?: unknown; message?: unknown } | null;
  if (foreign?.name === 'ProtocolError' && typeof foreign.rpcCode === 'number' && Number.isInteger(foreign.rpcCode)) {
    const data: Record<string, unknown> = { rpcCode: foreign.rpcCode };
    if (foreign.rpcData !== undefined) data['rpcData'] = foreign.rpcData;
    const message = typeof foreign.message === 'string' ? foreign.message : 'Protocol error';
    return { code: 'PROTOCOL_ERROR', message, data };
  }
  if (error instanceof Error) return { code: 'TOOL_FAILED', message: error.message || error.name };
  return { code: 'TOOL_FAILED', message: typeof error === 'string' ? error : 'Unknown error' };
}

export function deserializeError(serialized: SerializedError): TaskrelayError {
  const code = (ERROR_CODES as readonly string[]).includes(serialized.code) ? serialized.code : 'INTERNAL';
  return new TaskrelayError(code, serialized.message, serialized.data ? { data: serialized.data } : undefined);
}

/** One line, no stack: what a CLI entry point prints before exiting. */
export function oneLine(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.replace(/\s*\n\s*/g, ' ').trim();
}

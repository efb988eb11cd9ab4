/**
 * Typed errors with stable string codes. Callers branch on `code`, never on message text; JSON-RPC numeric codes
 * are chosen only at the gateway's wire edge.
 */
export const ERROR_CODES = [
  'CONFIG_INVALID',
  'REDIS_UNAVAILABLE',
  'GATEWAY_SHUTDOWN',
  'TASK_NOT_FOUND',
  'TASK_TERMINAL',
  'INVALID_TRANSITION',
  'TOOL_NOT_FOUND',
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
  /** The JSON-RPC error code (an integer; `-32603` when given anything else). */
  readonly rpcCode: number;
  readonly rpcData: unknown;

  constructor(code: number, message: string, data?: unknown) {
    const rpcCode = Number.isInteger(code) ? code : -32603;
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

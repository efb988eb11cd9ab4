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

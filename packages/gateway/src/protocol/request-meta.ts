/**
 * What a request says about its caller beyond its method and params, the same on both transports.
 */
import { TaskrelayError } from '@taskrelay/shared';

export const ANONYMOUS_PRINCIPAL = 'anonymous';

/** `_meta` key of a task call's idempotency key (docs/MCP.md). */
export const IDEMPOTENCY_META_KEY = 'dev.taskrelay/idempotency-key';

/** The idempotency key of a request, checked: a string of 1..200 characters, or absent. */
export function idempotencyKeyOf(meta: Record<string, unknown> | undefined): string | undefined {
  const value = meta?.[IDEMPOTENCY_META_KEY];
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || value.length < 1 || value.length > 200) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["${IDEMPOTENCY_META_KEY}"] must be a string of 1 to 200 characters`,
    );
  }
  return value;
}

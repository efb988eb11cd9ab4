/**
 * What a request says about its caller beyond its method and params, the same on both transports.
 */
import { TaskrelayError, tagsProblem } from '@taskrelay/shared';

export const ANONYMOUS_PRINCIPAL = 'anonymous';

/** `_meta` key of a task call's idempotency key (docs/MCP.md). */
export const IDEMPOTENCY_META_KEY = 'dev.taskrelay/idempotency-key';

/** `_meta` key of a call's priority level, 1 (first) to 5 (PROTOCOL.md §25.1; docs/MCP.md). */
export const PRIORITY_META_KEY = 'dev.taskrelay/priority';

/** `_meta` key of a call's tags (PROTOCOL.md §30.2; docs/MCP.md). */
export const TAGS_META_KEY = 'dev.taskrelay/tags';

/** The tags a call carries, checked (at most 10 strings of 1..64 characters of `[A-Za-z0-9_.:/=@+-]`), or absent. */
export function tagsOf(meta: Record<string, unknown> | undefined): string[] | undefined {
  const value = meta?.[TAGS_META_KEY];
  if (value === undefined) return undefined;
  const problem = Array.isArray(value) ? tagsProblem(value) : 'it must be an array of strings';
  if (problem !== undefined) {
    throw new TaskrelayError('INVALID_ARGUMENTS', `_meta["${TAGS_META_KEY}"]: ${problem}`);
  }
  return [...new Set(value as string[])];
}

/** The priority level a request asks for, checked for its form (an integer 1..5), or absent. */
export function priorityOf(meta: Record<string, unknown> | undefined): number | undefined {
  const value = meta?.[PRIORITY_META_KEY];
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > 5) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["${PRIORITY_META_KEY}"] must be an integer from 1 (first) to 5; got ${JSON.stringify(value)}`,
    );
  }
  return value;
}

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

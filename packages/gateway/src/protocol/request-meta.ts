/**
 * What a request says about its caller beyond its method and params, the same on both transports.
 */
import { z } from 'zod';
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

/** `_meta` key of a task call's delayed start, an ISO 8601 time (PROTOCOL.md §33.1; docs/MCP.md). */
export const START_AT_META_KEY = 'dev.taskrelay/start-at';

/** ISO 8601 with a date, a time and an offset (`Z` or `±hh:mm`): a time without a zone means nothing on a server. */
const isoInstant = z.iso.datetime({ offset: true, local: false });

/**
 * When a call asks to start (ms since the epoch), checked: an ISO 8601 time with its offset, at most `maxDelayMs`
 * ahead; absent when the call names none. A time already past is returned as it is: the task starts at once.
 */
export function startAtOf(
  meta: Record<string, unknown> | undefined,
  maxDelayMs: number,
  now = Date.now(),
): number | undefined {
  const value = meta?.[START_AT_META_KEY];
  if (value === undefined) return undefined;
  const parsed = isoInstant.safeParse(value);
  const ms = parsed.success ? Date.parse(parsed.data) : NaN;
  if (!Number.isFinite(ms)) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["${START_AT_META_KEY}"] must be an ISO 8601 time with its offset, such as "2026-12-04T07:30:00Z"; got ${JSON.stringify(value)}`,
    );
  }
  if (ms - now > maxDelayMs) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["${START_AT_META_KEY}"] ${JSON.stringify(value)} is too far ahead: at most ${Math.round(maxDelayMs / 86_400_000)} day(s) (TASKRELAY_MAX_START_DELAY_MS)`,
    );
  }
  return ms;
}

/**
 * What `ctx` checks before it does anything, in the worker's thread and in an isolated run's child alike (PROTOCOL.md
 * §31.2): the argument and stored-answer schemas, and the plain checks of `progress`, `notify` and `sleep`.
 */
import { z } from 'zod';
import { LOG_LEVELS } from '@taskrelay/shared';
import { CancelledError, cancelReasonOf } from './errors.js';

export const AskKeySchema = z
  .string()
  .regex(/^[A-Za-z0-9_.-]{1,100}$/, { message: 'must be 1 to 100 of A-Z a-z 0-9 _ - .' });

export const StepVersionSchema = z
  .string()
  .regex(/^[A-Za-z0-9_.-]{1,64}$/, { message: 'must be 1 to 64 of A-Z a-z 0-9 _ - .' });

export const ElicitParamsSchema = z.looseObject({
  message: z.string().min(1, { message: 'must not be empty' }),
  requestedSchema: z.looseObject({
    type: z.literal('object'),
    properties: z.record(z.string(), z.record(z.string(), z.unknown())),
    required: z.array(z.string()).optional(),
  }),
});

export const SampleParamsSchema = z.looseObject({
  messages: z.array(z.looseObject({ role: z.enum(['user', 'assistant']), content: z.unknown() })).min(1),
  maxTokens: z.number().int().positive(),
});

export const ElicitAnswerSchema = z.looseObject({
  action: z.enum(['accept', 'decline', 'cancel']),
  content: z.record(z.string(), z.unknown()).optional(),
});

export const SampleAnswerSchema = z.looseObject({
  role: z.enum(['user', 'assistant']),
  content: z.unknown(),
  model: z.string(),
});

export const RootsAnswerSchema = z.looseObject({
  roots: z.array(z.looseObject({ uri: z.string(), name: z.string().optional() })),
});

/** The largest `ctx.notify` data, serialised: 64 KiB. */
export const MAX_LOG_BYTES = 65_536;

export const FanOutItemsSchema = z
  .array(z.record(z.string(), z.unknown()), { message: 'items must be an array of argument objects' })
  .min(1, { message: 'items must not be empty' })
  .max(100_000, { message: 'at most 100000 items' });
export const FanOutOptionsSchema = z.object({
  tool: z.string().min(1),
  concurrency: z.number().int().min(1).max(1000).default(64),
  failFast: z.boolean().default(false),
});

/**
 * What a tool's `run` receives besides its input. Every member is safe to destructure
 * (`const { progress, sleep } = ctx`).

/**
 * `ctx.sleep`: resolves after `ms`, rejects with `CancelledError` as soon as `signal` aborts; in the worker's thread
 * and in an isolated run's child alike (PROTOCOL.md §31.2).
 */
export function abortableSleep(signal: AbortSignal, ms: number): Promise<void> {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
    return Promise.reject(new RangeError(`sleep needs a finite, non-negative number of ms (got ${String(ms)})`));
  }
  if (signal.aborted) return Promise.reject(new CancelledError(cancelReasonOf(signal)));
  return new Promise<void>((resolve, reject) => {
    // setImmediate for 0 so a tight `sleep(0)` loop yields without the 1 ms timer floor.
    const clear = () => (ms === 0 ? clearImmediate(immediate) : clearTimeout(timer));
    const onAbort = () => {
      clear();
      reject(new CancelledError(cancelReasonOf(signal)));
    };
    const done = () => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    };
    const immediate = ms === 0 ? setImmediate(done) : undefined;
    const timer = ms === 0 ? undefined : setTimeout(done, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * What `ctx.progress` checks before anything is sent, in the worker's thread and in an isolated run's child alike
 * (PROTOCOL.md §31.2).
 *
 * @throws RangeError when `progress` or `total` is not a finite number.
 */
export function checkProgressArgs(progress: number, total: number | undefined): void {
  if (typeof progress !== 'number' || !Number.isFinite(progress)) {
    throw new RangeError(`progress must be a finite number (got ${String(progress)})`);
  }
  if (total !== undefined && (typeof total !== 'number' || !Number.isFinite(total))) {
    throw new RangeError(`total must be a finite number (got ${String(total)})`);
  }
}

/**
 * What `ctx.notify` checks before anything is sent, as `checkProgressArgs`.
 *
 * @throws TypeError when `level` is not an MCP log level or `data` no JSON value; RangeError when `data` is too big.
 */
export function checkNotifyArgs(level: unknown, data: unknown): void {
  if (!(LOG_LEVELS as readonly unknown[]).includes(level)) {
    throw new TypeError(`ctx.notify: level must be one of ${LOG_LEVELS.join(', ')} (got ${String(level)})`);
  }
  const json = JSON.stringify(data ?? null) as string | undefined;
  if (json === undefined) throw new TypeError('ctx.notify: data must be a JSON value');
  if (Buffer.byteLength(json) > MAX_LOG_BYTES) {
    throw new RangeError(`ctx.notify: data is over ${MAX_LOG_BYTES} bytes as JSON`);
  }
}

/** The parent's status message while and after its children run (§26.3). */
export function batchMessage(counts: { completed: number; failed: number; total: number }): string {
  return `${counts.completed + counts.failed} of ${counts.total} children done (${counts.failed} failed)`;
}

export function issueText(error: z.ZodError): string {
  const issue = error.issues[0];
  return `${issue?.path.map(String).join('.') || 'params'} ${issue?.message ?? 'is invalid'}`;
}

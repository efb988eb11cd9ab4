/**
 * settle() from the table both workers share (test/vectors/settle.json; the Python worker's
 * packages/worker-python/tests/test_settle.py reads the same file): one test per case.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { NonRetryableError, TaskrelayError } from '@taskrelay/shared';
import { failOrRetry, settle, type SettleInput } from '../src/engine/stages/settle.js';
import { RetryAfterError, SuspendedError } from '../src/errors.js';

const VECTORS = new URL('../../../test/vectors/settle.json', import.meta.url);

const ErrorSpec = z.object({
  type: z.enum(['RetryAfterError', 'SuspendedError', 'NonRetryableError', 'Error', 'foreign', 'plain']),
  name: z.string().optional(),
  message: z.string().optional(),
  retryAfterMs: z.number().optional(),
  code: z.string().optional(),
});
const Table = z.object({
  cases: z.array(
    z.object({
      name: z.string(),
      input: z.object({
        outcome: z.union([
          z.object({ ok: z.literal(true), value: z.unknown() }),
          z.object({ ok: z.literal(false), error: ErrorSpec }),
        ]),
        reason: z.enum(['LOCK_LOST', 'TIMEOUT', 'CLIENT_CANCELLED', 'GATEWAY_SHUTDOWN', 'WORKER_SHUTDOWN']).nullish(),
        suspended: z.boolean().default(false),
        attemptsMade: z.number().int().default(0),
        attempts: z.number().int().default(1),
      }),
      expect: z.object({ kind: z.string() }).passthrough(),
    }),
  ),
});

/** The error a case describes, as this worker meets it. */
function errorOf(spec: z.infer<typeof ErrorSpec>): unknown {
  const message = spec.message ?? '';
  switch (spec.type) {
    case 'RetryAfterError':
      return new RetryAfterError(spec.retryAfterMs ?? 1, message);
    case 'SuspendedError':
      return new SuspendedError();
    case 'NonRetryableError':
      return new NonRetryableError(message);
    case 'Error':
      return new Error(message);
    case 'foreign':
      return Object.assign(new Error(message), { name: spec.name, retryAfterMs: spec.retryAfterMs });
    case 'plain':
      return { code: spec.code, message };
  }
}

const table = Table.parse(JSON.parse(readFileSync(VECTORS, 'utf8')));

describe('settle: how a run ends (test/vectors/settle.json)', () => {
  for (const { name, input, expect: expected } of table.cases) {
    it(name, () => {
      const error = input.outcome.ok ? undefined : errorOf(input.outcome.error);
      const outcome: SettleInput['outcome'] = input.outcome.ok
        ? { ok: true, value: input.outcome.value }
        : { ok: false, error };
      const action = settle({ ...input, outcome, reason: input.reason ?? undefined });
      expect(action).toEqual(expected.error === '$error' ? { ...expected, error } : expected);
      if (expected.error === '$error') expect((action as { error: unknown }).error).toBe(error);
    });
  }

  it('fails or retries a failure the same way outside a run (failOrRetry)', () => {
    const foreign = { code: 'NON_RETRYABLE', message: 'no' };
    expect(failOrRetry(foreign, { attempts: 5, attemptsMade: 0 })).toEqual({ kind: 'fail', error: foreign });
    const error = new TaskrelayError('INTERNAL', 'flaky');
    expect(failOrRetry(error, { attempts: 5, attemptsMade: 0 })).toEqual({ kind: 'retry', error });
  });
});

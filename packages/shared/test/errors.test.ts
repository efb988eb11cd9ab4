import { describe, expect, it } from 'vitest';
import {
  NonRetryableError,
  TaskrelayError,
  deserializeError,
  oneLine,
  serializeError,
} from '../src/protocol/errors.js';

describe('errors across Redis', () => {
  it('round-trips code, message and data', () => {
    const e = new TaskrelayError('TIMEOUT', 'too slow', { data: { ms: 5 } });
    const back = deserializeError(JSON.parse(JSON.stringify(serializeError(e))));
    expect(back).toBeInstanceOf(TaskrelayError);
    expect(back.code).toBe('TIMEOUT');
    expect(back.message).toBe('too slow');
    expect(back.data).toEqual({ ms: 5 });
  });

  it('maps plain errors to TOOL_FAILED and unknown codes to INTERNAL', () => {
    expect(serializeError(new Error('boom'))).toEqual({ code: 'TOOL_FAILED', message: 'boom' });
    expect(serializeError(new NonRetryableError('no')).code).toBe('NON_RETRYABLE');
    expect(deserializeError({ code: 'NOPE' as never, message: 'x' }).code).toBe('INTERNAL');
  });

  it('prints one line for a terminal', () => {
    expect(oneLine(new Error('a\n  b\nc'))).toBe('a b c');
  });
});

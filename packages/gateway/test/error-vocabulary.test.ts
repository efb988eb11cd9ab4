/**
 * One error vocabulary (PROTOCOL.md §16): every error class of the packages' sources is a `TaskrelayError` with one
 * code of `ERROR_CODES`, one table gives each code its JSON-RPC number, and an error goes out with one code.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, JSON_RPC, OpenCapReached, TaskrelayError } from '@taskrelay/shared';
import { JSON_RPC_CODE_OF, toMcpError } from '../src/wire/errors.js';
import { TaskSupportMismatchError } from '../src/tasks/errors.js';
import { OpenTaskLimit } from '../src/tasks/open-task-limit.js';
import { JsonTooDeepError } from '../src/http/http-guards.js';
import { PendingWebhooksCapError, WebhookLookupError, WebhookRefusedError } from '../src/tasks/webhooks/url-policy.js';

const PACKAGES = resolve(import.meta.dirname, '..', '..');

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') ? [path] : [];
  });
}

describe('one error vocabulary', () => {
  it('no error class of the server packages sits outside TaskrelayError', () => {
    const outside: string[] = [];
    for (const pkg of ['shared', 'gateway', 'worker']) {
      for (const file of sources(join(PACKAGES, pkg, 'src'))) {
        for (const [, name, base] of readFileSync(file, 'utf8').matchAll(/class (\w+) extends (\w+)/g)) {
          // The wire's own error is the SDK's (what the SDK's server sends); every other one is a domain error.
          if (name === 'TaskrelayError') continue;
          if (base === 'Error' || base === 'TypeError' || base === 'RangeError') outside.push(`${pkg}: ${name}`);
        }
      }
    }
    expect(outside).toEqual([]);
  });

  it('the wire table gives every code a JSON-RPC number from the one list', () => {
    const numbers = new Set<number>(Object.values(JSON_RPC));
    for (const code of ERROR_CODES) expect(numbers.has(JSON_RPC_CODE_OF[code]), code).toBe(true);
    expect(Object.keys(JSON_RPC_CODE_OF).sort()).toEqual([...ERROR_CODES].sort());
  });

  it.each([
    ['a refused webhook', new WebhookRefusedError('no'), 'WEBHOOK_REFUSED', JSON_RPC.INVALID_PARAMS],
    [
      'the pending-webhooks cap',
      new PendingWebhooksCapError('full'),
      'TOO_MANY_PENDING_WEBHOOKS',
      JSON_RPC.INVALID_REQUEST,
    ],
    [
      'an unresolved webhook host',
      new WebhookLookupError('h', new Error('x')),
      'WEBHOOK_UNRESOLVED',
      JSON_RPC.INTERNAL_ERROR,
    ],
    ['a taskSupport mismatch', new TaskSupportMismatchError('no'), 'TASK_SUPPORT_MISMATCH', JSON_RPC.METHOD_NOT_FOUND],
    ['the open-work cap', new OpenCapReached(3), 'TOO_MANY_OPEN_TASKS', JSON_RPC.INVALID_REQUEST],
    [
      'the open-task refusal',
      new OpenTaskLimit({} as never, 3, 1).refusal(3),
      'TOO_MANY_OPEN_TASKS',
      JSON_RPC.INVALID_REQUEST,
    ],
    ['a body nested too deep', new JsonTooDeepError(64), 'JSON_TOO_DEEP', JSON_RPC.INVALID_REQUEST],
  ] as const)('%s is a TaskrelayError that goes out with one code', (_what, error, code, rpc) => {
    expect(error).toBeInstanceOf(TaskrelayError);
    expect(error.code).toBe(code);
    const wire = toMcpError(error);
    expect(wire.code).toBe(rpc);
    expect(wire.data).toEqual({ code });
    expect(wire.message).toBe(error.message);
  });

  it('a tool’s ProtocolError keeps its own number; anything unknown is an internal error', () => {
    const protocol = new TaskrelayError('PROTOCOL_ERROR', 'bad', { data: { rpcCode: -32099, rpcData: { x: 1 } } });
    expect(toMcpError(protocol)).toMatchObject({ code: -32099, data: { x: 1 } });
    expect(toMcpError(new Error('boom')).code).toBe(JSON_RPC.INTERNAL_ERROR);
  });
});

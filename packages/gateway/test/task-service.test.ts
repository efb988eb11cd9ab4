import { describe, expect, it } from 'vitest';
import { MIN_TTL_MS, grantTtl } from '../src/tasks/task-service.js';
import { renderResult, renderTask } from '../src/wire/task-wire.js';
import type { TaskRecord } from '@taskrelay/shared';

describe('granted ttl', () => {
  const config = { defaultTtlMs: 3_600_000, maxTtlMs: 86_400_000 };
  it('uses the default when none is asked and clamps to [1 s, max] in whole ms', () => {
    expect(grantTtl(undefined, config)).toBe(3_600_000);
    expect(grantTtl(0, config)).toBe(MIN_TTL_MS);
    expect(grantTtl(-5, config)).toBe(MIN_TTL_MS);
    expect(grantTtl(1500.5, config)).toBe(1501);
    expect(grantTtl(1e12, config)).toBe(86_400_000);
    expect(grantTtl(Number.NaN, config)).toBe(3_600_000);
  });
});

describe('2025-11-25 rendering of a stored task', () => {
  const base: TaskRecord = {
    taskId: 't',
    status: 'working',
    createdAt: 'c',
    lastUpdatedAt: 'u',
    ttl: 1000,
    pollInterval: 500,
    tool: 'x',
    queue: 'q',
    principal: 'p',
    mode: 'task',
    progressToken: 'secret-of-the-caller',
    sessionId: 'sid',
  };

  it('shows only the wire fields of a Task', () => {
    expect(renderTask({ ...base, statusMessage: 'half' })).toEqual({
      taskId: 't',
      status: 'working',
      statusMessage: 'half',
      createdAt: 'c',
      lastUpdatedAt: 'u',
      ttl: 1000,
      pollInterval: 500,
    });
  });

  it('gives the stored result for completed and failed tasks and an error result for cancelled ones', () => {
    const result = { content: [{ type: 'text', text: 'ok' }] };
    expect(renderResult({ ...base, status: 'completed', result })).toEqual(result);
    expect(renderResult({ ...base, status: 'cancelled' })).toMatchObject({ isError: true });
    expect(renderResult({ ...base, status: 'failed', error: { code: 'TOOL_FAILED', message: 'boom' } })).toEqual({
      content: [{ type: 'text', text: 'boom' }],
      isError: true,
    });
  });
});

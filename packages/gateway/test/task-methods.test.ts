/**
 * The task methods' reads (PROTOCOL.md §28.1): `tasks/get` reads through `TaskService.poll`, which lets a young task
 * end first; every other read (the extension's `tasks/cancel`) answers at once through `get`. Both eras.
 */
import { describe, expect, it, vi } from 'vitest';
import { createLogger, type TaskRecord } from '@taskrelay/shared';
import { McpMethods, type McpMethodsOptions, type RequestContext } from '../src/protocol/methods.js';
import { TASKS_EXTENSION_ID } from '../src/wire/task-wire-ext.js';

const TASK: TaskRecord = {
  taskId: 't1',
  status: 'completed',
  createdAt: '2026-12-01T10:00:00.000Z',
  lastUpdatedAt: '2026-12-01T10:00:00.002Z',
  ttl: 60_000,
  pollInterval: 1_000,
  tool: 'x',
  queue: 'default',
  principal: 'alice',
  mode: 'task',
  result: { content: [] },
};

function methods() {
  const service = { poll: vi.fn(() => Promise.resolve(TASK)), get: vi.fn(() => Promise.resolve(TASK)) };
  const options = { service, log: createLogger('test', { level: 'silent' }) } as unknown as McpMethodsOptions;
  return { service, methods: new McpMethods(options) };
}

function context(era: RequestContext['era']): RequestContext {
  return {
    era,
    principal: 'alice',
    sessionId: era === '2025-11-25' ? 's1' : undefined,
    scope: 's1',
    requestId: 1,
    rendering: era === '2025-11-25' ? '2025-11-25' : 'extension',
    meta: { 'io.modelcontextprotocol/clientCapabilities': { extensions: { [TASKS_EXTENSION_ID]: {} } } },
    clientCapabilities: [],
    signal: new AbortController().signal,
  };
}

describe('§28.1 which reads wait for a young task', () => {
  it('tasks/get polls, in both eras, for the caller', async () => {
    for (const era of ['2025-11-25', '2026-07-28'] as const) {
      const { service, methods: m } = methods();
      await expect(m.getTask(context(era), 't1')).resolves.toMatchObject({ taskId: 't1', status: 'completed' });
      expect(service.poll).toHaveBeenCalledWith('t1', 'alice');
      expect(service.get).not.toHaveBeenCalled();
    }
  });

  it('the extension’s tasks/cancel reads at once', async () => {
    const { service, methods: m } = methods();
    await expect(m.cancelTask(context('2026-07-28'), 't1')).resolves.toEqual({ resultType: 'complete' });
    expect(service.get).toHaveBeenCalledWith('t1', 'alice');
    expect(service.poll).not.toHaveBeenCalled();
  });
});

/**
 * PROTOCOL.md §13: one stored task, two renderings that agree on what happened. Each case is a TaskRecord as the
 * scripts store it.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { McpError } from '@modelcontextprotocol/sdk/types.js';
import { FIRST_POLL_MS, firstPollInterval, type TaskRecord } from '@taskrelay/shared';
import { declaresTasksExtension, renderCreateTaskExt, renderDetailedTask } from '../src/wire/task-wire-ext.js';
import { outcomeOf, renderResult, renderTask, replayLinks } from '../src/wire/task-wire.js';

function record(fields: Partial<TaskRecord>): TaskRecord {
  return {
    taskId: 't1',
    status: 'working',
    createdAt: '2026-12-01T10:00:00.000Z',
    lastUpdatedAt: '2026-12-01T10:00:01.000Z',
    ttl: 60_000,
    pollInterval: 1_000,
    tool: 'x',
    queue: 'default',
    principal: 'p',
    mode: 'task',
    ...fields,
  };
}

const toolError = { content: [{ type: 'text', text: 'disk full' }], isError: true };

describe('§13 the 2025-11-25 rendering', () => {
  it('keeps ttl and pollInterval and the stored status', () => {
    expect(renderTask(record({ statusMessage: '3 of 5' }))).toEqual({
      taskId: 't1',
      status: 'working',
      statusMessage: '3 of 5',
      createdAt: '2026-12-01T10:00:00.000Z',
      lastUpdatedAt: '2026-12-01T10:00:01.000Z',
      ttl: 60_000,
      pollInterval: 1_000,
    });
  });

  it('answers a tool error as the failed task it is, with its isError result', () => {
    const failed = record({
      status: 'failed',
      result: toolError,
      error: { code: 'NON_RETRYABLE', message: 'disk full' },
    });
    expect(renderTask(failed).status).toBe('failed');
    expect(renderResult(failed)).toEqual(toolError);
  });

  it('answers a ProtocolError as that JSON-RPC error, without the doubled "MCP error" prefix', () => {
    const failed = record({
      status: 'failed',
      error: { code: 'PROTOCOL_ERROR', message: 'bad range', data: { rpcCode: -32602, rpcData: { field: 'n' } } },
    });
    const error = (() => {
      try {
        renderResult(failed);
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(error).toBeInstanceOf(McpError);
    expect(error).toMatchObject({ code: -32602, message: 'bad range', data: { field: 'n' } });
  });
});

describe('§30.3 replay links', () => {
  it('are kebab-case _meta keys like every other taskrelay key (replay-of, replayed-by), read from the stored fields', () => {
    expect(replayLinks(record({ replayOf: 'old', replayedBy: 'newer' }))).toEqual({
      'dev.taskrelay/replay-of': 'old',
      'dev.taskrelay/replayed-by': 'newer',
    });
    expect(replayLinks(record({}))).toBeUndefined();
  });
});

describe('§13 the extension rendering', () => {
  it('creates flat, with ttlMs and pollIntervalMs and no 2025 names', () => {
    const created = renderCreateTaskExt(record({}));
    expect(created).toEqual({
      resultType: 'task',
      taskId: 't1',
      status: 'working',
      createdAt: '2026-12-01T10:00:00.000Z',
      lastUpdatedAt: '2026-12-01T10:00:01.000Z',
      ttlMs: 60_000,
      pollIntervalMs: FIRST_POLL_MS,
    });
    expect(created).not.toHaveProperty('ttl');
    expect(created).not.toHaveProperty('task');
  });

  it('renders a tool error as a completed task whose result has isError', () => {
    const failed = record({
      status: 'failed',
      result: toolError,
      error: { code: 'TOOL_FAILED', message: 'disk full' },
    });
    expect(renderDetailedTask(failed)).toMatchObject({
      status: 'completed',
      resultType: 'complete',
      result: toolError,
    });
    expect(renderDetailedTask(failed)).not.toHaveProperty('error');
  });

  it('renders a JSON-RPC error as failed with error and no result', () => {
    const failed = record({
      status: 'failed',
      error: { code: 'PROTOCOL_ERROR', message: 'bad range', data: { rpcCode: -32602 } },
    });
    const detailed = renderDetailedTask(failed);
    expect(detailed).toMatchObject({ status: 'failed', error: { code: -32602, message: 'bad range' } });
    expect(detailed).not.toHaveProperty('result');
  });

  it("renders taskrelay's own failures (a lost job) as failed with an internal error naming the code", () => {
    const lost = record({
      status: 'failed',
      result: { content: [{ type: 'text', text: 'lost' }], isError: true },
      error: { code: 'JOB_LOST', message: 'lost' },
    });
    expect(renderDetailedTask(lost)).toMatchObject({
      status: 'failed',
      error: { code: -32603, message: 'lost', data: { code: 'JOB_LOST' } },
    });
    // The 2025-11-25 rendering keeps its isError result for the same record.
    expect(renderResult(lost)).toEqual({ content: [{ type: 'text', text: 'lost' }], isError: true });
  });

  it('inlines the result of a completed task without the 2025 related-task _meta', () => {
    const done = record({
      status: 'completed',
      result: {
        content: [{ type: 'text', text: 'ok' }],
        _meta: { 'io.modelcontextprotocol/related-task': { taskId: 't1' } },
      },
    });
    expect(renderDetailedTask(done).result).toEqual({
      resultType: 'complete',
      content: [{ type: 'text', text: 'ok' }],
    });
  });

  it('lists the pending input request of an input_required task, keyed by its number', () => {
    const waiting = record({
      status: 'input_required',
      pendingInput: '2',
      pendingInputs: ['2'],
      inputRequests: {
        '1': { method: 'elicitation/create', params: { message: 'first' } },
        '2': { method: 'sampling/createMessage', params: { messages: [], maxTokens: 5 } },
      },
      inputResponses: { '1': { action: 'accept' } },
    });
    expect(renderDetailedTask(waiting)).toMatchObject({
      status: 'input_required',
      inputRequests: { '2': { method: 'sampling/createMessage', params: { messages: [], maxTokens: 5 } } },
    });
    expect(Object.keys(renderDetailedTask(waiting).inputRequests ?? {})).toEqual(['2']);
  });

  it('agrees with the 2025 rendering on every terminal status', () => {
    const cases: Array<[TaskRecord, string, string]> = [
      [record({ status: 'completed', result: { content: [] } }), 'completed', 'completed'],
      [
        record({ status: 'failed', result: toolError, error: { code: 'TOOL_FAILED', message: 'm' } }),
        'failed',
        'completed',
      ],
      [
        record({ status: 'failed', error: { code: 'PROTOCOL_ERROR', message: 'm', data: { rpcCode: -1 } } }),
        'failed',
        'failed',
      ],
      [record({ status: 'cancelled' }), 'cancelled', 'cancelled'],
    ];
    for (const [r, v1, ext] of cases) {
      expect([renderTask(r).status, renderDetailedTask(r).status]).toEqual([v1, ext]);
      expect(outcomeOf(r).kind).not.toBe('pending');
    }
  });

  it('reads the per-request extension declaration', () => {
    const meta = {
      'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
    };
    expect(declaresTasksExtension(meta)).toBe(true);
    expect(declaresTasksExtension({ 'io.modelcontextprotocol/clientCapabilities': { extensions: {} } })).toBe(false);
    expect(declaresTasksExtension(undefined)).toBe(false);
  });
});

describe('§28 the poll interval both renderings suggest', () => {
  afterEach(() => vi.useRealTimers());

  it('is short for a task just created and the configured one for an old task, in both eras', () => {
    vi.useFakeTimers();
    vi.setSystemTime(Date.parse('2026-12-01T10:00:00.200Z'));
    expect(renderTask(record({})).pollInterval).toBe(50);
    expect(renderDetailedTask(record({})).pollIntervalMs).toBe(50);
    vi.setSystemTime(Date.parse('2026-12-01T10:00:02.000Z'));
    expect(renderTask(record({})).pollInterval).toBe(450);
    expect(renderDetailedTask(record({})).pollIntervalMs).toBe(450);
    vi.setSystemTime(Date.parse('2026-12-01T10:01:00.000Z'));
    expect(renderTask(record({})).pollInterval).toBe(1_000);
    expect(renderDetailedTask(record({})).pollIntervalMs).toBe(1_000);
  });
});

describe('§28.2 the interval a create suggests', () => {
  afterEach(() => vi.useRealTimers());

  it('is FIRST_POLL_MS however long the create took, at most a smaller ceiling, and the ceiling once terminal', () => {
    vi.useFakeTimers();
    for (const at of ['2026-12-01T10:00:00.000Z', '2026-12-01T10:00:02.000Z']) {
      vi.setSystemTime(Date.parse(at));
      expect(renderCreateTaskExt(record({})).pollIntervalMs).toBe(FIRST_POLL_MS);
      expect(firstPollInterval(record({ status: 'input_required' }))).toBe(FIRST_POLL_MS);
    }
    expect(renderCreateTaskExt(record({ pollInterval: 4 })).pollIntervalMs).toBe(4);
    // A create answered failed (arguments refused before anything ran): nothing more will change.
    expect(firstPollInterval(record({ status: 'failed' }))).toBe(1_000);
    expect(renderTask(record({ status: 'failed' }), firstPollInterval(record({ status: 'failed' }))).pollInterval).toBe(
      1_000,
    );
  });
});

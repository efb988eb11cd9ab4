import { describe, expect, it } from 'vitest';
import {
  MIN_SUGGESTED_POLL_MS,
  TASK_STATUSES,
  TRANSITIONS,
  allowedSources,
  canTransition,
  isTerminal,
  suggestedPollInterval,
  type TaskRecord,
} from '../src/protocol/task-model.js';

describe('task state machine', () => {
  it('marks exactly completed, failed and cancelled as terminal', () => {
    expect(TASK_STATUSES.filter(isTerminal)).toEqual(['completed', 'failed', 'cancelled']);
  });

  it('never lets a terminal status change', () => {
    for (const from of ['completed', 'failed', 'cancelled'] as const) {
      for (const to of TASK_STATUSES) expect(canTransition(from, to)).toBe(false);
    }
  });

  it('lets working move to any other status and input_required back to working', () => {
    expect(TRANSITIONS.working).toEqual(['input_required', 'completed', 'failed', 'cancelled']);
    expect(canTransition('input_required', 'working')).toBe(true);
    expect(canTransition('working', 'working')).toBe(false);
  });

  it('derives the allowed sources of a transition from the same table', () => {
    expect(allowedSources('cancelled')).toEqual(['working', 'input_required']);
    expect(allowedSources('working')).toEqual(['input_required']);
  });
});

describe('§28 suggestedPollInterval', () => {
  const created = Date.parse('2026-12-01T10:00:00.000Z');
  const task = (fields: Partial<TaskRecord> = {}): TaskRecord => ({
    taskId: 't1',
    status: 'working',
    createdAt: new Date(created).toISOString(),
    lastUpdatedAt: new Date(created).toISOString(),
    ttl: 60_000,
    pollInterval: 1_000,
    tool: 'x',
    queue: 'default',
    principal: 'p',
    mode: 'task',
    ...fields,
  });

  it('stays at the floor for 400 ms, then grows with a quarter of the task’s age up to the configured interval', () => {
    expect(suggestedPollInterval(task(), created)).toBe(MIN_SUGGESTED_POLL_MS);
    expect(suggestedPollInterval(task(), created + 100)).toBe(MIN_SUGGESTED_POLL_MS);
    expect(suggestedPollInterval(task(), created + 400)).toBe(MIN_SUGGESTED_POLL_MS);
    expect(suggestedPollInterval(task(), created + 800)).toBe(150);
    expect(suggestedPollInterval(task(), created + 2_000)).toBe(450);
    expect(suggestedPollInterval(task(), created + 4_200)).toBe(1_000);
    expect(suggestedPollInterval(task(), created + 3_600_000)).toBe(1_000);
    expect(suggestedPollInterval(task({ status: 'input_required' }), created + 800)).toBe(150);
  });

  it('gives a terminal task, a configured interval under the floor, and a clock ahead of ours their obvious values', () => {
    expect(suggestedPollInterval(task({ status: 'completed' }), created + 10)).toBe(1_000);
    expect(suggestedPollInterval(task({ pollInterval: 20 }), created + 10)).toBe(20);
    expect(suggestedPollInterval(task({ pollInterval: 20 }), created + 10_000)).toBe(20);
    expect(suggestedPollInterval(task(), created - 5_000)).toBe(MIN_SUGGESTED_POLL_MS);
    expect(suggestedPollInterval(task({ createdAt: 'not a date' }), created)).toBe(1_000);
  });
});

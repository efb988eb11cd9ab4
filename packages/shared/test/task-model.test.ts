import { describe, expect, it } from 'vitest';
import { TASK_STATUSES, TRANSITIONS, allowedSources, canTransition, isTerminal } from '../src/task-model.js';

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

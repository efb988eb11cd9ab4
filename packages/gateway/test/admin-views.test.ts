/**
 * Issue "Operate it" item 7: the dashboard shows the question a task waits on (an elicitation's message, a sampling
 * request's first text), not a blank message.
 */
import { describe, expect, it } from 'vitest';
import type { TaskRecord } from '@taskrelay/shared';
import { pendingQuestion } from '../src/admin/router.js';

const base: TaskRecord = {
  taskId: 't',
  status: 'input_required',
  createdAt: '',
  lastUpdatedAt: '',
  ttl: 1,
  pollInterval: 1,
  tool: 'x',
  queue: 'q',
  principal: 'p',
  mode: 'task',
};

describe('the question a task waits on', () => {
  it('is the first pending request’s message, a sampling request’s first text, or its method', () => {
    expect(
      pendingQuestion({
        ...base,
        pendingInputs: ['2'],
        inputRequests: {
          '1': { method: 'elicitation/create', params: { message: 'answered already' } },
          '2': { method: 'elicitation/create', params: { message: 'Approve the deploy?' } },
        },
      } as TaskRecord),
    ).toBe('Approve the deploy?');
    expect(
      pendingQuestion({
        ...base,
        pendingInputs: ['1'],
        inputRequests: {
          '1': { method: 'sampling/createMessage', params: { messages: [{ content: { text: 'Summarise this' } }] } },
        },
      } as TaskRecord),
    ).toBe('Summarise this');
    expect(
      pendingQuestion({
        ...base,
        pendingInputs: ['1'],
        inputRequests: { '1': { method: 'roots/list', params: {} } },
      } as TaskRecord),
    ).toBe('roots/list');
    expect(pendingQuestion(base)).toBeUndefined();
  });
});

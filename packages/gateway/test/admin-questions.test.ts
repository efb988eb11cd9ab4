/**
 * What the operator pages say a task waits to be answered (issue 34 item 7a): one line per pending input request
 * (PROTOCOL.md §12.2), whatever its method; answered requests are not listed.
 */
import { describe, expect, it } from 'vitest';
import type { InputRequest } from '@taskrelay/shared';
import { pendingQuestions } from '../src/admin/queries.js';

const elicit: InputRequest = {
  method: 'elicitation/create',
  params: { message: 'Ship release 4.2?', requestedSchema: { type: 'object', properties: {} } },
};
const sample: InputRequest = {
  method: 'sampling/createMessage',
  params: {
    messages: [
      { role: 'user', content: { type: 'text', text: 'first' } },
      { role: 'user', content: [{ type: 'image' }, { type: 'text', text: 'Summarise the report' }] },
    ],
    maxTokens: 100,
  },
};
const roots: InputRequest = { method: 'roots/list', params: {} };

describe('pendingQuestions', () => {
  it("names an elicitation's message, a sampling request's last text and a roots request, pending ones only", () => {
    const task = {
      pendingInputs: ['2', '3', '4'],
      inputRequests: { '1': elicit, '2': elicit, '3': sample, '4': roots },
    };
    expect(pendingQuestions(task)).toEqual([
      'Ship release 4.2?',
      "the client's model: Summarise the report",
      "the client's roots (roots/list)",
    ]);
  });

  it('lists nothing for a task that waits for no answer, or whose requests were not read', () => {
    expect(pendingQuestions({})).toEqual([]);
    expect(pendingQuestions({ pendingInputs: ['1'] })).toEqual([]);
  });
});

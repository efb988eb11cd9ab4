import { describe, expect, it } from 'vitest';
import { checkAnswer } from '../src/wire/input-answers.js';

const approval = {
  method: 'elicitation/create' as const,
  params: {
    message: 'Deploy?',
    requestedSchema: { type: 'object', properties: { approved: { type: 'boolean' } }, required: ['approved'] },
  },
};

describe('checkAnswer (PROTOCOL.md §12.5)', () => {
  it('accepts an ElicitResult whose content matches the requested schema, and decline without content', () => {
    expect(checkAnswer(approval, { action: 'accept', content: { approved: true }, _meta: {} })).toEqual({
      ok: true,
      answer: { action: 'accept', content: { approved: true } },
    });
    expect(checkAnswer(approval, { action: 'decline' })).toEqual({ ok: true, answer: { action: 'decline' } });
  });

  it('refuses content that does not match the schema, and what is not an ElicitResult, saying why', () => {
    const wrongType = checkAnswer(approval, { action: 'accept', content: { approved: 'yes' } });
    expect(wrongType).toMatchObject({ ok: false, message: expect.stringContaining('requestedSchema') });
    expect(checkAnswer(approval, { action: 'accept', content: {} })).toMatchObject({ ok: false });
    expect(checkAnswer(approval, { action: 'maybe' })).toMatchObject({
      ok: false,
      message: expect.stringContaining('ElicitResult'),
    });
  });

  it('checks a sampling answer is a CreateMessageResult', () => {
    const sampling = { method: 'sampling/createMessage' as const, params: { messages: [], maxTokens: 5 } };
    const good = { role: 'assistant', content: { type: 'text', text: 'hi' }, model: 'm' };
    expect(checkAnswer(sampling, good)).toEqual({ ok: true, answer: good });
    expect(checkAnswer(sampling, { role: 'assistant', content: { type: 'text', text: 'hi' } })).toMatchObject({
      ok: false,
      message: expect.stringContaining('CreateMessageResult'),
    });
  });

  it('checks string formats in the requested schema, as tool arguments are checked (one validator set-up)', () => {
    const contact = {
      method: 'elicitation/create' as const,
      params: {
        message: 'Where do we send it?',
        requestedSchema: {
          type: 'object',
          properties: { email: { type: 'string', format: 'email' }, when: { type: 'string', format: 'date' } },
          required: ['email'],
        },
      },
    };
    expect(
      checkAnswer(contact, { action: 'accept', content: { email: 'ops@example.com', when: '2026-12-01' } }),
    ).toEqual({ ok: true, answer: { action: 'accept', content: { email: 'ops@example.com', when: '2026-12-01' } } });
    expect(checkAnswer(contact, { action: 'accept', content: { email: 'not an address' } })).toMatchObject({
      ok: false,
      message: expect.stringContaining('email must match format "email"'),
    });
    expect(checkAnswer(contact, { action: 'accept', content: { email: 'a@b.example', when: 'soon' } })).toMatchObject({
      ok: false,
      message: expect.stringContaining('when must match format "date"'),
    });
  });
});

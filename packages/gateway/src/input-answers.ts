/**
 * Checks a client's answer to one of a task's input requests before it is stored (PROTOCOL.md §12.5): an elicitation
 * answer is an `ElicitResult` whose `content`, on `accept`, satisfies the request's `requestedSchema`; a sampling
 * answer is a `CreateMessageResult`.
 */
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import type { JsonSchemaType } from '@modelcontextprotocol/sdk/validation/types.js';
import {
  CreateMessageResultSchema,
  CreateMessageResultWithToolsSchema,
  ElicitResultSchema,
} from '@modelcontextprotocol/sdk/types.js';
import type { InputRequest } from '@taskrelay/shared';
import type { z } from 'zod';

export type AnswerCheck = { ok: true; answer: Record<string, unknown> } | { ok: false; message: string };

const validator = new AjvJsonSchemaValidator();

export function checkAnswer(request: InputRequest, raw: unknown): AnswerCheck {
  if (request.method === 'elicitation/create') {
    const parsed = ElicitResultSchema.safeParse(raw);
    if (!parsed.success) return { ok: false, message: `not an ElicitResult: ${issueText(parsed.error)}` };
    const { _meta: _ignored, ...answer } = parsed.data;
    const schema = request.params['requestedSchema'];
    if (answer.action === 'accept' && schema !== undefined) {
      const checked = validator.getValidator(schema as JsonSchemaType)(answer.content ?? {});
      if (!checked.valid)
        return { ok: false, message: `content does not match requestedSchema: ${checked.errorMessage}` };
    }
    return { ok: true, answer };
  }
  const withTools = request.params['tools'] !== undefined || request.params['toolChoice'] !== undefined;
  const parsed = (withTools ? CreateMessageResultWithToolsSchema : CreateMessageResultSchema).safeParse(raw);
  if (!parsed.success) return { ok: false, message: `not a CreateMessageResult: ${issueText(parsed.error)}` };
  const { _meta: _ignored, ...answer } = parsed.data;
  return { ok: true, answer };
}

function issueText(error: z.ZodError): string {
  const issue = error.issues[0];
  return `${issue?.path.map(String).join('.') || 'result'} ${issue?.message ?? 'is invalid'}`;
}

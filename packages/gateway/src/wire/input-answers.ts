/**
 * Checks a client's answer to one of a task's input requests before it is stored (PROTOCOL.md §12.5): an elicitation
 * answer is an `ElicitResult` whose `content`, on `accept`, satisfies the request's `requestedSchema` (JSON Schema
 * 2020-12, the dialect MCP names); a sampling answer is a `CreateMessageResult` (with tool use when the request
 * offered tools); a roots answer is a `ListRootsResult`. Both answer routes use it: the 2025-11-25 response to the gateway's request, and the extension's
 * `tasks/update {inputResponses}`.
 */
import {
  CreateMessageResultSchema,
  CreateMessageResultWithToolsSchema,
  ElicitResultSchema,
  ListRootsResultSchema,
} from '@modelcontextprotocol/sdk/types.js';
import type { InputRequest } from '@taskrelay/shared';
import type { z } from 'zod';
import { JsonSchemaValidator, type ValidateFunction } from '../tasks/json-schema.js';
import type { AnswerCheck } from '../tasks/task-policy.js';

/** Used when the caller passes none (the gateway passes its one validator, shared with the catalog). */
const fallbackSchemas = new JsonSchemaValidator();

export function checkAnswer(
  request: InputRequest,
  raw: unknown,
  jsonSchemas: JsonSchemaValidator = fallbackSchemas,
): AnswerCheck {
  if (request.method === 'elicitation/create') {
    const parsed = ElicitResultSchema.safeParse(raw);
    if (!parsed.success) return { ok: false, message: `not an ElicitResult: ${issueText(parsed.error)}` };
    const { _meta: _ignored, ...answer } = parsed.data;
    const schema = request.params['requestedSchema'];
    if (answer.action === 'accept' && typeof schema === 'object' && schema !== null) {
      // A schema Ajv cannot compile: only the answer's shape is checked.
      const validate = jsonSchemas.compile(schema as Record<string, unknown>);
      if (validate && !validate(answer.content ?? {})) {
        return { ok: false, message: `content does not match requestedSchema: ${ajvText(validate)}` };
      }
    }
    return { ok: true, answer };
  }
  if (request.method === 'roots/list') {
    const parsed = ListRootsResultSchema.safeParse(raw);
    if (!parsed.success) return { ok: false, message: `not a ListRootsResult: ${issueText(parsed.error)}` };
    const { _meta: _ignored, ...answer } = parsed.data;
    return { ok: true, answer };
  }
  const withTools = request.params['tools'] !== undefined || request.params['toolChoice'] !== undefined;
  const parsed = (withTools ? CreateMessageResultWithToolsSchema : CreateMessageResultSchema).safeParse(raw);
  if (!parsed.success) return { ok: false, message: `not a CreateMessageResult: ${issueText(parsed.error)}` };
  const { _meta: _ignored, ...answer } = parsed.data;
  return { ok: true, answer };
}

function ajvText(validate: ValidateFunction): string {
  const error = validate.errors?.[0];
  if (!error) return 'is invalid';
  if (error.keyword === 'required') {
    return `${String((error.params as { missingProperty?: unknown }).missingProperty)} is required`;
  }
  const field = error.instancePath ? error.instancePath.split('/').filter(Boolean).join('.') : 'content';
  return `${field} ${error.message ?? 'is invalid'}`;
}

function issueText(error: z.ZodError): string {
  const issue = error.issues[0];
  return `${issue?.path.map(String).join('.') || 'result'} ${issue?.message ?? 'is invalid'}`;
}

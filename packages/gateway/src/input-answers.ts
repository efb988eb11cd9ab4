/**
 * Checks an answer to a task's input request before it is stored (PROTOCOL.md §12.5): the shape of the MCP result,
 * and for an accepted elicitation its `content` against the request's `requestedSchema` (JSON Schema 2020-12). Both
 * answer routes use it: the 2025-11-25 response to `elicitation/create` / `sampling/createMessage`, and the
 * extension's `tasks/update {inputResponses}`.
 */
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import { CreateMessageResultSchema, ElicitResultSchema } from '@modelcontextprotocol/sdk/types.js';
import type { InputRequest } from '@taskrelay/shared';

export type AnswerCheck = { ok: true; answer: Record<string, unknown> } | { ok: false; message: string };

const ajv = new Ajv2020({ allErrors: false, strict: false, logger: false });
/** Compiled requested schemas, by their JSON; bounded, since each task may bring its own. */
const compiled = new Map<string, ValidateFunction | undefined>();
const MAX_COMPILED = 500;

export function checkAnswer(request: InputRequest, answer: unknown): AnswerCheck {
  if (request.method === 'sampling/createMessage') {
    const parsed = CreateMessageResultSchema.safeParse(answer);
    if (!parsed.success) return { ok: false, message: `Not a CreateMessageResult: ${firstIssue(parsed.error)}` };
    return { ok: true, answer: parsed.data };
  }
  const parsed = ElicitResultSchema.safeParse(answer);
  if (!parsed.success) return { ok: false, message: `Not an ElicitResult: ${firstIssue(parsed.error)}` };
  const result = parsed.data as { action: string; content?: Record<string, unknown> };
  if (result.action !== 'accept') return { ok: true, answer: { action: result.action } };
  const schema = request.params['requestedSchema'];
  if (typeof schema === 'object' && schema !== null) {
    const validate = validatorFor(schema as Record<string, unknown>);
    if (validate && !validate(result.content ?? {})) {
      const error = validate.errors?.[0];
      const field = error?.instancePath ? error.instancePath.split('/').filter(Boolean).join('.') : 'content';
      const detail =
        error?.keyword === 'required'
          ? `${String((error.params as { missingProperty?: unknown }).missingProperty)} is required`
          : `${field} ${error?.message ?? 'is invalid'}`;
      return { ok: false, message: `The accepted content does not match the requested schema: ${detail}` };
    }
  }
  return { ok: true, answer: parsed.data };
}

function validatorFor(schema: Record<string, unknown>): ValidateFunction | undefined {
  const key = JSON.stringify(schema);
  if (compiled.has(key)) return compiled.get(key);
  let validate: ValidateFunction | undefined;
  try {
    validate = ajv.compile(schema);
  } catch {
    validate = undefined; // a schema Ajv cannot compile: only the result's shape is checked
  }
  if (compiled.size >= MAX_COMPILED) compiled.clear();
  compiled.set(key, validate);
  return validate;
}

function firstIssue(error: { issues: Array<{ path: PropertyKey[]; message: string }> }): string {
  const issue = error.issues[0];
  return `${issue?.path.map(String).join('.') || 'result'} ${issue?.message ?? 'is invalid'}`;
}

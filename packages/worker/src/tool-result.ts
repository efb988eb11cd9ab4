/**
 * What a tool returns, made a stored `CallToolResult`, and the JSON Schemas its catalog publishes (PROTOCOL.md §3, §13).
 */
import { z } from 'zod';
import { NonRetryableError, type ToolResult } from '@taskrelay/shared';
import type { ToolDefinition } from './tool-definition.js';

/**
 * The JSON Schema a catalog publishes for a zod schema: `z.toJSONSchema(schema, { io })`, `$schema` kept. MCP
 * wants tool input and output schemas to describe objects, so anything else is rejected.
 *
 * @param io `'input'` (default) describes what callers send, `'output'` what a parse produces.
 * @throws TypeError when the schema cannot be represented or does not describe an object.
 */
export function toolJsonSchema(
  schema: z.ZodType,
  io: 'input' | 'output' = 'input',
  label = 'schema',
): Record<string, unknown> {
  let json: Record<string, unknown>;
  try {
    json = z.toJSONSchema(schema, { io });
  } catch (error) {
    throw new TypeError(
      `${label} cannot be published as JSON Schema: ${error instanceof Error ? error.message : String(error)}`,
      { cause: error },
    );
  }
  // `$schema` stays: it names the dialect (2020-12) the gateway validates with, and MCP clients read it (SEP-1613).
  if (json['type'] !== 'object') throw new TypeError(`${label} must describe an object (JSON Schema type "object")`);
  return json;
}

/**
 * The shape of a `CallToolResult` a tool returns itself: content items each name their `type` (MCP's content block
 * kinds, which carry their own fields), `structuredContent` is an object, `isError` a boolean. Loose: `_meta` and
 * newer fields pass.
 */
const ToolResultShape = z.looseObject({
  content: z.array(z.looseObject({ type: z.enum(['text', 'image', 'audio', 'resource_link', 'resource']) })),
  structuredContent: z.record(z.string(), z.unknown()).optional(),
  isError: z.boolean().optional(),
});

/**
 * Turns what `run` returned into the stored `CallToolResult` (see `ToolOptions.run`).
 *
 * @throws NonRetryableError when the value does not match the tool's `outputSchema`.
 */
export function toToolResult(tool: Pick<ToolDefinition, 'name' | 'outputSchema'>, value: unknown): ToolResult {
  if (typeof value === 'string') return { content: [{ type: 'text', text: value }] };
  if (isPlainObject(value) && Array.isArray(value['content'])) {
    // A tool's own CallToolResult is checked here, for every era and rendering alike (the gateway sends it as is).
    const checked = ToolResultShape.safeParse(value);
    if (!checked.success) {
      throw new NonRetryableError(`Tool ${tool.name} returned an invalid result: ${describeIssues(checked.error)}`);
    }
    return value as ToolResult;
  }
  let output = value;
  if (tool.outputSchema !== undefined) {
    const parsed = tool.outputSchema.safeParse(value);
    if (!parsed.success) {
      throw new NonRetryableError(
        `Tool ${tool.name} returned a value that does not match its outputSchema: ${describeIssues(parsed.error)}`,
      );
    }
    output = parsed.data;
  }
  if (output === undefined) return { content: [] };
  const result: ToolResult = { content: [{ type: 'text', text: JSON.stringify(output) ?? '' }] };
  if (isPlainObject(output)) result.structuredContent = output;
  return result;
}

/** One line naming every offending field: `items: Too big: expected number to be <=1000000; report: ...`. */
export function describeIssues(error: z.ZodError): string {
  return error.issues
    .map((issue) => (issue.path.length > 0 ? `${issue.path.map(String).join('.')}: ${issue.message}` : issue.message))
    .join('; ');
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/**
 * The `TASKRELAY_JOB_APIS` file (docs/JOB-API.md): JSON, or YAML when it ends in `.yaml`/`.yml`, turned into tools
 * through `defineJobApiTool`. Everything is checked at start; the first problem is one `ConfigError` line naming the
 * tool and the field (or the missing environment variable).
 */
import { readFile } from 'node:fs/promises';
import { extname } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ConfigError, TaskSupportSchema, oneLine } from '@taskrelay/shared';
import type { ToolDefinition, ToolInputSchema } from '../define-tool.js';
import { defineJobApiTool, type JobApiToolOptions } from './define-job-api-tool.js';
import { JobApiSpecSchema, firstIssue } from './spec.js';

const ENV_REF = /\$\{env:([^}]*)\}/g;

const ToolEntrySchema = z.looseObject({
  name: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/, { message: 'must be 1 to 128 of A-Z a-z 0-9 _ - .' }),
  title: z.string().min(1).optional(),
  description: z.string().min(1, { message: 'must not be empty' }),
  inputSchema: z
    .record(z.string(), z.unknown())
    .refine((s) => s['type'] === 'object', { message: 'must be a JSON Schema of type "object"' })
    .default({ type: 'object' }),
  taskSupport: TaskSupportSchema.optional(),
  timeoutMs: z.number().int().positive().optional(),
  attempts: z.number().int().min(1).max(1000).optional(),
  maxStalls: z.number().int().min(0).max(1000).optional(),
  // Checked by defineTool (PROTOCOL.md §3.3): a shape it does not support is refused there, naming the field.
  concurrency: z.unknown().optional(),
  rateLimit: z.unknown().optional(),
});

/** Every field a tool entry may have: its own and the job API's (checked by `defineJobApiTool`). */
const KNOWN_FIELDS = new Set([...Object.keys(ToolEntrySchema.shape), ...Object.keys(JobApiSpecSchema.shape)]);

const FileSchema = z.strictObject({ tools: z.array(z.unknown()).min(1, { message: 'must list at least one tool' }) });

/** Reads, checks and builds the tools of a job-API file. */
export async function loadJobApiTools(path: string, env: NodeJS.ProcessEnv = process.env): Promise<ToolDefinition[]> {
  const where = `TASKRELAY_JOB_APIS (${path})`;
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new ConfigError(`Invalid configuration: ${where} cannot be read: ${oneLine(error)}`);
  }
  return parseJobApiFile(text, { where, yaml: /^\.ya?ml$/i.test(extname(path)), env });
}

/** `loadJobApiTools` without the file system: the text of a file. */
export function parseJobApiFile(
  text: string,
  options: { where?: string; yaml?: boolean; env?: NodeJS.ProcessEnv } = {},
): ToolDefinition[] {
  const where = options.where ?? 'TASKRELAY_JOB_APIS';
  const fail = (message: string): never => {
    throw new ConfigError(`Invalid configuration: ${where}: ${message}`);
  };
  let raw: unknown;
  try {
    raw = options.yaml ? parseYaml(text) : JSON.parse(text);
  } catch (error) {
    fail(`not valid ${options.yaml ? 'YAML' : 'JSON'}: ${oneLine(error)}`);
  }
  const file = FileSchema.safeParse(raw);
  if (!file.success) fail(firstIssue(file.error));
  const entries = (file.data as z.output<typeof FileSchema>).tools;

  const names = new Set<string>();
  return entries.map((entry, index) => {
    const rawName = (entry as { name?: unknown } | null)?.name;
    const tool = typeof rawName === 'string' ? `tool ${rawName}` : `tools.${index}`;
    const resolved = substituteEnv(entry, options.env ?? process.env, (name, field) =>
      fail(`${tool}: ${field} needs environment variable ${name}, which is not set`),
    );
    const parsed = ToolEntrySchema.safeParse(resolved);
    if (!parsed.success) fail(`${tool}: ${firstIssue(parsed.error)}`);
    const spec = (parsed as { data: z.output<typeof ToolEntrySchema> }).data;
    const unknown = Object.keys(spec).find((key) => !KNOWN_FIELDS.has(key));
    if (unknown !== undefined) fail(`${tool}: ${unknown}: unknown field`);
    if (names.has(spec.name)) fail(`${tool}: name is used by another tool in the file`);
    names.add(spec.name);

    let inputSchema: ToolInputSchema;
    try {
      inputSchema = z.fromJSONSchema(spec.inputSchema) as ToolInputSchema;
    } catch (error) {
      return fail(`${tool}: inputSchema: ${oneLine(error)}`);
    }
    try {
      return defineJobApiTool({
        ...(resolved as JobApiToolOptions<ToolInputSchema>),
        name: spec.name,
        description: spec.description,
        inputSchema,
      });
    } catch (error) {
      return fail(
        `${tool}: ${oneLine(error)
          .replace(/^defineJobApiTool\([^)]*\): /, '')
          .replace(/^defineTool\([^)]*\): /, '')}`,
      );
    }
  });
}

/**
 * Replaces `${env:NAME}` in every string of a parsed file. A missing (or empty-named) variable stops here, with the
 * field it was in.
 */
function substituteEnv(
  value: unknown,
  env: NodeJS.ProcessEnv,
  missing: (name: string, field: string) => never,
  path: string[] = [],
): unknown {
  if (typeof value === 'string') {
    return value.replace(ENV_REF, (_match, name: string) => {
      const found = env[name];
      if (name === '' || found === undefined) return missing(name, path.join('.') || 'a value');
      return found;
    });
  }
  if (Array.isArray(value)) return value.map((item, i) => substituteEnv(item, env, missing, [...path, String(i)]));
  if (typeof value === 'object' && value !== null) {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = substituteEnv(item, env, missing, [...path, key]);
    return out;
  }
  return value;
}

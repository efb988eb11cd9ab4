/**
 * `defineTool` (PROTOCOL.md §3): checks a tool's options once, at definition, and resolves them into the definition the
 * worker runs and the descriptor its catalog publishes. The option and definition types are in tool-definition.ts, what
 * a tool's return becomes in tool-result.ts; both are re-exported here by name, so a tool's author imports one module.
 */
import { createHash } from 'node:crypto';
import { isAbsolute } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { MAX_TOOL_SHARDS, BackoffSchema, TaskSupportSchema, type ToolDescriptor } from '@taskrelay/shared';
import type { ToolContext } from './context-types.js';
import {
  DEFAULT_KILL_GRACE_MS,
  TOOL_DEFINITION,
  type AdmittedLimits,
  type CancelledTaskInfo,
  type LimitKey,
  type ToolDefinition,
  type ToolInputSchema,
  type ToolIsolation,
  type ToolOptions,
} from './tool-definition.js';
import { toolJsonSchema } from './tool-result.js';

export {
  DEFAULT_KILL_GRACE_MS,
  TOOL_DEFINITION,
  type AdmittedLimits,
  type CancelledTaskInfo,
  type LimitKey,
  type ToolDefinition,
  type ToolInputSchema,
  type ToolIsolation,
  type ToolOptions,
  type ToolReturn,
} from './tool-definition.js';
export { describeIssues, toToolResult, toolJsonSchema } from './tool-result.js';

const LimitKeySchema = z.union([
  z.array(z.string().min(1)).min(1, { message: 'must name at least one argument' }),
  z.custom<(args: Record<string, unknown>) => string>((v) => typeof v === 'function', {
    message: 'must be a list of argument names or a function',
  }),
]);

/** A key's function: argument names give the JSON of their values (absent ones `null`). */
function keyFunction(key: LimitKey | undefined): (args: Record<string, unknown>) => string {
  if (key === undefined) return () => '';
  if (typeof key === 'function') return (args) => String(key(args));
  return (args) => JSON.stringify(key.map((name) => args[name] ?? null));
}

/** How a key shows in messages and the catalog: its argument names, or `(function)`. */
function keyNames(key: LimitKey | undefined): string[] | undefined {
  if (key === undefined) return undefined;
  return typeof key === 'function' ? ['(function)'] : key;
}

const ToolOptionsSchema = z.object({
  name: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/, { message: 'must be 1 to 128 of A-Z a-z 0-9 _ - .' }),
  title: z.string().min(1).optional(),
  description: z.string().min(1, { message: 'must not be empty' }),
  taskSupport: TaskSupportSchema.default('optional'),
  inputFirst: z.boolean().default(false),
  shards: z
    .number()
    .int()
    .min(1, { message: 'must be at least 1' })
    .max(MAX_TOOL_SHARDS, { message: `must be at most ${MAX_TOOL_SHARDS}` })
    .default(1),
  /** RFC 9110 token names (SEP-2243), by argument name. */
  mcpHeaders: z
    .record(z.string(), z.string().regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, { message: 'must be an HTTP token' }))
    .optional(),
  timeoutMs: z.number().int().positive().optional(),
  attempts: z.number().int().min(1).max(1000).default(1),
  backoff: BackoffSchema.default({ type: 'exponential', delayMs: 1000, jitter: 0.5 }),
  maxStalls: z.number().int().min(0).max(1000).default(10),
  // Strict: a per-key limit (`key`) is not supported yet, and a field it does not know must not be ignored.
  priority: z.number().int().min(1).max(5).optional(),
  dedupe: z
    .union([
      z.literal(true),
      z.strictObject({
        key: z.array(z.string().min(1)).min(1, { message: 'must name at least one argument' }).optional(),
        ttlMs: z
          .number()
          .int()
          .min(1)
          .max(30 * 86_400_000)
          .optional(),
      }),
    ])
    .optional(),
  concurrency: z
    .union([
      z.number().int().min(1).max(100_000),
      z.strictObject({
        limit: z.number().int().min(1).max(100_000),
        key: LimitKeySchema.optional(),
        acrossPrincipals: z.boolean().optional(),
      }),
    ])
    .optional(),
  rateLimit: z
    .strictObject({
      max: z.number().int().min(1).max(1_000_000),
      perMs: z.number().int().min(1).max(86_400_000),
      key: LimitKeySchema.optional(),
      name: z
        .string()
        .regex(/^[A-Za-z0-9_.-]{1,128}$/, { message: 'must be 1 to 128 of A-Z a-z 0-9 _ - .' })
        .optional(),
      acrossPrincipals: z.boolean().optional(),
    })
    .optional(),
  inputTimeoutMs: z.number().int().positive().default(86_400_000),
  version: z
    .string()
    .regex(/^[A-Za-z0-9_.-]{1,64}$/, { message: 'must be 1 to 64 of A-Z a-z 0-9 _ - .' })
    .optional(),
  onVersionChange: z.enum(['resume', 'restart', 'fail']).default('resume'),
  isolate: z.enum(['process', 'thread']).optional(),
  module: z.string().min(1).optional(),
  maxMemoryMb: z.number().int().min(64).max(1_048_576).optional(),
  killGraceMs: z.number().int().min(0).max(600_000).optional(),
});

/** Every option `defineTool` takes: the checked ones, the schemas and the functions. */
const TOOL_OPTION_KEYS: ReadonlySet<string> = new Set([
  ...Object.keys(ToolOptionsSchema.shape),
  'inputSchema',
  'outputSchema',
  'run',
  'onCancelled',
]);

/**
 * Defines a tool a worker can serve. Export the result from a tools module (`TASKRELAY_TOOLS`) or pass it to
 * `startWorker({ tools })`.
 *
 * @throws TypeError when an option is unknown or invalid, or a schema cannot be published as a JSON Schema object.
 */
export function defineTool<I extends ToolInputSchema, O extends z.ZodType | undefined = undefined>(
  options: ToolOptions<I, O>,
): ToolDefinition<I, O> {
  const checked = checkOptions(options);
  const { rateLimit } = checked;
  const dedupeOption = checked.dedupe;
  const dedupe =
    dedupeOption === undefined
      ? undefined
      : {
          ...(dedupeOption === true || dedupeOption.key === undefined ? {} : { key: dedupeOption.key }),
          ttlMs: (dedupeOption === true ? undefined : dedupeOption.ttlMs) ?? 3_600_000,
        };
  const concurrency = typeof checked.concurrency === 'object' ? checked.concurrency.limit : checked.concurrency;
  const concurrencyKey = typeof checked.concurrency === 'object' ? checked.concurrency.key : undefined;
  const across = typeof checked.concurrency === 'object' && checked.concurrency.acrossPrincipals === true;
  const admitted = admittedLimits(checked.name, concurrency, concurrencyKey, across, rateLimit);
  const { descriptor, version } = toolDescriptor(
    checked,
    // The function's text, not the function: `run` is a method of the options object.
    { inputSchema: options.inputSchema, outputSchema: options.outputSchema, runText: options.run.toString() },
    { concurrency, concurrencyKey, dedupe },
  );

  return Object.freeze({
    [TOOL_DEFINITION]: true as const,
    name: checked.name,
    title: checked.title,
    description: checked.description,
    inputSchema: options.inputSchema,
    outputSchema: options.outputSchema,
    taskSupport: checked.taskSupport,
    inputFirst: checked.inputFirst,
    shards: checked.shards,
    timeoutMs: checked.timeoutMs,
    attempts: checked.attempts,
    backoff: checked.backoff,
    maxStalls: checked.maxStalls,
    // A keyed limit is the worker's (§3.5): BullMQ's queue-wide one is set only for the unkeyed, unshared forms.
    concurrency: admitted.slot ? undefined : concurrency,
    priority: checked.priority,
    dedupe,
    // A plain rate limit is counted exactly by the worker and paced by BullMQ's limiter (§3.3); keyed or shared, the
    // worker's alone.
    rateLimit: admitted.rate?.paced === true ? { max: admitted.rate.max, perMs: admitted.rate.perMs } : undefined,
    admitted,
    inputTimeoutMs: checked.inputTimeoutMs,
    version,
    onVersionChange: checked.onVersionChange,
    isolation: isolationOf(checked),
    onCancelled:
      typeof options.onCancelled === 'function'
        ? async (task: CancelledTaskInfo) => {
            await options.onCancelled?.(task);
          }
        : undefined,
    descriptor,
    run: (input: z.output<I>, ctx: ToolContext) => options.run(input, ctx),
  });
}

/** `defineTool`'s options once checked: the schema's defaults applied. */
type CheckedOptions = z.output<typeof ToolOptionsSchema>;

/**
 * Checks `defineTool`'s options: no unknown one, each valid, the schemas zod 4 objects, `run` a function.
 *
 * @throws TypeError naming the first option at fault.
 */
function checkOptions(options: ToolOptions<ToolInputSchema, z.ZodType | undefined>): CheckedOptions {
  // An option this version does not know is a mistake to say at once: ignored, a typo (`concurency: 3`) would
  // silently remove the limit it meant to set.
  const unknown = Object.keys(options ?? {}).filter((key) => !TOOL_OPTION_KEYS.has(key));
  if (unknown.length > 0) {
    const label = typeof options?.name === 'string' ? `defineTool(${options.name})` : 'defineTool';
    const known = [...TOOL_OPTION_KEYS].sort().join(', ');
    throw new TypeError(
      `${label}: unknown option${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => `'${k}'`).join(', ')} ` +
        `(known: ${known})`,
    );
  }
  const dedupeKey = (options as { dedupe?: { key?: unknown } } | undefined)?.dedupe?.key;
  if (typeof dedupeKey === 'function') {
    throw new TypeError(
      `defineTool(${String(options.name)}): dedupe.key must list argument names, not be a function: the gateway ` +
        'decides before any worker sees the call, and a function cannot travel there',
    );
  }
  const parsed = ToolOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const label = typeof options?.name === 'string' ? `defineTool(${options.name})` : 'defineTool';
    throw new TypeError(`${label}: ${issue?.path.join('.') || 'options'} ${issue?.message ?? 'is invalid'}`);
  }
  const { name } = parsed.data;
  if (parsed.data.inputFirst && parsed.data.taskSupport === 'forbidden') {
    throw new TypeError(`defineTool(${name}): inputFirst needs taskSupport 'optional' or 'required'`);
  }
  // Duck-typed rather than instanceof, so a tools module bundling its own copy of zod 4 still works.
  for (const [field, schema] of [
    ['inputSchema', options.inputSchema],
    ['outputSchema', options.outputSchema],
  ] as const) {
    if (isZod3Schema(schema)) {
      throw new TypeError(
        `defineTool(${name}): ${field} is a zod 3 schema; @taskrelay/worker needs zod 4 (install zod@^4, or import { z } from 'zod/v4' on zod 3.25)`,
      );
    }
  }
  if (zodKind(options.inputSchema) !== 'object') {
    throw new TypeError(`defineTool(${name}): inputSchema must be a zod object schema (z.object({...}))`);
  }
  if (options.outputSchema !== undefined && zodKind(options.outputSchema) === undefined) {
    throw new TypeError(`defineTool(${name}): outputSchema must be a zod schema`);
  }
  if (typeof options.run !== 'function') throw new TypeError(`defineTool(${name}): run must be a function`);
  return parsed.data;
}

/**
 * An isolated tool's options (PROTOCOL.md §31): `module` as a `file:` URL, the kill grace's default applied.
 *
 * @throws TypeError when `isolate` has no `module`, or `module`, `maxMemoryMb` or `killGraceMs` come without `isolate`.
 */
function isolationOf(checked: CheckedOptions): ToolIsolation | undefined {
  const { name, isolate, module, maxMemoryMb, killGraceMs } = checked;
  if (isolate === undefined) {
    const stray = (['module', 'maxMemoryMb', 'killGraceMs'] as const).filter((key) => checked[key] !== undefined);
    if (stray.length > 0) throw new TypeError(`defineTool(${name}): ${stray.join(', ')} need(s) isolate`);
    return undefined;
  }
  if (module === undefined) {
    throw new TypeError(
      `defineTool(${name}): isolate needs module, the file that defines the tool (module: import.meta.url)`,
    );
  }
  let moduleUrl: string;
  if (module.startsWith('file:')) {
    moduleUrl = URL.canParse(module) ? module : '';
  } else {
    moduleUrl = isAbsolute(module) ? pathToFileURL(module).href : '';
  }
  if (moduleUrl === '') {
    throw new TypeError(`defineTool(${name}): module must be a file: URL (import.meta.url) or an absolute path`);
  }
  return { mode: isolate, moduleUrl, maxMemoryMb, killGraceMs: killGraceMs ?? DEFAULT_KILL_GRACE_MS };
}

/**
 * The limits the worker admits runs by itself (§3.5): a keyed concurrency, and any rate limit (a plain one is counted
 * exactly here and paced by BullMQ's limiter, §3.3).
 */
function admittedLimits(
  name: string,
  concurrency: number | undefined,
  concurrencyKey: LimitKey | undefined,
  concurrencyAcross: boolean,
  rateLimit: CheckedOptions['rateLimit'],
): AdmittedLimits {
  const admitted: AdmittedLimits = {};
  if (concurrency !== undefined && concurrencyKey !== undefined) {
    admitted.slot = {
      limit: concurrency,
      keyOf: keyFunction(concurrencyKey),
      keyName: keyNames(concurrencyKey)?.join(', ') ?? '',
      acrossPrincipals: concurrencyAcross,
    };
  }
  if (rateLimit !== undefined) {
    admitted.rate = {
      max: rateLimit.max,
      perMs: rateLimit.perMs,
      scope: rateLimit.name === undefined ? `tool:${name}` : `name:${rateLimit.name}`,
      keyOf: keyFunction(rateLimit.key),
      keyName: keyNames(rateLimit.key)?.join(', ') ?? '',
      acrossPrincipals: rateLimit.key === undefined || rateLimit.acrossPrincipals === true,
      paced: rateLimit.key === undefined && rateLimit.name === undefined,
    };
  }
  return admitted;
}

/**
 * What the catalog publishes for the tool (PROTOCOL.md §3): its JSON Schemas, its controls, and its version (explicit
 * or derived, §12.11).
 *
 * @throws TypeError when a schema cannot be published, a header mapping is invalid, or a key names an argument the
 *   input schema does not have.
 */
function toolDescriptor(
  checked: CheckedOptions,
  code: { inputSchema: z.ZodType; outputSchema: z.ZodType | undefined; runText: string },
  limits: {
    concurrency: number | undefined;
    concurrencyKey: LimitKey | undefined;
    dedupe: ToolDefinition['dedupe'];
  },
): { descriptor: ToolDescriptor; version: string } {
  const { name, taskSupport, attempts, backoff, maxStalls, rateLimit } = checked;
  const { concurrency, concurrencyKey, dedupe } = limits;
  const descriptor: ToolDescriptor = {
    name,
    description: checked.description,
    inputSchema: toolJsonSchema(code.inputSchema, 'input', `defineTool(${name}): inputSchema`),
    taskSupport,
    attempts,
    backoff,
    maxStalls,
  };
  if (checked.title !== undefined) descriptor.title = checked.title;
  if (checked.inputFirst) descriptor.inputFirst = true;
  if (checked.shards > 1) descriptor.shards = checked.shards;
  if (checked.mcpHeaders !== undefined) annotateHeaders(name, descriptor.inputSchema, checked.mcpHeaders);
  if (code.outputSchema !== undefined) {
    descriptor.outputSchema = toolJsonSchema(code.outputSchema, 'output', `defineTool(${name}): outputSchema`);
  }
  if (checked.timeoutMs !== undefined) descriptor.timeoutMs = checked.timeoutMs;
  if (concurrency !== undefined) descriptor.concurrency = concurrency;
  if (concurrencyKey !== undefined) descriptor.concurrencyKey = keyNames(concurrencyKey);
  if (rateLimit !== undefined) {
    const key = keyNames(rateLimit.key);
    descriptor.rateLimit = {
      max: rateLimit.max,
      perMs: rateLimit.perMs,
      ...(key === undefined ? {} : { key }),
      ...(rateLimit.name === undefined ? {} : { name: rateLimit.name }),
    };
  }
  const properties = Object.keys(descriptor.inputSchema['properties'] ?? {});
  for (const [what, key] of [
    ['concurrency.key', concurrencyKey],
    ['rateLimit.key', rateLimit?.key],
    ['dedupe.key', dedupe?.key],
  ] as const) {
    const unknown = Array.isArray(key) ? key.filter((k) => !properties.includes(k)) : [];
    if (unknown.length > 0) {
      throw new TypeError(`defineTool(${name}): ${what} names ${unknown.join(', ')}, which inputSchema does not`);
    }
  }
  if (checked.priority !== undefined) descriptor.priority = checked.priority;
  if (dedupe !== undefined) descriptor.dedupe = dedupe;
  const version = checked.version ?? derivedVersion(name, descriptor, code.runText);
  descriptor.version = version;
  if (checked.onVersionChange !== 'resume') descriptor.onVersionChange = checked.onVersionChange;
  return { descriptor, version };
}

/**
 * A tool's version when it names none (PROTOCOL.md §12.11): the first 12 hex digits of SHA-256 over its name, its
 * published input and output schemas and the text of its `run` function. The same build gives the same version on
 * every worker; a change to the schemas or to `run` itself gives another.
 */
function derivedVersion(name: string, descriptor: ToolDescriptor, runText: string): string {
  return createHash('sha256')
    .update(JSON.stringify([name, descriptor.inputSchema, descriptor.outputSchema ?? null, runText]))
    .digest('hex')
    .slice(0, 12);
}

/** True for a value `defineTool` returned (from any copy of this package). */
export function isToolDefinition(value: unknown): value is ToolDefinition {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[TOOL_DEFINITION] === true;
}

/** The zod 4 schema kind (`'object'`, `'string'`, ...), or undefined for anything that is not a zod 4 schema. */
function zodKind(value: unknown): string | undefined {
  const internals = (value as { _zod?: { def?: { type?: unknown } } } | null | undefined)?._zod;
  const kind = internals?.def?.type;
  return typeof kind === 'string' && typeof (value as { safeParse?: unknown }).safeParse === 'function'
    ? kind
    : undefined;
}

/** A zod 3 schema (`_def.typeName`, no zod 4 `_zod` internals): told apart so the error can name the version. */
function isZod3Schema(value: unknown): boolean {
  if (typeof value !== 'object' || value === null || '_zod' in value) return false;
  const def = (value as { _def?: { typeName?: unknown } })._def;
  return typeof def?.typeName === 'string';
}

/**
 * Marks each mapped argument's property with `x-mcp-header` (SEP-2243), after the rules a client checks before it
 * trusts a tool: a top-level property of type string, integer or boolean, and header names unique regardless of case.
 */
function annotateHeaders(tool: string, inputSchema: Record<string, unknown>, headers: Record<string, string>): void {
  const properties = (inputSchema['properties'] ?? {}) as Record<string, Record<string, unknown>>;
  const seen = new Set<string>();
  for (const [argument, header] of Object.entries(headers)) {
    const property = properties[argument];
    if (!property) throw new TypeError(`defineTool(${tool}): mcpHeaders.${argument} names no inputSchema property`);
    if (!['string', 'integer', 'boolean'].includes(String(property['type']))) {
      throw new TypeError(
        `defineTool(${tool}): mcpHeaders.${argument} must be a string, integer or boolean property (SEP-2243)`,
      );
    }
    if (seen.has(header.toLowerCase())) {
      throw new TypeError(`defineTool(${tool}): mcpHeaders: header ${header} is named twice (case-insensitively)`);
    }
    seen.add(header.toLowerCase());
    property['x-mcp-header'] = header;
  }
}

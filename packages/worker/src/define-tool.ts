import { createHash } from 'node:crypto';
import { isAbsolute } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import {
  MAX_TOOL_SHARDS,
  BackoffSchema,
  NonRetryableError,
  TaskSupportSchema,
  type Backoff,
  type Logger,
  type TaskSupport,
  type ToolDescriptor,
  type ToolResult,
} from '@taskrelay/shared';
import type { ToolContext } from './context-types.js';

/**
 * Brands a tool definition. `Symbol.for` so the brand survives two copies of this package in one process (a tools
 * module resolving its own `@taskrelay/worker`).
 */
export const TOOL_DEFINITION: unique symbol = Symbol.for('taskrelay.toolDefinition');

/** Any zod object schema (`z.object`, `z.strictObject`, `z.looseObject`): tool arguments are always a JSON object. */
export type ToolInputSchema = z.ZodObject<z.core.$ZodShape, z.core.$ZodObjectConfig>;

/** What `run` may return: a string, a full `CallToolResult`, or a value for `structuredContent`. */
export type ToolReturn<O extends z.ZodType | undefined> =
  string | ToolResult | (O extends z.ZodType ? z.input<O> : unknown);

export interface ToolOptions<I extends ToolInputSchema, O extends z.ZodType | undefined = undefined> {
  /** Unique tool name within a worker: 1 to 128 of `A-Z a-z 0-9 _ - .` (MCP's rule). Required. */
  name: string;
  /** Human-readable name for UIs. Default: none. */
  title?: string;
  /** What the tool does, for the model. Required. */
  description: string;
  /**
   * A zod object schema for the arguments. The worker validates arguments with it (defaults and transforms apply);
   * the catalog publishes its JSON Schema (`io: 'input'`). Required.
   */
  inputSchema: I;
  /**
   * A zod object schema for `structuredContent`. When set, a plain value returned by `run` is validated against it
   * (a mismatch fails the task without retry) and the catalog publishes its JSON Schema. Default: none.
   */
  outputSchema?: O;
  /**
   * Whether callers may (`optional`), must (`required`) or must not (`forbidden`) run the tool as an MCP task.
   * Default `'optional'`.
   */
  taskSupport?: TaskSupport;
  /**
   * Ask before becoming a task (PROTOCOL.md §17.4): a 2026-07-28 client that declares the tasks extension gets this
   * tool's questions (`ctx.elicit`, `ctx.sample`, `ctx.listRoots`) as input rounds of a plain call, and the call
   * becomes a task once its answers resume the run. Needs `taskSupport` `optional` or `required`. Default `false`.
   */
  inputFirst?: boolean;
  /**
   * How many queues the tool's calls spread over (PROTOCOL.md §1.1): in the sharded key layout each is a shard of its
   * own, placed on its own Redis Cluster master when there are enough, so one hot tool is not bound to one Redis core.
   * A call goes to one of them; every worker of the tool consumes all of them. What holds exactly across shards and
   * what within a bound: docs/SCALING.md. The single layout has one queue whatever this says. Default `1`.
   */
  shards?: number;
  /**
   * Arguments a 2026-07-28 client must mirror into HTTP headers (SEP-2243, PROTOCOL.md §16.2), so proxies can route
   * on them: `{ region: 'Region' }` publishes `"x-mcp-header": "Region"` on the `region` property and makes the
   * gateway require a matching `Mcp-Param-Region` header on a call that carries it. Each argument must be a
   * top-level string, integer or boolean property; header names are tokens, unique regardless of case. Default none.
   */
  mcpHeaders?: Record<string, string>;
  /**
   * Abort the run with reason `TIMEOUT` and fail the task this many ms after it starts. The gateway caps it at
   * `TASKRELAY_MAX_TOOL_TIMEOUT_MS`. Default: none (only the gateway's cap applies).
   */
  timeoutMs?: number;
  /**
   * How many times a job runs before its task fails, counting the first run. Only ordinary errors are retried;
   * `NonRetryableError`, invalid arguments, cancel and timeout never are. Default `1`.
   */
  attempts?: number;
  /**
   * How long to wait before each retry (`attempts` > 1): `exponential` waits `delayMs × 2^(retry − 1)`, `fixed`
   * waits `delayMs`; `jitter` (0..1) randomises that fraction of each delay. Default
   * `{ type: 'exponential', delayMs: 1000, jitter: 0.5 }`.
   */
  backoff?: Backoff;
  /**
   * How many times the job may be taken over after the worker running it stopped responding (a crash, a lost
   * lock) before its task fails. Separate from `attempts`: a dying machine is not the tool's fault, but a tool that
   * crashes every worker it runs on must stop somewhere. Default `10`.
   */
  maxStalls?: number;
  /**
   * At most this many runs of the tool at once across the whole fleet, batch children included: `3`, or
   * `{ limit: 3 }`, or per value of a key of the arguments, `{ limit: 3, key: ['tenant'] }` (argument names) or
   * `{ limit: 3, key: (args) => String(args.tenant) }` (PROTOCOL.md §3.5). A run waiting for a slot holds no worker
   * slot; its task's `statusMessage` says so (PROTOCOL.md §3.3). A crashed holder's slot comes back within the lock
   * duration. Default: none (only `WORKER_CONCURRENCY`). A keyed limit counts each principal's runs apart (alice's
   * runs on tenant `acme` never wait for bob's); `acrossPrincipals: true` makes one limit per key value for every
   * principal (an upstream's per-tenant quota), whose waiting runs then take free slots in turn by principal.
   * Default `false`.
   */
  concurrency?: number | { limit: number; key?: LimitKey; acrossPrincipals?: boolean };
  /**
   * Calls that repeat an unfinished one join it (PROTOCOL.md §25.2): a call whose values of the `key` arguments (all
   * of them by default) match an unfinished call of this tool by the same principal, in the same mode (task or plain),
   * gets that task's id, or that call's result; nothing new starts. For at most `ttlMs` after the first call (default
   * 1 h). `true`: every argument, 1 h. The key is a list of argument names, not a function: the gateway decides before
   * any worker sees the call, and a function cannot travel there.
   */
  dedupe?: true | { key?: string[]; ttlMs?: number };
  /**
   * The priority level of the tool's calls, 1 (first) to 5 (PROTOCOL.md §25.1): queued work of a lower number starts
   * before queued work of a higher one; fair share holds within a level. A call may ask for this level or a later one
   * (`_meta["dev.taskrelay/priority"]`); only an operator may ask for an earlier one. Default `3`.
   */
  priority?: number;
  /**
   * At most `max` starts of the tool in any window of `perMs` across the fleet, batch children included
   * (PROTOCOL.md §3.3). `key`: per value of a key of the arguments, as `concurrency.key`. `name`: one budget shared
   * by every tool whose `rateLimit.name` is the same (the upstream they all call), and a `RetryAfterError` of one
   * holds it for all (§3.5). A keyed rate limit counts each principal's starts apart unless `acrossPrincipals: true`
   * (as `concurrency`); a named one without a key is one budget for everyone. Default: none.
   */
  rateLimit?: { max: number; perMs: number; key?: LimitKey; name?: string; acrossPrincipals?: boolean };
  /**
   * The tool's version (PROTOCOL.md §12.11): 1 to 64 of A-Z a-z 0-9 _ - . Every run records it on its task, and a
   * resume prefers a worker of the version the task last ran. Default: derived from the name, the published schemas
   * and the text of `run` (a change in code `run` calls is not seen: set a version when that matters).
   */
  version?: string;
  /**
   * What a run does with a task another version of this tool ran before (a deploy between two runs), once no live
   * worker of that version is left to take it (PROTOCOL.md §12.11): `'resume'` goes on with the task's state, steps and
   * answers (changed questions are asked again, renamed steps reported); `'restart'` clears them and runs from the top;
   * `'fail'` fails the task with `VERSION_CHANGED`. Default `'resume'`.
   */
  onVersionChange?: 'resume' | 'restart' | 'fail';
  /**
   * How long a task of this tool may wait for the answer to an input request (`ctx.elicit`, `ctx.sample`) before it
   * fails with `TIMEOUT`. The wait holds no worker slot (PROTOCOL.md §12). Default `86400000` (24 h).
   */
  inputTimeoutMs?: number;
  /**
   * Called when a task of this tool was cancelled while no run of it was active (suspended between polls, waiting for
   * an answer): one last run finds the task cancelled and calls this instead of `run`, so the tool can stop what it
   * started outside (an external job whose id is in `steps`). Only for tasks that stored steps or state. At least
   * once: a worker crashing inside it runs it again elsewhere. A cancel that arrives while `run` is running aborts
   * its `ctx.signal` instead. Default: none.
   */
  onCancelled?(task: CancelledTaskInfo): void | Promise<void>;
  /**
   * Runs each run of the tool in a child of the worker, so a CPU-bound or memory-hungry handler cannot block the
   * worker's event loop (which renews its job locks) nor take its memory (PROTOCOL.md §31): `'process'` forks a Node
   * process per run, `'thread'` starts a worker thread per run. `ctx` works the same in the child (its members are
   * messages to the worker). Needs `module`. Default: none (the run is in the worker's own thread).
   */
  isolate?: 'process' | 'thread';
  /**
   * The file that defines this tool, for the child of an isolated run to import (`import.meta.url`, or an absolute
   * path): the child takes the export that is a tool definition of this name, as `TASKRELAY_TOOLS` does. Required with
   * `isolate`; the worker refuses to start when the module does not export the tool.
   */
  module?: string;
  /**
   * The memory bound of one isolated run, in MB (at least 64; a child loading `@taskrelay/worker` uses ~100 MB of
   * resident memory): `process` caps V8's heap (`--max-old-space-size`) and kills the child when its resident set
   * passes it (Linux); `thread` caps the thread's heap (`resourceLimits.maxOldGenerationSizeMb`). A run past it is
   * killed and its task fails with `MEMORY_LIMIT`, without retry. Needs `isolate`. Default: none.
   */
  maxMemoryMb?: number;
  /**
   * How long an isolated run whose signal aborted (cancel, timeout, drain, lost lock) or that suspended may take to
   * end before its child is killed, in ms. Needs `isolate`. Default `5000`.
   */
  killGraceMs?: number;
  /**
   * Runs the tool. Return a string (one text item), a full `CallToolResult` (an object with a `content` array, used
   * as is), or any other value (validated against `outputSchema` when set; a plain object becomes
   * `structuredContent`, and its JSON the text content). Throw to fail; honour `ctx.signal`.
   */
  run(input: z.output<I>, ctx: ToolContext): ToolReturn<O> | Promise<ToolReturn<O>>;
}

/** What `onCancelled` is told about the cancelled task. */
export interface CancelledTaskInfo {
  taskId: string;
  /** The task's arguments, as its job carries them (not yet validated). */
  arguments: Record<string, unknown>;
  /** The task's stored `ctx.step` results. */
  steps: Readonly<Record<string, unknown>>;
  /** The task's stored `ctx.state`. */
  state: unknown;
  log: Logger;
}

/** A tool as `defineTool` returns it: the options with defaults applied, branded, and its published descriptor. */
export interface ToolDefinition<
  I extends ToolInputSchema = ToolInputSchema,
  O extends z.ZodType | undefined = z.ZodType | undefined,
> {
  readonly [TOOL_DEFINITION]: true;
  readonly name: string;
  readonly title: string | undefined;
  readonly description: string;
  readonly inputSchema: I;
  readonly outputSchema: O | undefined;
  readonly taskSupport: TaskSupport;
  readonly inputFirst: boolean;
  /** How many queues (tool shards) its calls spread over (PROTOCOL.md §1.1). */
  readonly shards: number;
  readonly timeoutMs: number | undefined;
  readonly attempts: number;
  readonly backoff: Backoff;
  readonly maxStalls: number;
  /** Fleet-wide runs at once, when limited. */
  readonly concurrency: number | undefined;
  readonly priority: number | undefined;
  readonly dedupe: { key?: string[]; ttlMs: number } | undefined;
  readonly rateLimit: { max: number; perMs: number } | undefined;
  /** The limits the worker admits runs by (PROTOCOL.md §3.5): per key, or shared by name; BullMQ's are the rest. */
  readonly admitted: AdmittedLimits;
  readonly inputTimeoutMs: number;
  /** The tool's version, explicit or derived (PROTOCOL.md §12.11). */
  readonly version: string;
  readonly onVersionChange: 'resume' | 'restart' | 'fail';
  readonly onCancelled: ((task: CancelledTaskInfo) => Promise<void>) | undefined;
  /** How each run is isolated (PROTOCOL.md §31); undefined for a tool run in the worker's own thread. */
  readonly isolation: ToolIsolation | undefined;
  /** What the worker's catalog publishes for this tool (PROTOCOL.md §3). */
  readonly descriptor: ToolDescriptor;
  run(input: z.output<I>, ctx: ToolContext): ToolReturn<O> | Promise<ToolReturn<O>>;
}

/** An isolated tool's options, resolved (PROTOCOL.md §31). */
export interface ToolIsolation {
  mode: 'process' | 'thread';
  /** The module that defines the tool, as a `file:` URL. */
  moduleUrl: string;
  maxMemoryMb: number | undefined;
  killGraceMs: number;
}

/** How long an aborted or suspended isolated run may take to end before its child is killed, by default. */
export const DEFAULT_KILL_GRACE_MS = 5_000;

/** A limit's key (PROTOCOL.md §3.5): argument names, or a function of the parsed arguments returning a string. */
export type LimitKey = string[] | ((args: Record<string, unknown>) => string);

const LimitKeySchema = z.union([
  z.array(z.string().min(1)).min(1, { message: 'must name at least one argument' }),
  z.custom<(args: Record<string, unknown>) => string>((v) => typeof v === 'function', {
    message: 'must be a list of argument names or a function',
  }),
]);

/** The limits a worker admits runs by itself (§3.5); each key function answers the limit's key for the arguments. */
export interface AdmittedLimits {
  slot?: {
    limit: number;
    keyOf: (args: Record<string, unknown>) => string;
    keyName: string;
    /** One limit per key value for every principal (else per principal and key value). */
    acrossPrincipals: boolean;
  };
  rate?: {
    max: number;
    perMs: number;
    scope: string;
    keyOf: (args: Record<string, unknown>) => string;
    keyName: string;
    /** One budget per key value for every principal; always so for a named limit without a key. */
    acrossPrincipals: boolean;
  };
}

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
    rateLimit: admitted.rate || rateLimit === undefined ? undefined : { max: rateLimit.max, perMs: rateLimit.perMs },
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

/** The limits the worker admits runs by itself (§3.5): a keyed concurrency, and a keyed or shared rate limit. */
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
  if (rateLimit !== undefined && (rateLimit.key !== undefined || rateLimit.name !== undefined)) {
    admitted.rate = {
      max: rateLimit.max,
      perMs: rateLimit.perMs,
      scope: rateLimit.name === undefined ? `tool:${name}` : `name:${rateLimit.name}`,
      keyOf: keyFunction(rateLimit.key),
      keyName: keyNames(rateLimit.key)?.join(', ') ?? '',
      acrossPrincipals: rateLimit.key === undefined || rateLimit.acrossPrincipals === true,
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

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
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

/**
 * What `defineTool` takes and gives (PROTOCOL.md §3): the options a tool is written with, and the resolved definition
 * the worker runs. Types only, but for the brand; `defineTool` itself is in define-tool.ts.
 */
import type { z } from 'zod';
import type { Backoff, Logger, TaskSupport, ToolDescriptor, ToolResult } from '@taskrelay/shared';
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
  /** BullMQ's limiter of the tool's queue: the pacer of a plain rate limit (PROTOCOL.md §3.3). */
  readonly rateLimit: { max: number; perMs: number } | undefined;
  /**
   * The limits the worker admits runs by (PROTOCOL.md §3.5): per key, shared by name, and every rate limit's exact
   * count of starts; BullMQ's are the rest.
   */
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
    /**
     * The tool's plain `rateLimit` (no key, no name): BullMQ's limiter of its queue paces the takes, and a refused run
     * holds that limiter and goes back to the front of the queue (PROTOCOL.md §3.3).
     */
    paced: boolean;
  };
}

/**
 * The `ctx` surface, declared once as data (PROTOCOL.md §31.5): each member a handler sees, its arguments (a zod tuple),
 * what kind of member it is, and how an isolated run's child serves it. From this declaration come the isolated
 * child's proxy (engine/isolate-context.ts), the worker's dispatch of the child's calls (engine/isolated-run.ts), the
 * calls a child may send (`ISOLATE_CALLS`), and the `context` key of the Python worker's manifest, against which its
 * `ToolContext` is checked (packages/worker-python/tests/test_context_surface.py). Adding a member is one entry here
 * plus its real implementation in `TaskContext`.
 */
import { z } from 'zod';
import {
  AskKeySchema,
  ElicitParamsSchema,
  FanOutItemsSchema,
  SampleParamsSchema,
  StepVersionSchema,
} from './context-checks.js';
import type { ToolContext } from './context-types.js';

/**
 * What a member is to a handler:
 * - `field`: a value read from `ctx` (`taskId`, `signal`).
 * - `fire-and-forget`: a call that returns nothing and never waits (`progress`, `notify`): written in the background.
 * - `answers`: a call that returns a value (or settles a write) without ending the run.
 * - `suspends`: a call that may end the run (a `SuspendedError`) and resolve in a later run (`elicit`, `fanOut`).
 */
export type ContextMemberKind = 'field' | 'fire-and-forget' | 'answers' | 'suspends';

/**
 * How an isolated run's child serves a member (§31.2):
 * - `call`: a `call` message, carried out on the worker's real context and answered under its id.
 * - `message`: a message of its own kind (`progress`, `notify`), never answered.
 * - `local`: the child's own (its signal, its copy of the state and answers, its logger).
 */
export type IsolateRoute = 'call' | 'message' | 'local';

export interface ContextMember {
  kind: ContextMemberKind;
  isolate: IsolateRoute;
  /**
   * The arguments, in order: a tuple (a field has none; optional elements are optional arguments), or an array for a
   * rest parameter (`...tags`).
   */
  args: z.ZodType<readonly unknown[]>;
  /** True when the member returns at once (no promise): `progress`, `notify`, `throwIfCancelled`, `state.get`. */
  sync?: true;
}

const none = z.tuple([]);
/** A field: read, not called. */
const field: ContextMember = { kind: 'field', isolate: 'local', args: none };
const AskOptions = z.object({ key: AskKeySchema.optional() }).optional();
const TimeoutOptions = z.object({ timeoutMs: z.number().int().optional() }).optional();
/** A function stays in the process that holds it (a step's function runs in the child, §31.2). */
const Fn = z.custom<() => unknown>((value) => typeof value === 'function').meta({ description: 'a function' });

/**
 * Every member of `ToolContext`, by its path (`state.set` is `ctx.state.set`; `waitpoint.wait` is the `wait` of what
 * `ctx.waitpoint` returned). Order is the order the Python check reports in.
 */
export const CONTEXT_SURFACE = {
  taskId: field,
  tool: field,
  attempt: field,
  signal: field,
  log: field,
  answers: field,
  progress: {
    kind: 'fire-and-forget',
    isolate: 'message',
    args: z.tuple([z.number(), z.number().optional(), z.string().optional()]),
    sync: true,
  },
  notify: {
    kind: 'fire-and-forget',
    isolate: 'message',
    args: z.tuple([z.string(), z.unknown(), z.string().optional()]),
    sync: true,
  },
  sleep: { kind: 'answers', isolate: 'local', args: z.tuple([z.number().nonnegative()]) },
  throwIfCancelled: { kind: 'answers', isolate: 'local', args: none, sync: true },
  'state.get': { kind: 'answers', isolate: 'local', args: none, sync: true },
  'state.set': { kind: 'answers', isolate: 'call', args: z.tuple([z.unknown()]) },
  tag: { kind: 'answers', isolate: 'call', args: z.array(z.string()) },
  step: {
    kind: 'answers',
    isolate: 'call',
    args: z.tuple([z.string().min(1), Fn, z.object({ version: StepVersionSchema.optional() }).optional()]),
  },
  elicit: { kind: 'suspends', isolate: 'call', args: z.tuple([ElicitParamsSchema, AskOptions]) },
  sample: { kind: 'suspends', isolate: 'call', args: z.tuple([SampleParamsSchema, AskOptions]) },
  listRoots: { kind: 'suspends', isolate: 'call', args: z.tuple([AskOptions]) },
  suspend: { kind: 'suspends', isolate: 'call', args: z.tuple([z.object({ forMs: z.number().nonnegative() })]) },
  waitpoint: { kind: 'answers', isolate: 'call', args: z.tuple([z.string(), TimeoutOptions]) },
  // Called with no argument; the child's call names its waitpoint (a function cannot cross, §31.2).
  'waitpoint.wait': { kind: 'suspends', isolate: 'call', args: none },
  fanOut: {
    kind: 'suspends',
    isolate: 'call',
    // The options as a caller gives them: `concurrency` and `failFast` default (context-checks.ts).
    args: z.tuple([
      FanOutItemsSchema,
      z.object({
        tool: z.string().min(1),
        concurrency: z.number().int().min(1).max(1000).optional(),
        failFast: z.boolean().optional(),
      }),
    ]),
  },
  batchOutcomes: {
    kind: 'answers',
    isolate: 'call',
    args: z.tuple([z.number().int().nonnegative(), z.number().int().min(0).max(10_000)]),
  },
  'output.write': { kind: 'answers', isolate: 'call', args: z.tuple([z.string()]) },
  'output.set': { kind: 'answers', isolate: 'call', args: z.tuple([z.string()]) },
  // A stream cannot cross to the worker: the child reads it to its end first, bounded as the task is.
  artifact: {
    kind: 'answers',
    isolate: 'call',
    args: z.tuple([z.string(), z.union([z.string(), z.instanceof(Uint8Array)]), z.string()]),
  },
} as const satisfies Record<string, ContextMember>;

export type ContextMemberName = keyof typeof CONTEXT_SURFACE;

/** The member of `ctx` a path starts at: `state` for `state.set`. */
export type TopOf<P extends string> = P extends `${infer Head}.${string}` ? Head : P;
/** Checked by the compiler: a member added to `ToolContext` and not declared here fails the build on this line. */
const everyMemberDeclared: [Exclude<keyof ToolContext, TopOf<ContextMemberName>>] extends [never] ? true : false = true;
void everyMemberDeclared;

type CallNameOf<K extends ContextMemberName> = (typeof CONTEXT_SURFACE)[K] extends { isolate: 'call' } ? K : never;
/** The members an isolated run's child sends as `call` messages, answered by the worker. */
export type IsolateCall = { [K in ContextMemberName]: CallNameOf<K> }[ContextMemberName];

/** The members an isolated run's child sends as `call` messages (`ChildMessageSchema` accepts these alone). */
export const ISOLATE_CALLS = (Object.keys(CONTEXT_SURFACE) as ContextMemberName[]).filter(
  (name): name is IsolateCall => CONTEXT_SURFACE[name].isolate === 'call',
) as [IsolateCall, ...IsolateCall[]];

/** True for a member whose call may suspend the run: its answer carries the task's answers so far (§31.2). */
export function suspends(name: IsolateCall): boolean {
  return (CONTEXT_SURFACE[name] as ContextMember).kind === 'suspends';
}

/** The declaration as the Python manifest carries it (`context`): names, kinds, routes and argument JSON Schemas. */
export function contextManifest(): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(CONTEXT_SURFACE).map(([name, member]: [string, ContextMember]) => [
      name,
      {
        kind: member.kind,
        isolate: member.isolate,
        sync: member.sync === true,
        // A function or a byte array has no JSON Schema: it is emitted as `{}` with its description.
        args: z.toJSONSchema(member.args, { io: 'input', unrepresentable: 'any' }),
      },
    ]),
  );
}

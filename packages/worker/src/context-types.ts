/**
 * What a tool's handler sees of its run: `ToolContext` and the shapes its members take and give (PROTOCOL.md §12, §26,
 * §32, §34), and what the engine hands a `TaskContext`. Types only: the checks are in context-checks.ts, the members'
 * declaration (what an isolated run's child sends) in context-surface.ts, the context itself in context.ts.
 */
import type { JobLock, LogLevel, Logger, Runs, TaskRecord, ToolResult, WaitpointRecord } from '@taskrelay/shared';
import type { ArtifactData, ResourceLink, RunOutput, TaskOutput } from './output.js';

/** A primitive property of an elicitation's `requestedSchema` (MCP restricts forms to flat objects of these). */
export type ElicitValue = string | number | boolean | string[];

/** What `ctx.elicit` asks: MCP's `elicitation/create` params (form mode). */
export interface ElicitParams {
  /** The question, shown to the user. */
  message: string;
  /** A flat JSON Schema object: `{ type: 'object', properties: { name: { type: 'string', ... } }, required? }`. */
  requestedSchema: {
    type: 'object';
    properties: Record<string, Record<string, unknown>>;
    required?: string[];
    [key: string]: unknown;
  };
  [key: string]: unknown;
}

/** The user's answer: `accept` with `content` matching the schema, or `decline` / `cancel` without. */
export interface ElicitAnswer {
  action: 'accept' | 'decline' | 'cancel';
  content?: Record<string, ElicitValue>;
}

/** What `ctx.sample` asks: MCP's `sampling/createMessage` params. */
export interface SampleParams {
  messages: Array<{ role: 'user' | 'assistant'; content: Record<string, unknown> | Array<Record<string, unknown>> }>;
  maxTokens: number;
  systemPrompt?: string;
  [key: string]: unknown;
}

/** The client's `CreateMessageResult`. */
export interface SampleAnswer {
  role: 'user' | 'assistant';
  content: Record<string, unknown> | Array<Record<string, unknown>>;
  model: string;
  stopReason?: string;
  [key: string]: unknown;
}

/** The client's `ListRootsResult`: the roots it lets the server see. */
export interface RootsAnswer {
  roots: Array<{ uri: string; name?: string; [key: string]: unknown }>;
  [key: string]: unknown;
}

/** How a question is named (`ctx.elicit(params, { key })`). */
export interface AskOptions {
  /**
   * The question's name on the 2026-07-28 wire (the key of `inputRequests` / `inputResponses`, PROTOCOL.md §17.6):
   * 1 to 100 of A-Z a-z 0-9 _ - . ; unique among the questions asked together. Default: its request number.
   */
  key?: string;
}

/** How a step is named (`ctx.step(name, fn, { version })`, PROTOCOL.md §12.1). */
export interface StepOptions {
  /**
   * The step's own version (1 to 64 of A-Z a-z 0-9 _ - .): part of its key, so a deploy that changes what the step does
   * bumps it, and the task's next run runs the new step once instead of returning the old one's result.
   */
  version?: string;
}
/** The tool's durable per-task state (PROTOCOL.md §12.1). */
export interface ToolState {
  /** The value as this run started, or as last `set`; undefined before the first `set` of the task. */
  get<T = unknown>(): T | undefined;
  /**
   * Stores `value` (JSON, at most 64 KiB) on the task, durably: the next run of the task, on any worker, sees it.
   * @throws RangeError when the value is too big; CancelledError (`LOCK_LOST`) when this run no longer owns the task.
   */
  set(value: unknown): Promise<void>;
}

/**
 * Why and until when a run suspended (PROTOCOL.md §12). `batch`: the run waits for its children (§26), and checks after
 * it is delayed whether they are done already.
 */
export type Suspension =
  { kind: 'input'; n: number; until: number } | { kind: 'time'; until: number; batch?: true; waitpoint?: string };

/** A waitpoint a tool opened (`ctx.waitpoint`, PROTOCOL.md §32). */
export interface Waitpoint {
  readonly name: string;
  /** What the other system POSTs a JSON body to: no credentials needed, single use, says nothing of the task. */
  readonly url: string;
  /** When `wait()` gives up. */
  readonly timeoutAt: Date;
  /**
   * The body the URL was called with, or a timeout. Suspends the run while neither has happened yet.
   * @throws SuspendedError (as a rejection) while it waits: let it propagate.
   */
  wait(): Promise<WaitpointOutcome>;
}

export type WaitpointOutcome = { ok: true; value: unknown } | { ok: false; reason: 'timeout' };

/** Opens a task's waitpoints for `ctx.waitpoint` (the worker engine's, with the deployment's key and public URL). */
export interface WaitpointHost {
  open(
    taskId: string,
    lock: JobLock,
    name: string,
    timeoutMs: number,
  ): Promise<{ ok: true; record: WaitpointRecord; url: string } | { ok: false; reason: 'gone' | 'lock_lost' }>;
}

/** How `ctx.fanOut` runs the children (PROTOCOL.md §26.1). */
export interface FanOutOptions {
  /** The tool each child runs; any tool a live worker serves. */
  tool: string;
  /** Children in flight at most (queued or running). Default 64, at most 1000. */
  concurrency?: number;
  /** End the batch at its first failed child: queued children are removed, running ones aborted. Default false. */
  failFast?: boolean;
}

/** How one child ended. `cancelled`: it never finished (fail-fast stopped the batch first). */
export interface ChildOutcome {
  index: number;
  status: 'completed' | 'failed' | 'cancelled';
  /** The child's tool result (left out when over 16 KiB as JSON: then `resultOmitted`). */
  result?: ToolResult;
  error?: { code: string; message: string };
  resultOmitted?: true;
}

/** What `ctx.fanOut` resolves with once every child is done (or fail-fast stopped the batch). */
export interface FanOutResult {
  total: number;
  completed: number;
  failed: number;
  /** Children that never finished (fail-fast). */
  cancelled: number;
  /** Each child's outcome, in item order, the first `MAX_FANOUT_OUTCOMES` (1000) of them. */
  outcomes: ChildOutcome[];
  /** More children than `outcomes` lists: read the rest with `ctx.batchOutcomes(from, count)`. */
  truncated: boolean;
  outcomesOmitted: number;
}

/** What the engine does for `ctx.fanOut` (engine/batch-parent.ts); the context only validates and suspends. */
export interface FanOutHost {
  /** Creates or resumes the task's batch: `done` with the result, or `wait` (the run suspends for `pollMs`). */
  fanOut(
    run: { taskId: string; lock: JobLock; record: TaskRecord | undefined; log: Logger },
    items: ReadonlyArray<Record<string, unknown>>,
    options: Required<FanOutOptions>,
  ): Promise<{ kind: 'done'; result: FanOutResult } | { kind: 'wait'; pollMs: number }>;
  outcomes(taskId: string, from: number, count: number): Promise<ChildOutcome[]>;
}
export interface ToolContext {
  /**
   * The task this run belongs to (also the BullMQ job id). Stable across every run of the task: execution is
   * at-least-once (a crashed worker's job runs again elsewhere), so key external side effects on it.
   */
  readonly taskId: string;
  /** The tool's name. */
  readonly tool: string;
  /**
   * Runs started for this task, this one included: 1 on the first; a retry after an error, a takeover after a
   * crash, a hand-back at shutdown and each resume after `suspend` start a new run. Above 1, an earlier run may have
   * had side effects: execution is at-least-once (after a Redis outage longer than the lock a tool can even run
   * twice to its end; one result is recorded), so key them on `taskId` or wrap them in `step`.
   */
  readonly attempt: number;
  /**
   * Aborts when the client cancels the task, when the tool runs past its `timeoutMs`, or when the worker shuts down.
   * `signal.reason` is the `CancelReason` (`'CLIENT_CANCELLED' | 'TIMEOUT' | 'WORKER_SHUTDOWN' | 'GATEWAY_SHUTDOWN' |
   * 'LOCK_LOST'`; `LOCK_LOST`: this worker lost the job, another run owns the task now). Pass it to
   * `fetch`, child processes and the like; a tool that ignores it keeps its worker slot until it returns, and its
   * result is discarded.
   */
  readonly signal: AbortSignal;
  /**
   * Reports progress. Synchronous and cheap: values are throttled per task (`progressIntervalMs`, newest wins) and
   * written to Redis in the background; a failed write is logged, never thrown. `progress` must increase: a value
   * not greater than the last accepted one is dropped.
   *
   * @throws RangeError when `progress` or `total` is not a finite number.
   */
  progress(progress: number, total?: number, message?: string): void;
  /** A pino logger whose lines carry `taskId` and `tool` (the worker's own log; the client never sees it). */
  readonly log: Logger;
  /**
   * Sends a log message to the task's caller (MCP `notifications/message`, PROTOCOL.md §15): `level` is one of MCP's
   * `debug`, `info`, `notice`, `warning`, `error`, `critical`, `alert`, `emergency`; `data` any JSON value (at most
   * 64 KiB serialised); `logger` an optional name. Synchronous and cheap like `progress`: written in the background,
   * in order, never after the task ended; a failed write is logged, never thrown. The caller's session decides what
   * it sees (`logging/setLevel`; default `info` and above).
   *
   * @throws TypeError when `level` is not an MCP log level; RangeError when `data` is too big.
   */
  notify(level: LogLevel, data: unknown, logger?: string): void;
  /**
   * Resolves after `ms` milliseconds; rejects with a `CancelledError` as soon as the signal aborts.
   *
   * @throws RangeError (as a rejection) when `ms` is negative or not finite.
   */
  sleep(ms: number): Promise<void>;
  /** Throws a `CancelledError` when the signal has aborted; otherwise does nothing. */
  throwIfCancelled(): void;
  /**
   * Adds tags to the task (PROTOCOL.md §30.2), beside those its call carried: operators find tasks by them
   * (`taskrelay list --tag`, `GET /admin/api/tasks?tag=`). Each tag once; a task carries at most 10.
   *
   * @throws RangeError (as a rejection) when a tag breaks the rules (1 to 64 characters of letters, digits and
   * `_.:/=@+-`) or the task would carry more than 10.
   */
  tag(...tags: string[]): Promise<void>;
  /** Durable per-task state: what a resumed run needs to skip work already done (PROTOCOL.md §12.1). */
  readonly state: ToolState;
  /**
   * Runs `fn` once per task and returns its (JSON) result; every later run of the task gets the stored result without
   * running `fn` again. A crash between `fn` finishing and the write runs it again (at-least-once).
   */
  step<T>(name: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<T>;
  /**
   * Asks the user a question (MCP elicitation, form mode) and resolves with the answer. The task is
   * `input_required` meanwhile and the run suspends: the handler runs again from the top when the answer comes, and
   * this call (the same n-th question) then resolves at once. Ask questions in the same order on every run.
   *
   * @throws SuspendedError (as a rejection) when the run suspends: let it propagate.
   * @throws TaskrelayError `CAPABILITY_MISSING` when the caller's client cannot answer elicitation requests.
   */
  elicit(params: ElicitParams, options?: AskOptions): Promise<ElicitAnswer>;
  /** Asks the client's model (MCP sampling), like `elicit`. @throws as `elicit`. */
  sample(params: SampleParams, options?: AskOptions): Promise<SampleAnswer>;
  /** Asks the client for its roots (MCP `roots/list`), like `elicit`. @throws as `elicit` (capability `roots`). */
  listRoots(options?: AskOptions): Promise<RootsAnswer>;
  /**
   * Ends this run and runs the handler again from the top in `forMs` ms, on any worker, without holding a slot in
   * between (a poll every few minutes for hours). Always rejects with `SuspendedError`: let it propagate.
   */
  suspend(options: { forMs: number }): Promise<never>;
  /**
   * A URL another system calls to resume this tool (PROTOCOL.md §32): a CI pipeline's callback, a payment's webhook.
   * The same URL for `name` on every run of the task: hand `wp.url` out, then `await wp.wait()`, which suspends the
   * run (no slot held; the task says it waits for an external event) until the URL is POSTed a JSON body or
   * `timeoutMs` (default 24 h, 1 s to 30 days) passes, and then resolves on the next run. Single use per name.
   *
   * @throws RangeError for a bad name or timeout; TaskrelayError `INTERNAL` when the deployment has no waitpoints.
   */
  waitpoint(name: string, options?: { timeoutMs?: number }): Promise<Waitpoint>;
  /** The answers to this task's input requests so far, by request number (`'1'`, `'2'`, ...). */
  readonly answers: Readonly<Record<string, unknown>>;
  /**
   * Fans the work out to one child job per item (PROTOCOL.md §26): each item is the arguments of one run of
   * `options.tool`, on any worker of a pool that serves it, with that tool's own attempts, timeout and stall limit.
   * The run suspends while the children run (no slot held) and the handler runs again from the top when they are
   * done; this call then resolves with each child's outcome. Call it once per task, with the same items on every run.
   * The task's progress is the children finished out of the total meanwhile.
   *
   * @throws SuspendedError (as a rejection) while the children run: let it propagate.
   * @throws TypeError when the items or options are invalid; TaskrelayError `TOOL_NOT_FOUND` when no live worker
   *   serves the tool.
   */
  fanOut(items: ReadonlyArray<Record<string, unknown>>, options: FanOutOptions): Promise<FanOutResult>;
  /** Outcomes of children `from .. from + count − 1` of this task's batch: the ones `fanOut` did not list. */
  batchOutcomes(from: number, count: number): Promise<ChildOutcome[]>;
  /**
   * The task's partial output (PROTOCOL.md §34.2): `write` appends, `set` replaces. The task's principal reads it as
   * the resource `taskrelay://tasks/{taskId}/output` while the task runs and after; subscribers are told it changed.
   */
  readonly output: TaskOutput;
  /**
   * Attaches a file to the task (PROTOCOL.md §34.4): stored apart, returned as a `resource_link` that is also appended
   * to the result's content, readable with `resources/read` by the task's principal. At most
   * `TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK` (64 MiB) per task and `TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL` (1 GiB)
   * per principal by default.
   *
   * @throws TypeError for a bad name, data or MIME type; `StoredBytesLimitError` (a `NonRetryableError`) past a bound.
   */
  artifact(name: string, data: ArtifactData, mimeType: string): Promise<ResourceLink>;
}

export interface TaskContextOptions {
  taskId: string;
  tool: string;
  attempt: number;
  signal: AbortSignal;
  /** Where progress (`recordProgress`) and log messages (`recordLog`; without it `notify` only logs locally) go. */
  store: Pick<Runs, 'recordProgress'> & Partial<Pick<Runs, 'recordLog'>>;
  /** The job lock every progress write is checked against (PROTOCOL.md §10.4). Default: none. */
  lock?: JobLock;
  /** Called when a progress write is refused because the lock is gone. */
  onLockLost?: () => void;
  /** Per-task progress throttle (PROTOCOL.md §8). */
  progressIntervalMs: number;
  /** Already bound to the task (`taskId`, `tool`). */
  logger: Logger;
  /** The task as the run started: its state, step results, answers and the client's capabilities (§12). */
  record?: TaskRecord;
  /** The task store's suspend and state writes (§12); without them `elicit`, `sample`, `suspend`, `state.set` throw. */
  durable?: Pick<Runs, 'suspend' | 'setState' | 'addTags'>;
  /** How long an input request may wait for its answer (the tool's `inputTimeoutMs`). Default 24 h. */
  inputTimeoutMs?: number;
  /** How long a resumed job may wait in the queue (the task's queue timeout), for a timed suspension's deadline. */
  queueTimeoutMs?: number;
  /** The batch engine behind `ctx.fanOut` (§26); without it `fanOut` throws. */
  batch?: FanOutHost;
  /** Waitpoints (§32); without it `waitpoint` throws. */
  waitpoints?: WaitpointHost;
  /** The run's output side (§34); without it `ctx.output` and `ctx.artifact` throw. */
  output?: RunOutput;
  /**
   * A first run's start, sent as the run began and not awaited (PROTOCOL.md §21.2.1): every member that writes
   * durably awaits its answer, and one that reads the record (`ask`, `step`, `fanOut`) reads it then, once, which
   * then becomes `record`. Without it, `record` is the task as the run started.
   */
  start?: PendingStart;
  /** Metrics hooks: a value merged by the throttle, a write sent to Redis. */
  onProgressCoalesced?: () => void;
  onProgressWritten?: () => void;
}

/** A first run's start, on its way (PROTOCOL.md §21.2.1). */
export interface PendingStart {
  /**
   * The start's answer (every call shares the one round trip): true when the run goes on, false when it must not (the
   * run's signal has then aborted with the reason). Never rejects.
   */
  ensure(): Promise<boolean>;
  /**
   * The task as it started, for the members that read it: the start answers without it (issue 46), so it is read
   * once, after the start's answer. Undefined when the run must not go on.
   */
  record(): Promise<TaskRecord | undefined>;
}

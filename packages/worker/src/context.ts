import { z } from 'zod';
import {
  Coalescer,
  DEFAULT_WAITPOINT_TIMEOUT_MS,
  LOG_LEVELS,
  MAX_TAGS,
  MAX_WAITPOINT_TIMEOUT_MS,
  MIN_WAITPOINT_TIMEOUT_MS,
  TaskrelayError,
  WAITPOINT_NAME,
  waitpointMessage,
  isRedisUnavailableError,
  questionIdentity,
  tagsProblem,
  type InputMethod,
  type LogLevel,
  type LogMessage,
  type JobLock,
  type Logger,
  type ProgressUpdate,
  type Runs,
  type TaskRecord,
  type ToolResult,
  type WaitpointRecord,
} from '@taskrelay/shared';
import { CancelledError, SuspendedError, cancelReasonOf } from './errors.js';
import { MAX_PROGRESS_MESSAGE_BYTES, boundedText, wellFormedJson, wellFormedText } from './well-formed.js';
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

const AskKeySchema = z.string().regex(/^[A-Za-z0-9_.-]{1,100}$/, { message: 'must be 1 to 100 of A-Z a-z 0-9 _ - .' });

/** How a step is named (`ctx.step(name, fn, { version })`, PROTOCOL.md §12.1). */
export interface StepOptions {
  /**
   * The step's own version (1 to 64 of A-Z a-z 0-9 _ - .): part of its key, so a deploy that changes what the step does
   * bumps it, and the task's next run runs the new step once instead of returning the old one's result.
   */
  version?: string;
}

const StepVersionSchema = z
  .string()
  .regex(/^[A-Za-z0-9_.-]{1,64}$/, { message: 'must be 1 to 64 of A-Z a-z 0-9 _ - .' });

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

const ElicitParamsSchema = z.looseObject({
  message: z.string().min(1, { message: 'must not be empty' }),
  requestedSchema: z.looseObject({
    type: z.literal('object'),
    properties: z.record(z.string(), z.record(z.string(), z.unknown())),
    required: z.array(z.string()).optional(),
  }),
});

const SampleParamsSchema = z.looseObject({
  messages: z.array(z.looseObject({ role: z.enum(['user', 'assistant']), content: z.unknown() })).min(1),
  maxTokens: z.number().int().positive(),
});

const ElicitAnswerSchema = z.looseObject({
  action: z.enum(['accept', 'decline', 'cancel']),
  content: z.record(z.string(), z.unknown()).optional(),
});

const SampleAnswerSchema = z.looseObject({
  role: z.enum(['user', 'assistant']),
  content: z.unknown(),
  model: z.string(),
});

const RootsAnswerSchema = z.looseObject({
  roots: z.array(z.looseObject({ uri: z.string(), name: z.string().optional() })),
});

/** The largest `ctx.notify` data, serialised: 64 KiB. */
export const MAX_LOG_BYTES = 65_536;

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

const FanOutItemsSchema = z
  .array(z.record(z.string(), z.unknown()), { message: 'items must be an array of argument objects' })
  .min(1, { message: 'items must not be empty' })
  .max(100_000, { message: 'at most 100000 items' });
const FanOutOptionsSchema = z.object({
  tool: z.string().min(1),
  concurrency: z.number().int().min(1).max(1000).default(64),
  failFast: z.boolean().default(false),
});

/**
 * What a tool's `run` receives besides its input. Every member is safe to destructure
 * (`const { progress, sleep } = ctx`).
 */
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
   * durably or reads the record awaits its answer, which then becomes `record`. Without it, `record` is the task as
   * the run started.
   */
  start?: PendingStart;
  /** Metrics hooks: a value merged by the throttle, a write sent to Redis. */
  onProgressCoalesced?: () => void;
  onProgressWritten?: () => void;
}

/** A first run's start, on its way (PROTOCOL.md §21.2.1). */
export interface PendingStart {
  /**
   * The start's answer (every call shares the one round trip): the task as it started, or undefined when the run must
   * not go on (the run's signal has then aborted with the reason). Never rejects.
   */
  ensure(): Promise<TaskRecord | undefined>;
}

/**
 * The `ToolContext` of one job attempt, plus the two hooks the processor needs: `flushProgress` before the terminal
 * transition (so 100/100 lands before the result) and `close` once the run is over.
 */
export class TaskContext implements ToolContext {
  readonly taskId: string;
  readonly tool: string;
  readonly attempt: number;
  readonly signal: AbortSignal;
  readonly log: Logger;

  private readonly store: Pick<Runs, 'recordProgress'> & Partial<Pick<Runs, 'recordLog'>>;
  private readonly lock: JobLock | undefined;
  private readonly onLockLost: (() => void) | undefined;
  private readonly coalescer: Coalescer<ProgressUpdate>;
  private readonly writes = new Set<Promise<void>>();
  private lastProgress: number | undefined;
  private closed = false;
  private readonly durable: Pick<Runs, 'suspend' | 'setState' | 'addTags'> | undefined;
  private readonly waitpointHost: WaitpointHost | undefined;
  private readonly inputTimeoutMs: number;
  private readonly queueTimeoutMs: number;
  private clientCapabilities: readonly string[] | undefined;
  private record: TaskRecord | undefined;
  private pendingStart: PendingStart | undefined;
  private readonly fanOutHost: FanOutHost | undefined;
  private stateValue: unknown;
  private steps: Record<string, unknown>;
  /** Step names earlier runs stored, and the ones this run asked for (a renamed step is reported, §12.1). */
  private storedSteps: ReadonlySet<string>;
  private readonly stepsAsked = new Set<string>();
  private readonly answered: Record<string, unknown>;
  /** Asks of this run so far: the next one is at position `requests + 1` (§12.2). */
  private requests = 0;
  /** The questions the task asked before this run, by number, with where they were asked (§12.3). */
  private readonly stored: Array<{ n: number; identity: string; key: string | undefined; position: number }>;
  /** Request numbers this run has used: a stored request is matched at most once per run. */
  private readonly used = new Set<number>();
  /** The highest request number the task has: a new question takes the next one. */
  private lastNumber: number;
  /** Input requests of this turn, asked together by `flushBatch`. */
  private batch: Array<{
    n: number;
    position: number;
    key: string | undefined;
    method: InputMethod;
    params: Record<string, unknown>;
    schema: z.ZodType;
    resolve: (value: unknown) => void;
    reject: (error: unknown) => void;
  }> = [];
  /** Set once the run suspended: the worker delays the job instead of finishing it (§12.7). */
  suspension: Suspension | undefined;

  constructor(options: TaskContextOptions) {
    this.taskId = options.taskId;
    this.tool = options.tool;
    this.attempt = options.attempt;
    this.signal = options.signal;
    this.log = options.logger;
    this.store = options.store;
    this.lock = options.lock;
    this.onLockLost = options.onLockLost;
    this.coalescer = new Coalescer<ProgressUpdate>({
      minIntervalMs: options.progressIntervalMs,
      send: (update) => {
        options.onProgressWritten?.();
        this.write(update);
      },
      ...(options.onProgressCoalesced ? { onCoalesced: options.onProgressCoalesced } : {}),
    });
    this.durable = options.durable;
    this.inputTimeoutMs = options.inputTimeoutMs ?? 86_400_000;
    this.queueTimeoutMs = options.queueTimeoutMs ?? 3_600_000;
    this.clientCapabilities = options.record?.clientCapabilities;
    this.record = options.record;
    this.pendingStart = options.start;
    this.fanOutHost = options.batch;
    this.waitpointHost = options.waitpoints;
    this.runOutput = options.output;
    this.stateValue = options.record?.state;
    this.steps = { ...options.record?.steps };
    this.storedSteps = new Set(Object.keys(this.steps));
    this.answered = { ...options.record?.inputResponses };
    this.stored = Object.entries(options.record?.inputRequests ?? {}).map(([n, request]) => ({
      n: Number(n),
      identity: questionIdentity(request),
      key: request.key,
      position: request.position ?? Number(n),
    }));
    this.lastNumber = Math.max(options.record?.inputFloor ?? 0, ...this.stored.map((request) => request.n));
  }

  private readonly runOutput: RunOutput | undefined;

  readonly output: TaskOutput = {
    write: async (chunk) => {
      await this.started();
      return this.outputSide().output.write(chunk);
    },
    set: async (snapshot) => {
      await this.started();
      return this.outputSide().output.set(snapshot);
    },
  };

  readonly artifact = async (name: string, data: ArtifactData, mimeType: string): Promise<ResourceLink> => {
    await this.started();
    return this.outputSide().artifact(name, data, mimeType);
  };

  /**
   * A first run awaits its start's answer before anything that writes durably or reads the task (§21.2.1): a
   * task that never ran has no state or questions, but its client's capabilities, its TTL and a redrive's step
   * results are only in Redis, and a task cancelled before the start must not see a step run. Then the run goes on
   * only if its signal has not aborted. No-op once started, and for every other run.
   */
  private async started(): Promise<void> {
    const start = this.pendingStart;
    if (!start) return;
    const record = await start.ensure();
    if (this.pendingStart === start) {
      this.pendingStart = undefined;
      if (record) {
        this.record = record;
        this.clientCapabilities = record.clientCapabilities;
        // A redrive's task starts with the original's step results (§30.3): `step`, which waits for this, finds them.
        this.steps = { ...record.steps };
        this.storedSteps = new Set(Object.keys(this.steps));
      }
    }
    this.throwIfCancelled();
  }

  /** The result as it is stored: the run's output writes settled, artifacts appended, large parts moved out (§34.3). */
  async finishResult(result: ToolResult, inlineAtMost?: number): Promise<ToolResult> {
    return this.runOutput ? this.runOutput.finish(result, inlineAtMost) : result;
  }

  private outputSide(): RunOutput {
    if (!this.runOutput) throw new TypeError('ctx.output and ctx.artifact need a worker (no output store here)');
    return this.runOutput;
  }

  get answers(): Readonly<Record<string, unknown>> {
    return { ...this.answered };
  }

  readonly state: ToolState = {
    get: <T = unknown>(): T | undefined => this.stateValue as T | undefined,
    set: async (value: unknown): Promise<void> => {
      await this.started();
      this.throwIfSuspended();
      this.throwIfCancelled();
      await this.writeDurable('state', value);
      this.stateValue = structuredClone(value);
    },
  };

  readonly step = async <T>(stepName: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<T> => {
    if (typeof stepName !== 'string' || stepName === '') throw new TypeError('ctx.step needs a non-empty name');
    if (typeof fn !== 'function') throw new TypeError('ctx.step needs a function');
    const version = options?.version;
    if (version !== undefined && !StepVersionSchema.safeParse(version).success) {
      throw new TypeError('ctx.step: options.version must be 1 to 64 of A-Z a-z 0-9 _ - .');
    }
    // A versioned step is stored as `<name>@<version>` (§12.1): another version of it is another step.
    const name = version === undefined ? stepName : `${stepName}@${version}`;
    await this.started();
    this.stepsAsked.add(name);
    if (Object.hasOwn(this.steps, name)) return this.steps[name] as T;
    this.throwIfSuspended();
    this.throwIfCancelled();
    // A step earlier runs never stored, while steps they stored are still unasked by this run: most likely one was
    // renamed by a deploy, and its side effect is about to run again. Said before it runs, so a crash cannot hide it.
    const unasked = [...this.storedSteps].filter((stored) => !this.stepsAsked.has(stored));
    if (unasked.length > 0) {
      this.log.warn(
        { taskId: this.taskId, step: name, storedSteps: unasked },
        'ctx.step runs a step earlier runs never stored while steps they stored are unasked: renamed by a deploy? ' +
          'Its side effect runs again',
      );
    }
    const value = await fn();
    const steps = { ...this.steps, [name]: value === undefined ? null : value };
    await this.writeDurable('steps', steps);
    this.steps = steps;
    return value;
  };

  readonly elicit = (params: ElicitParams, options?: AskOptions): Promise<ElicitAnswer> => {
    const parsed = ElicitParamsSchema.safeParse(params);
    if (!parsed.success) {
      return Promise.reject(new TypeError(`ctx.elicit: ${issueText(parsed.error)}`));
    }
    return this.ask(
      'elicitation/create',
      'elicitation',
      parsed.data,
      ElicitAnswerSchema,
      options,
    ) as Promise<ElicitAnswer>;
  };

  readonly sample = (params: SampleParams, options?: AskOptions): Promise<SampleAnswer> => {
    const parsed = SampleParamsSchema.safeParse(params);
    if (!parsed.success) {
      return Promise.reject(new TypeError(`ctx.sample: ${issueText(parsed.error)}`));
    }
    return this.ask(
      'sampling/createMessage',
      'sampling',
      parsed.data,
      SampleAnswerSchema,
      options,
    ) as Promise<SampleAnswer>;
  };

  readonly listRoots = (options?: AskOptions): Promise<RootsAnswer> =>
    this.ask('roots/list', 'roots', {}, RootsAnswerSchema, options) as Promise<RootsAnswer>;

  readonly suspend = async (options: { forMs: number }): Promise<never> => {
    const forMs = options?.forMs;
    if (typeof forMs !== 'number' || !Number.isFinite(forMs) || forMs < 0) {
      throw new RangeError(`ctx.suspend needs a finite, non-negative forMs (got ${String(forMs)})`);
    }
    await this.started();
    this.throwIfSuspended();
    this.throwIfCancelled();
    const durable = this.requireDurable('suspend');
    const until = Date.now() + forMs;
    const outcome = await durable.suspend(this.taskId, this.requireLock(), {
      deadlineAt: until + this.queueTimeoutMs,
    });
    this.settleSuspend(outcome);
    this.suspension ??= { kind: 'time', until };
    throw new SuspendedError();
  };

  readonly waitpoint = async (name: string, options?: { timeoutMs?: number }): Promise<Waitpoint> => {
    if (typeof name !== 'string' || !WAITPOINT_NAME.test(name)) {
      throw new RangeError(`ctx.waitpoint: the name must be 1-64 of A-Z a-z 0-9 . _ : - (got ${String(name)})`);
    }
    const timeoutMs = options?.timeoutMs ?? DEFAULT_WAITPOINT_TIMEOUT_MS;
    if (
      !Number.isSafeInteger(timeoutMs) ||
      timeoutMs < MIN_WAITPOINT_TIMEOUT_MS ||
      timeoutMs > MAX_WAITPOINT_TIMEOUT_MS
    ) {
      throw new RangeError(
        `ctx.waitpoint: timeoutMs must be an integer from 1000 to 30 days (got ${String(timeoutMs)})`,
      );
    }
    await this.started();
    this.throwIfSuspended();
    this.throwIfCancelled();
    if (!this.waitpointHost) throw new TaskrelayError('INTERNAL', 'ctx.waitpoint is not available in this context');
    const opened = await this.waitpointHost.open(this.taskId, this.requireLock(), name, timeoutMs);
    if (!opened.ok) {
      if (opened.reason === 'lock_lost') this.onLockLost?.();
      throw new CancelledError(opened.reason === 'lock_lost' ? 'LOCK_LOST' : cancelReasonOf(this.signal));
    }
    const { record, url } = opened;
    return { name, url, timeoutAt: new Date(record.timeoutAt), wait: () => this.waitOn(name, record) };
  };

  /** A waitpoint's outcome when it has one, else the run suspends until it is called or times out (§32.3). */
  private async waitOn(name: string, record: WaitpointRecord): Promise<WaitpointOutcome> {
    if (record.state === 'completed') return { ok: true, value: record.value };
    if (record.state === 'timedOut') return { ok: false, reason: 'timeout' };
    this.throwIfSuspended();
    this.throwIfCancelled();
    const outcome = await this.requireDurable('waitpoint').suspend(this.taskId, this.requireLock(), {
      deadlineAt: record.timeoutAt + this.queueTimeoutMs,
      statusMessage: waitpointMessage(name),
    });
    this.settleSuspend(outcome);
    this.suspension ??= { kind: 'time', until: record.timeoutAt, waitpoint: name };
    throw new SuspendedError();
  }

  readonly fanOut = async (
    items: ReadonlyArray<Record<string, unknown>>,
    options: FanOutOptions,
  ): Promise<FanOutResult> => {
    const parsedItems = FanOutItemsSchema.safeParse(items);
    if (!parsedItems.success) throw new TypeError(`ctx.fanOut: ${issueText(parsedItems.error)}`);
    const parsed = FanOutOptionsSchema.safeParse(options ?? {});
    if (!parsed.success) throw new TypeError(`ctx.fanOut: ${issueText(parsed.error)}`);
    await this.started();
    this.throwIfSuspended();
    this.throwIfCancelled();
    if (!this.fanOutHost) throw new TaskrelayError('INTERNAL', 'ctx.fanOut is not available in this context');
    const durable = this.requireDurable('fanOut');
    const run = { taskId: this.taskId, lock: this.requireLock(), record: this.record, log: this.log };
    let step: Awaited<ReturnType<FanOutHost['fanOut']>>;
    try {
      step = await this.fanOutHost.fanOut(run, parsedItems.data, parsed.data);
    } catch (error) {
      if (error instanceof CancelledError && error.reason === 'LOCK_LOST') this.onLockLost?.();
      // Redis unreachable mid-release: not the tool's failure. The run ends as one that lost its lock (nothing more
      // written, the job handed back or taken over), and the replay goes on from what Redis holds.
      if (isRedisUnavailableError(error)) {
        this.onLockLost?.();
        throw new CancelledError('LOCK_LOST');
      }
      throw error;
    }
    if (step.kind === 'done') {
      const { result } = step;
      this.progress(result.completed + result.failed, result.total, batchMessage(result));
      return result;
    }
    // The children run; this run ends without holding its slot. A child's record promotes the job (§26.4); the poll
    // is the safety net for a lost promotion.
    const until = Date.now() + step.pollMs;
    const outcome = await durable.suspend(this.taskId, this.requireLock(), { deadlineAt: until + this.queueTimeoutMs });
    this.settleSuspend(outcome);
    this.suspension ??= { kind: 'time', until, batch: true };
    throw new SuspendedError();
  };

  readonly batchOutcomes = async (from: number, count: number): Promise<ChildOutcome[]> => {
    if (!Number.isSafeInteger(from) || from < 0 || !Number.isSafeInteger(count) || count < 0 || count > 10_000) {
      throw new RangeError('ctx.batchOutcomes needs an index from >= 0 and a count of 0..10000');
    }
    if (!this.fanOutHost) throw new TaskrelayError('INTERNAL', 'ctx.batchOutcomes is not available in this context');
    await this.started();
    return this.fanOutHost.outcomes(this.taskId, from, count);
  };

  readonly progress = (progress: number, total?: number, message?: string): void => {
    checkProgressArgs(progress, total);
    if (this.closed) {
      this.log.debug({ progress }, 'progress after the run ended dropped');
      return;
    }
    if (this.lastProgress !== undefined && progress <= this.lastProgress) {
      this.log.debug({ progress, last: this.lastProgress }, 'progress not greater than the last value dropped');
      return;
    }
    this.lastProgress = progress;
    const update: ProgressUpdate = { progress };
    if (total !== undefined) update.total = total;
    // Well-formed, or the store's script refuses the whole update (§22.4).
    // Bounded, or a flood of long messages gets the gateway's subscriber cut (§22.4).
    if (message !== undefined) {
      update.message = boundedText(wellFormedText(String(message)), MAX_PROGRESS_MESSAGE_BYTES);
    }
    this.coalescer.push(update);
  };

  readonly notify = (level: LogLevel, data: unknown, logger?: string): void => {
    checkNotifyArgs(level, data);
    if (this.closed) {
      this.log.debug({ level }, 'log message after the run ended dropped');
      return;
    }
    const recordLog = this.store.recordLog?.bind(this.store);
    if (!recordLog) {
      this.log.info({ level, data }, 'log message (no client route in this context)');
      return;
    }
    const message: LogMessage = { level, data: wellFormedJson(data) };
    if (logger !== undefined) message.logger = wellFormedText(String(logger));
    // In the same write set as progress: flushProgress waits for it, so every message is published before the task's
    // terminal status and reaches the caller before the result.
    const write: Promise<void> = recordLog(this.taskId, message, this.lock)
      .then(
        (outcome) => {
          if (outcome === 'lock_lost') {
            this.log.warn({ level }, 'log message refused: this worker no longer holds the job');
            this.onLockLost?.();
          } else if (outcome !== 'published') {
            this.log.debug({ level, outcome }, 'log message not published');
          }
        },
        (error: unknown) => this.log.warn({ err: error, level }, 'log message write failed'),
      )
      .finally(() => this.writes.delete(write));
    this.writes.add(write);
  };

  readonly sleep = (ms: number): Promise<void> => abortableSleep(this.signal, ms);

  readonly throwIfCancelled = (): void => {
    if (this.signal.aborted) throw new CancelledError(cancelReasonOf(this.signal));
  };

  /**
   * The n-th input request of the task: the stored answer, or a suspension (§12.2). Requests made in the same turn
   * (`Promise.all([ctx.elicit(a), ctx.elicit(b)])`) are asked together: both are pending at once.
   */
  private ask(
    method: InputMethod,
    capability: string,
    params: Record<string, unknown>,
    answerSchema: z.ZodType,
    options: AskOptions | undefined,
  ): Promise<unknown> {
    // The client's capabilities are read with the start (§21.2.1); asks of one turn keep their order.
    if (this.pendingStart) {
      return this.started().then(() => this.ask(method, capability, params, answerSchema, options));
    }
    if (this.suspension) return Promise.reject(new SuspendedError());
    const key = options?.key;
    if (key !== undefined) {
      const checked = AskKeySchema.safeParse(key);
      if (!checked.success) return Promise.reject(new TypeError(`options.key ${issueText(checked.error)}`));
      if (this.batch.some((entry) => entry.key === key)) {
        return Promise.reject(new TypeError(`options.key ${key} is already asked in this turn`));
      }
    }
    const position = ++this.requests;
    const n = this.numberFor(position, key, questionIdentity({ method, params, key }));
    if (Object.hasOwn(this.answered, String(n))) {
      try {
        return Promise.resolve(this.checkAnswer(method, this.answered[String(n)], answerSchema));
      } catch (error) {
        return Promise.reject(error instanceof Error ? error : new Error(String(error)));
      }
    }
    if (this.signal.aborted) return Promise.reject(new CancelledError(cancelReasonOf(this.signal)));
    if (this.clientCapabilities !== undefined && !this.clientCapabilities.includes(capability)) {
      return Promise.reject(
        new TaskrelayError(
          'CAPABILITY_MISSING',
          `The client of this task did not declare the ${capability} capability, so it cannot be asked (${method})`,
          { data: { capability } },
        ),
      );
    }
    return new Promise<unknown>((resolve, reject) => {
      this.batch.push({ n, position, key, method, params, schema: answerSchema, resolve, reject });
      if (this.batch.length === 1) setImmediate(() => void this.flushBatch());
    });
  }

  /**
   * The request number of this ask (PROTOCOL.md §12.3): the stored question it is — the one with its key, or for an
   * unkeyed question the one asked at its position — when that question is the same (`questionIdentity`), so its
   * answer (or its pending wait) is this ask's; otherwise a new number, and the question is asked again. A stored
   * answer is never handed to another question: after a deploy that reorders or changes a tool's questions, the ones
   * that changed are asked anew and the others keep their answers.
   */
  private numberFor(position: number, key: string | undefined, identity: string): number {
    const candidates = this.stored.filter((request) =>
      key !== undefined ? request.key === key : request.key === undefined && request.position === position,
    );
    const latest = candidates.filter((request) => !this.used.has(request.n)).sort((a, b) => b.n - a.n)[0];
    if (latest !== undefined && latest.identity === identity) {
      this.used.add(latest.n);
      return latest.n;
    }
    if (latest !== undefined) {
      this.log.warn(
        { taskId: this.taskId, inputRequest: latest.n, position, ...(key === undefined ? {} : { key }) },
        'the question asked here changed since its answer was stored (a deploy?): asking it again',
      );
    }
    const n = ++this.lastNumber;
    this.used.add(n);
    return n;
  }

  /** Asks every request of this turn in one SUSPEND (§12.2): answered ones resolve, the rest suspend the run. */
  private async flushBatch(): Promise<void> {
    const batch = this.batch.splice(0);
    if (batch.length === 0) return;
    try {
      const durable = this.requireDurable(batch[0]?.method === 'sampling/createMessage' ? 'sample' : 'elicit');
      const until = Date.now() + this.inputTimeoutMs;
      const outcome = await durable.suspend(this.taskId, this.requireLock(), {
        requests: batch.map(({ n, position, key, method, params }) =>
          key === undefined ? { n, position, method, params } : { n, position, key, method, params },
        ),
        deadlineAt: until,
      });
      this.settleSuspend(outcome);
      const answers = outcome.outcome === 'suspended' ? outcome.answers : {};
      const waiting = batch.filter((entry) => !Object.hasOwn(answers, String(entry.n)));
      if (waiting.length > 0) {
        this.suspension = { kind: 'input', n: waiting[0]?.n ?? 0, until };
        this.log.info(
          { inputRequests: waiting.map((entry) => entry.n), methods: waiting.map((entry) => entry.method) },
          'input requested; run suspends until the answers',
        );
      }
      for (const entry of batch) {
        const key = String(entry.n);
        if (Object.hasOwn(answers, key)) {
          this.answered[key] = answers[key];
          try {
            entry.resolve(this.checkAnswer(entry.method, answers[key], entry.schema));
          } catch (error) {
            entry.reject(error);
          }
        } else {
          entry.reject(new SuspendedError());
        }
      }
    } catch (error) {
      for (const entry of batch) entry.reject(error);
    }
  }

  private checkAnswer(method: InputMethod, answer: unknown, schema: z.ZodType): unknown {
    const parsed = schema.safeParse(answer);
    if (!parsed.success) {
      throw new TaskrelayError('INTERNAL', `The stored answer to ${method} is malformed: ${issueText(parsed.error)}`);
    }
    return parsed.data;
  }

  /** Turns a refused suspend into the error the handler sees; a `suspended` outcome passes. */
  private settleSuspend(outcome: Awaited<ReturnType<Runs['suspend']>>): void {
    if (outcome.outcome === 'lock_lost') {
      this.onLockLost?.();
      throw new CancelledError('LOCK_LOST');
    }
    if (outcome.outcome === 'gone') {
      throw new CancelledError(this.signal.aborted ? cancelReasonOf(this.signal) : 'CLIENT_CANCELLED');
    }
  }

  async tag(...tags: string[]): Promise<void> {
    const problem = tagsProblem(tags);
    if (problem !== undefined) throw new RangeError(`ctx.tag: ${problem}`);
    if (tags.length === 0) return;
    await this.started();
    const outcome = await this.requireDurable('tag').addTags(this.taskId, this.requireLock(), tags);
    if (outcome === 'full') throw new RangeError(`ctx.tag: a task carries at most ${MAX_TAGS} tags`);
    this.settleWrite(outcome);
  }

  /** Turns a refused lock-checked write into the error the handler sees. */
  private settleWrite(outcome: 'written' | 'gone' | 'lock_lost'): void {
    if (outcome === 'lock_lost') {
      this.onLockLost?.();
      throw new CancelledError('LOCK_LOST');
    }
    if (outcome === 'gone') {
      throw new CancelledError(this.signal.aborted ? cancelReasonOf(this.signal) : 'CLIENT_CANCELLED');
    }
  }

  private async writeDurable(field: 'state' | 'steps', value: unknown): Promise<void> {
    const durable = this.requireDurable(field === 'state' ? 'state.set' : 'step');
    this.settleWrite(await durable.setState(this.taskId, this.requireLock(), field, value));
  }

  private requireDurable(what: string): Pick<Runs, 'suspend' | 'setState' | 'addTags'> {
    if (!this.durable) throw new TaskrelayError('INTERNAL', `ctx.${what} is not available in this context`);
    return this.durable;
  }

  private requireLock(): JobLock {
    return this.lock ?? { queue: '', token: '' };
  }

  private throwIfSuspended(): void {
    if (this.suspension) throw new SuspendedError();
  }

  /** Writes the pending progress value (if any) and waits for every write in flight. Never rejects. */
  async flushProgress(): Promise<void> {
    this.coalescer.flush();
    while (this.writes.size > 0) await Promise.all(this.writes);
  }

  /** Ends the run: a pending progress value is dropped and later `progress` calls are ignored. */
  close(): void {
    this.closed = true;
    this.coalescer.cancel();
  }

  private write(update: ProgressUpdate): void {
    const write: Promise<void> = this.store
      .recordProgress(this.taskId, update, this.lock)
      .then(
        (outcome) => {
          if (outcome === 'lock_lost') {
            this.log.warn({ progress: update.progress }, 'progress refused: this worker no longer holds the job');
            this.onLockLost?.();
          } else if (outcome !== 'accepted') {
            this.log.debug({ progress: update.progress, outcome }, 'progress not recorded');
          }
        },
        (error: unknown) => {
          this.log.warn({ err: error, progress: update.progress }, 'progress write failed');
        },
      )
      .finally(() => this.writes.delete(write));
    this.writes.add(write);
  }
}

/**
 * `ctx.sleep`: resolves after `ms`, rejects with `CancelledError` as soon as `signal` aborts; in the worker's thread
 * and in an isolated run's child alike (PROTOCOL.md §31.2).
 */
export function abortableSleep(signal: AbortSignal, ms: number): Promise<void> {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
    return Promise.reject(new RangeError(`sleep needs a finite, non-negative number of ms (got ${String(ms)})`));
  }
  if (signal.aborted) return Promise.reject(new CancelledError(cancelReasonOf(signal)));
  return new Promise<void>((resolve, reject) => {
    // setImmediate for 0 so a tight `sleep(0)` loop yields without the 1 ms timer floor.
    const clear = () => (ms === 0 ? clearImmediate(immediate) : clearTimeout(timer));
    const onAbort = () => {
      clear();
      reject(new CancelledError(cancelReasonOf(signal)));
    };
    const done = () => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    };
    const immediate = ms === 0 ? setImmediate(done) : undefined;
    const timer = ms === 0 ? undefined : setTimeout(done, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * What `ctx.progress` checks before anything is sent, in the worker's thread and in an isolated run's child alike
 * (PROTOCOL.md §31.2).
 *
 * @throws RangeError when `progress` or `total` is not a finite number.
 */
export function checkProgressArgs(progress: number, total: number | undefined): void {
  if (typeof progress !== 'number' || !Number.isFinite(progress)) {
    throw new RangeError(`progress must be a finite number (got ${String(progress)})`);
  }
  if (total !== undefined && (typeof total !== 'number' || !Number.isFinite(total))) {
    throw new RangeError(`total must be a finite number (got ${String(total)})`);
  }
}

/**
 * What `ctx.notify` checks before anything is sent, as `checkProgressArgs`.
 *
 * @throws TypeError when `level` is not an MCP log level or `data` no JSON value; RangeError when `data` is too big.
 */
export function checkNotifyArgs(level: unknown, data: unknown): void {
  if (!(LOG_LEVELS as readonly unknown[]).includes(level)) {
    throw new TypeError(`ctx.notify: level must be one of ${LOG_LEVELS.join(', ')} (got ${String(level)})`);
  }
  const json = JSON.stringify(data ?? null) as string | undefined;
  if (json === undefined) throw new TypeError('ctx.notify: data must be a JSON value');
  if (Buffer.byteLength(json) > MAX_LOG_BYTES) {
    throw new RangeError(`ctx.notify: data is over ${MAX_LOG_BYTES} bytes as JSON`);
  }
}

/** The parent's status message while and after its children run (§26.3). */
export function batchMessage(counts: { completed: number; failed: number; total: number }): string {
  return `${counts.completed + counts.failed} of ${counts.total} children done (${counts.failed} failed)`;
}

function issueText(error: z.ZodError): string {
  const issue = error.issues[0];
  return `${issue?.path.map(String).join('.') || 'params'} ${issue?.message ?? 'is invalid'}`;
}

/**
 * The `ctx` of a run in the worker's own thread (PROTOCOL.md §12): progress and log messages, durable state and steps,
 * input requests, suspensions, batches, waitpoints and output, each written under the run's job lock.
 */
import type { z } from 'zod';
import {
  DEFAULT_WAITPOINT_TIMEOUT_MS,
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
  type JobLock,
  type Logger,
  type Runs,
  type TaskRecord,
  type ToolResult,
  type WaitpointRecord,
} from '@taskrelay/shared';
import { CancelledError, SuspendedError, cancelReasonOf } from './errors.js';
import { RunMessages } from './run-messages.js';
import type { ArtifactData, ResourceLink, RunOutput, TaskOutput } from './output.js';
import {
  AskKeySchema,
  ElicitAnswerSchema,
  ElicitParamsSchema,
  FanOutItemsSchema,
  FanOutOptionsSchema,
  RootsAnswerSchema,
  SampleAnswerSchema,
  SampleParamsSchema,
  StepVersionSchema,
  abortableSleep,
  batchMessage,
  issueText,
} from './context-checks.js';
import type {
  AskOptions,
  ChildOutcome,
  ElicitAnswer,
  ElicitParams,
  FanOutHost,
  FanOutOptions,
  FanOutResult,
  PendingStart,
  RootsAnswer,
  SampleAnswer,
  SampleParams,
  StepOptions,
  Suspension,
  TaskContextOptions,
  ToolContext,
  ToolState,
  Waitpoint,
  WaitpointHost,
  WaitpointOutcome,
} from './context-types.js';

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

  private readonly lock: JobLock | undefined;
  private readonly onLockLost: (() => void) | undefined;
  /** Progress and log messages, written in the background (run-messages.ts). */
  private readonly messages: RunMessages;
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
    this.lock = options.lock;
    this.onLockLost = options.onLockLost;
    this.messages = new RunMessages(options);
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
   * only if its signal has not aborted. The start answers without the record (issue 46): a member that reads it
   * (`needsRecord`: `ask`, `step`, `fanOut`) reads it once, after the start's answer. No-op once the record is read,
   * and for every other run.
   */
  private async started(needsRecord = false): Promise<void> {
    const start = this.pendingStart;
    if (!start) return;
    const goes = await start.ensure();
    if (goes && !needsRecord) {
      this.throwIfCancelled();
      return;
    }
    const record = goes ? await start.record() : undefined;
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
    await this.started(true);
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
    await this.started(true);
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

  readonly progress = (progress: number, total?: number, message?: string): void =>
    this.messages.progress(progress, total, message);

  readonly notify = (level: LogLevel, data: unknown, logger?: string): void =>
    this.messages.notify(level, data, logger);

  readonly batchOutcomes = async (from: number, count: number): Promise<ChildOutcome[]> => {
    if (!Number.isSafeInteger(from) || from < 0 || !Number.isSafeInteger(count) || count < 0 || count > 10_000) {
      throw new RangeError('ctx.batchOutcomes needs an index from >= 0 and a count of 0..10000');
    }
    if (!this.fanOutHost) throw new TaskrelayError('INTERNAL', 'ctx.batchOutcomes is not available in this context');
    await this.started();
    return this.fanOutHost.outcomes(this.taskId, from, count);
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
      return this.started(true).then(() => this.ask(method, capability, params, answerSchema, options));
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
  flushProgress(): Promise<void> {
    return this.messages.flush();
  }

  /** Ends the run: a pending progress value is dropped and later `progress` calls are ignored. */
  close(): void {
    this.messages.close();
  }
}

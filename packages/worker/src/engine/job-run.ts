/**
 * The run of one job (PROTOCOL.md §5, §10, §12): BullMQ's processor. It records the run's start (a first run's with
 * its first durable write or its end, §21.2.1), checks the job, runs the tool with its context, then carries out what
 * `settle` decides.
 */
import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import {
  JobDataSchema,
  type FairShare,
  type TaskOutputStore,
  type JobData,
  TaskrelayError,
  isRedisUnavailableError,
  isTerminal,
  serializeError,
  type CancelReason,
  type JobLock,
  type Logger,
  type RedisTaskStore,
  type SerializedError,
  type TaskRecord,
  type TaskStatus,
  type ToolResult,
  type TransitionFields,
  type TransitionOutcome,
  queueOfBullName,
} from '@taskrelay/shared';
import { TaskContext } from '../context.js';
import type { Suspension, WaitpointHost } from '../context-types.js';
import { describeIssues, toToolResult, type ToolDefinition } from '../define-tool.js';
import { cancelReasonOf } from '../errors.js';
import type { WorkerMetrics } from '../metrics.js';
import { isChildJob, type ChildRunner } from './batch-child.js';
import { callTool } from './isolated-run.js';
import type { BatchParent } from './batch-parent.js';
import { MAX_TIMER_MS, runUnderTimeout, type RunEnvelope } from './run-envelope.js';
import type { LimitWait, ToolLimits } from './tool-limits.js';
import { TaskLogKeeper } from './log-keeper.js';
import { RunOutput } from '../output.js';
import type { ToolVersions } from './tool-versions.js';
import type { RunningJob, RunningJobs } from './running-jobs.js';
import { failOrRetry, settle, type RunOutcome, type SettleAction } from './settle.js';
import { FirstRunStart } from './first-run-start.js';
import { bullLockMs, writeThroughOutage } from './end-write.js';
import { UNREADABLE_JOB_DATA } from './slot-gate.js';

/** How long a job may wait in the queue when its data does not say (the gateway's default). */
const DEFAULT_QUEUE_TIMEOUT_MS = 3_600_000;

export interface JobRunnerOptions {
  workerId: string;
  tools: ReadonlyMap<string, ToolDefinition>;
  store: RedisTaskStore;
  /** Where a job leaves its principal's waiting share of the pool when a run takes it (PROTOCOL.md §25). */
  fairShare: Pick<FairShare, 'leave'>;
  running: RunningJobs;
  metrics: WorkerMetrics;
  log: Logger;
  lockDurationMs: number;
  progressIntervalMs: number;
  /** True once the worker no longer takes jobs: a job fetched anyway is handed back. */
  isClosing: () => boolean;
  /** What surrounds every run, and the one hand-back (run-envelope.ts). */
  envelope: RunEnvelope;
  /** Batches (PROTOCOL.md §26): the parent's `ctx.fanOut`, and the runs of child jobs. */
  batches?: { parent: BatchParent; children: ChildRunner };
  /** Who else serves a tool version, and for how long a run leaves a task to them (PROTOCOL.md §12.11). */
  versions?: ToolVersions;
  /** The limits runs are admitted by here, per key or shared by name (PROTOCOL.md §3.5). */
  limits?: ToolLimits;
  /** Opens waitpoints for `ctx.waitpoint` (PROTOCOL.md §32). */
  waitpoints?: WaitpointHost;
  /** Where `ctx.output`, `ctx.artifact` and results by reference are stored (PROTOCOL.md §34). */
  output?: TaskOutputStore;
}

/** What a terminal write of each status carries, for its log lines (§10.10). */
const WRITTEN_AS: Partial<Record<TaskStatus, string>> = { completed: 'result', failed: 'failure', cancelled: 'cancel' };
/** What a task whose run went back says until its next run starts (§5.7); the Python worker says the same. */
export const HANDED_BACK_MESSAGE = 'Waiting to be resumed: its worker stopped and put its run back in the queue';

/** How long a job left to a worker of its task's tool version waits before any worker may take it again. */
const VERSION_DEFER_MS = 250;

/** What every step of a run names: its job and lock token, its task, its log. */
interface RunScope {
  job: Job<unknown, void>;
  token: string | undefined;
  taskId: string;
  lock: JobLock;
  log: Logger;
  /** A first run's start, sent as the run began and not awaited before its tool (PROTOCOL.md §21.2.1). */
  start?: FirstRunStart;
}

/** The job's data as the run read it: checked once, before the run's start is recorded. */
type ParsedJobData = ReturnType<typeof JobDataSchema.safeParse>;

/** A run's timeout: the message the task fails with, and that failure's write once the timeout fired. */
interface RunTimeout {
  message: string;
  failed?: Promise<void>;
}

/** What carrying out a run's end works with: the run, its context and tool, what the tool did, and its bounds. */
interface RunEnd extends RunScope {
  ctx: TaskContext;
  tool: ToolDefinition;
  /** The arguments as the tool's schema parsed them. */
  args: Record<string, unknown>;
  outcome: RunOutcome;
  retry: { attemptsMade: number; attempts: number };
  queueTimeoutMs: number;
  timeout: RunTimeout;
  /** Whose keyed limits the run counts in (§3.5). */
  principal: string;
}

export class JobRunner {
  constructor(private readonly o: JobRunnerOptions) {}

  /** Declared with three parameters: BullMQ only passes its abort signal to a processor of length 3. */
  readonly process = async (
    job: Job<unknown, void>,
    token: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<void> => {
    // A batch child has no task of its own (§26.3): its run is the child runner's.
    if (this.o.batches && isChildJob(job.data)) return this.o.batches.children.process(job, token, signal);
    const taskId = job.id ?? '';
    const log = this.o.log.child({
      taskId,
      jobId: taskId,
      tool: job.name,
      attempt: attemptOf(job),
      ...correlationOf(job),
    });
    const attributes = {
      'taskrelay.task_id': taskId,
      'taskrelay.tool': job.name,
      'taskrelay.attempt': attemptOf(job),
      'taskrelay.worker_id': this.o.workerId,
    };
    return this.o.envelope.run(job, token, signal, log, attributes, (entry) =>
      this.run(job, token, taskId, entry, log),
    );
  };

  private async run(
    job: Job<unknown, void>,
    token: string | undefined,
    taskId: string,
    entry: RunningJob,
    log: Logger,
  ): Promise<void> {
    if (this.o.isClosing()) return this.handBack(job, token, log);
    const lock: JobLock = { queue: queueOfBullName(job.queueName), token: token ?? '' };
    const run: RunScope = { job, token, taskId, lock, log };
    const parsed = JobDataSchema.safeParse(job.data);
    const queueTimeoutMs = (parsed.success ? parsed.data.queueTimeoutMs : undefined) ?? DEFAULT_QUEUE_TIMEOUT_MS;
    // Before anything else of the run is written (§21.2.1).
    run.start = this.pipelineStart(run, parsed, queueTimeoutMs);
    try {
      return await this.runStarted(run, parsed, queueTimeoutMs, entry);
    } finally {
      // The job leaves this processor only once its start is answered: BullMQ's next move of the job goes on another
      // connection, and must not overtake the start. Never rejects.
      await run.start?.ensure();
    }
  }

  private async runStarted(
    run: RunScope,
    parsed: ParsedJobData,
    queueTimeoutMs: number,
    entry: RunningJob,
  ): Promise<void> {
    const { job, taskId, lock, log } = run;
    // A first run, whose start is on its way (§21.2.1), knows what a task that never ran holds: no state, steps or
    // questions, and the job's principal; the context reads the rest from the start's answer when it needs it.
    const task = run.start ? undefined : await this.recordStart(run, parsed, queueTimeoutMs);
    if (!run.start && !task) return;
    const principal = task?.principal ?? (parsed.success ? parsed.data.principal : undefined) ?? '';
    entry.principal = principal;
    // One child logger per job (made by the processor); the principal joins its bindings once known, unless the job's
    // correlation fields already carried it (a gateway's jobs do: no second pass of the bindings through redaction).
    if ((job.data as { principal?: unknown } | undefined)?.principal !== principal) {
      log.setBindings({ principal });
    }
    const { data, tool, input } = await this.checkJob(run, parsed);
    // The gateway already capped the tool's own timeout (§7.7); the tool's is applied again for jobs added by others.
    const timeoutMs = minDefined(data.timeoutMs, tool.timeoutMs);

    // A per-key or shared limit (§3.5) may send the run back to wait, holding no slot.
    const wait = await this.admit(run, tool, input, entry);
    if (wait) return this.waitForLimit({ ...run, wait, queueTimeoutMs });

    const { controller } = entry;
    const { metrics } = this.o;
    // The tool's log lines are also kept with its task (PROTOCOL.md §30.4).
    const keeper = new TaskLogKeeper(this.o.store, taskId, attemptOf(job), log);
    const ctx = new TaskContext({
      taskId,
      tool: tool.name,
      attempt: attemptOf(job),
      signal: controller.signal,
      store: this.o.store,
      lock,
      onLockLost: () => this.o.running.loseLock(taskId, 'progress write refused'),
      progressIntervalMs: this.o.progressIntervalMs,
      logger: keeper.wrap(log),
      ...(task ? { record: task } : {}),
      ...(run.start ? { start: run.start } : {}),
      durable: this.o.store,
      inputTimeoutMs: tool.inputTimeoutMs,
      queueTimeoutMs,
      onProgressCoalesced: () => metrics.progressCoalesced.inc(),
      onProgressWritten: () => metrics.progressWritten.inc(),
      ...(this.o.batches ? { batch: this.o.batches.parent.forRun(data.maxOpen, data.priority) } : {}),
      ...(this.o.waitpoints ? { waitpoints: this.o.waitpoints } : {}),
      ...(this.o.output
        ? {
            output: new RunOutput({
              store: this.o.output,
              taskId,
              principal,
              lock: { queue: lock.queue, jobId: taskId, token: lock.token },
              log,
              onLockLost: () => this.o.running.loseLock(taskId, 'output write refused'),
            }),
          }
        : {}),
    });
    const { outcome, timeout } = await this.runTool(run, controller, tool, input, ctx, timeoutMs);
    // Its last lines are kept before its end is written, so a reader of the ended task sees them all.
    await keeper.flush();

    // The tool is done: from here the run writes its own end, which the cancel sweep must not take for another's.
    entry.settling = true;
    const retry = { attemptsMade: job.attemptsMade, attempts: job.opts.attempts ?? 1 };
    const action = settle({
      outcome,
      reason: controller.signal.aborted ? cancelReasonOf(controller.signal) : undefined,
      suspended: ctx.suspension !== undefined,
      ...retry,
    });
    return this.carryOut(action, {
      ...run,
      ctx,
      tool,
      args: input,
      outcome,
      retry,
      queueTimeoutMs,
      timeout,
      principal,
    });
  }

  /**
   * Records the run's start (§5): its deadline, attempt and tool version on the task, and the job out of its
   * principal's waiting share of the pool (§25). The task when its tool is to run; undefined when the task is missing
   * or already ended (a cancelled one's batch is stopped and its tool told, §12.8).
   */
  private async recordStart(
    run: RunScope,
    parsed: ParsedJobData,
    queueTimeoutMs: number,
  ): Promise<TaskRecord | undefined> {
    const { job, taskId, lock, log } = run;
    const attempt = attemptOf(job);
    const deadlineAt = this.runDeadline(parsed, queueTimeoutMs);
    // Taken: the job no longer counts in its principal's waiting share of the pool (§25), whatever happens next. A
    // gateway's job names its principal, so the start script leaves the share in the same round trip.
    const jobPrincipal = parsed.success ? parsed.data.principal : undefined;
    // The run records the tool version it runs, and does not start a task another version ran (§12.11).
    const versioned = parsed.success ? this.o.tools.get(parsed.data.tool) : undefined;
    const version = { toolVersion: versioned?.version ?? '', deferIfOther: versioned !== undefined };
    let started = await bookkeeping(this.o.store.startRun(taskId, lock, attempt, deadlineAt, jobPrincipal, version));
    if (!started.lockLost && started.versionOther !== undefined && versioned !== undefined) {
      const policy = await this.versionChange(run, versioned, started.versionOther);
      started = await bookkeeping(
        this.o.store.startRun(taskId, lock, attempt, deadlineAt, jobPrincipal, {
          toolVersion: versioned.version,
          reset: policy === 'restart',
        }),
      );
    }
    if (started.lockLost) {
      log.warn('job lock already lost at start; tool not run');
      throw new DelayedError();
    }
    const task = started.record;
    // A job without its principal (or naming another than its task's) leaves the task principal's share here.
    const sharePrincipal = task?.principal !== jobPrincipal ? task?.principal : undefined;
    if (sharePrincipal !== undefined) {
      this.o.fairShare.leave(lock.queue, sharePrincipal, taskId).catch((error: unknown) => {
        log.debug({ err: error }, 'fair-share entry not removed');
      });
    }
    if (!task || isTerminal(task.status)) {
      log.info({ status: task?.status ?? 'missing' }, 'task is missing or already terminal; tool not run');
      if (task?.status === 'cancelled') {
        await this.stopBatch(taskId, log);
        await this.notifyCancelled(job, task, log);
      }
      return undefined;
    }
    return task;
  }

  /** A takeover after a crash re-queues the job: a run's deadline covers it, the takeover and the queue again. */
  private runDeadline(parsed: ParsedJobData, queueTimeoutMs: number): number {
    const timeoutHint = parsed.success ? parsed.data.timeoutMs : undefined;
    return Date.now() + Math.min(timeoutHint ?? MAX_TIMER_MS, MAX_TIMER_MS) + this.o.lockDurationMs + queueTimeoutMs;
  }

  /**
   * A first run's start, sent now and not awaited (PROTOCOL.md §21.2.1), or undefined when this run awaits its start
   * before its tool as every other does: BullMQ's first fetch of the job, data naming its principal and a tool served
   * here without per-key or shared limits, and the job younger than half its queue timeout, so the reaper's creation
   * deadline is far off.
   */
  private pipelineStart(run: RunScope, parsed: ParsedJobData, queueTimeoutMs: number): FirstRunStart | undefined {
    const { job, taskId, lock, log } = run;
    if (job.attemptsStarted !== 1 || !parsed.success) return undefined;
    const { principal, tool: toolName } = parsed.data;
    const tool = this.o.tools.get(toolName);
    if (principal === undefined || parsed.data.taskId !== taskId || !tool || tool.admitted.rate || tool.admitted.slot) {
      return undefined;
    }
    const now = Date.now();
    if (now - job.timestamp - (job.opts.delay ?? 0) > queueTimeoutMs / 2) return undefined;
    return new FirstRunStart({
      store: this.o.store,
      running: this.o.running,
      log,
      outageWindowMs: bullLockMs(this.o.lockDurationMs),
      start: {
        taskId,
        lock,
        attempt: attemptOf(job),
        deadlineAt: this.runDeadline(parsed, queueTimeoutMs),
        sharePrincipal: principal,
        // A task that never ran records no version: this run's is recorded, no other to defer to (§12.11).
        version: { toolVersion: tool.version ?? '' },
        startedAt: new Date(now),
      },
    });
  }

  /**
   * A terminal write of this run, sent at once: a first run's start went before it on the same connection, so Redis
   * runs it after the start (§21.2.1), and its answer is read with the start's. A start refused for a lost lock reads
   * as the write's; a task gone reads as `status` undefined.
   */
  private async writeEnd(
    run: Pick<RunScope, 'taskId' | 'lock' | 'start' | 'log'>,
    to: TaskStatus,
    fields: TransitionFields,
  ): Promise<TransitionOutcome> {
    const start = run.start?.beforeEnd();
    // Redis unreachable (a failover) is waited out while the lock may still be this run's (§10.10): the outcome is
    // kept, not dropped for a re-run once the lock expires.
    const retry = { windowMs: bullLockMs(this.o.lockDurationMs), log: run.log, what: WRITTEN_AS[to] ?? to };
    const written = writeThroughOutage(
      () => bookkeeping(this.o.store.transition(run.taskId, to, fields, { lock: run.lock })),
      retry,
    );
    if (!start) return written;
    const [started, outcome] = await Promise.all([start, written]);
    if (!started.ok && started.lockLost) return { ok: false, status: undefined, lockLost: true };
    return outcome;
  }

  /**
   * The checks before the tool runs: the job's data names its task, its tool is served here, it has not stalled too
   * often, and its arguments fit the tool's schema. A failed check fails the task; the job ends unrecoverably.
   */
  private async checkJob(
    run: RunScope,
    parsed: ParsedJobData,
  ): Promise<{ data: JobData; tool: ToolDefinition; input: Record<string, unknown> }> {
    const { job, taskId } = run;
    if (!parsed.success || parsed.data.taskId !== taskId) {
      const unreadable = (job.data as Record<string, unknown> | null | undefined)?.[UNREADABLE_JOB_DATA];
      const message = parsed.success
        ? `Invalid job data: taskId ${parsed.data.taskId} does not match job id ${taskId}`
        : `Invalid job data: ${typeof unreadable === 'string' ? unreadable : describeIssues(parsed.error)}`;
      return this.failJob(run, 'INTERNAL', message);
    }
    const { tool: toolName, arguments: args } = parsed.data;

    const tool = this.o.tools.get(toolName);
    if (!tool) {
      const message = `Tool ${toolName} is not served by worker ${this.o.workerId} (queue ${queueOfBullName(job.queueName)})`;
      return this.failJob(run, 'TOOL_NOT_FOUND', message);
    }

    // A crash is not the tool's fault, but a job that keeps killing its workers must stop somewhere (§10.6).
    if (job.stalledCounter > tool.maxStalls) {
      const message =
        `The worker running this task stopped responding ${job.stalledCounter} times (crashed or lost its lock); ` +
        `giving up (maxStalls ${tool.maxStalls})`;
      return this.failJob(run, 'JOB_LOST', message);
    }

    const input = tool.inputSchema.safeParse(args);
    if (!input.success) {
      const message = `Invalid arguments for tool ${tool.name}: ${describeIssues(input.error)}`;
      return this.failJob(run, 'INVALID_ARGUMENTS', message);
    }
    return { data: parsed.data, tool, input: input.data };
  }

  /**
   * Runs the tool under its timeout. The timeout fails the task when it fires, not when the tool gets round to
   * returning: a tool that ignores its signal must not keep the caller waiting.
   */
  private async runTool(
    run: RunScope,
    controller: AbortController,
    tool: ToolDefinition,
    input: Record<string, unknown>,
    ctx: TaskContext,
    timeoutMs: number | undefined,
  ): Promise<{ outcome: RunOutcome; timeout: RunTimeout }> {
    const { log } = run;
    const timeout: RunTimeout = { message: `Tool ${tool.name} timed out after ${timeoutMs ?? 0} ms` };
    const onTimeout = () => {
      // A run that suspended is over: its time no longer counts (§12.7).
      if (controller.signal.aborted || ctx.suspension) return;
      log.info({ reason: 'TIMEOUT', timeoutMs }, 'tool timed out; aborting it');
      controller.abort('TIMEOUT' satisfies CancelReason);
      ctx.close();
      const error: SerializedError = { code: 'TIMEOUT', message: timeout.message };
      timeout.failed = this.failTask(run, timeout.message, error).catch((cause: unknown) => {
        log.error({ err: cause }, 'could not record the timeout');
      });
    };
    const outcome = await runUnderTimeout(controller.signal, timeoutMs, onTimeout, () => {
      log.info({ timeoutMs, ...(tool.isolation ? { isolate: tool.isolation.mode } : {}) }, 'tool started');
      return callTool(tool, input, ctx, log);
    });
    return { outcome, timeout };
  }

  /** Carries out what `settle` decided (§21.3): what the task records, and how the job ends. */
  private async carryOut(action: SettleAction, end: RunEnd): Promise<void> {
    const { ctx, log } = end;
    switch (action.kind) {
      case 'hand_back':
        ctx.close();
        // Another run may own the task now: write nothing more. Handing the job back only works if the lock was still
        // ours after all (a watchdog that fired during a Redis outage); otherwise the new owner keeps it.
        if (action.reason === 'LOCK_LOST') {
          log.warn(
            { reason: action.reason, returned: end.outcome.ok },
            'run ended after losing the job lock; nothing recorded',
          );
        } else {
          await this.sayHandedBack(end);
        }
        return this.handBack(end.job, end.token, log, action.reason);
      case 'timed_out':
        ctx.close();
        if (action.discarded) log.info('tool returned after its timeout; result discarded');
        await end.timeout.failed;
        throw new UnrecoverableError(end.timeout.message);
      case 'cancelled':
        ctx.close();
        if (action.discarded) log.info('tool returned after its task was cancelled; result discarded');
        await this.ensureCancelled(end);
        // A parent cancelled during its run (releasing, say) has no later run to stop its children: this one does.
        await this.stopBatch(end.taskId, log);
        // The job ends done, not failed: a cancel is no failure, never retries, and its job is removed at once.
        return;
      case 'ended_by_gateway':
        ctx.close();
        log.info({ reason: 'GATEWAY_SHUTDOWN' }, 'tool stopped: the gateway holding its call shut down');
        // The job ends here; a first run's start, awaited as the run ends, took it out of its principal's waiting share
        // (§21.2.1, §25).
        return;
      case 'suspend': {
        const suspension = ctx.suspension as Suspension;
        await ctx.flushProgress();
        ctx.close();
        if (action.wentOn) log.warn('tool went on after its run suspended; what it returned or threw is discarded');
        return this.suspendJob(end.job, end.token, end.taskId, suspension, log);
      }
      case 'complete':
        return this.complete(action.value, end);
      case 'back_off':
        return this.backOff(action, end);
      case 'fail':
      case 'retry':
        await ctx.flushProgress();
        ctx.close();
        return this.endFailed(action, end);
    }
  }

  /** The tool returned: the value is the task's result, or (not a valid result) the run's failure. */
  private async complete(value: unknown, end: RunEnd): Promise<void> {
    const { ctx, log } = end;
    let result: ToolResult;
    try {
      // Large parts go by reference (§34.3); past a stored-bytes bound that is the run's failure, not retried
      // (StoredBytesLimitError is a NonRetryableError).
      result = await ctx.finishResult(toToolResult(end.tool, value));
    } catch (error) {
      await ctx.flushProgress();
      ctx.close();
      return this.endFailed(failOrRetry(error, end.retry), end);
    }
    await ctx.flushProgress();
    ctx.close();
    const written = await this.writeEnd(end, 'completed', { result });
    if (written.ok) log.info('task completed');
    else if (written.lockLost) this.lostWhileWriting(log, 'result');
    else log.info({ status: written.status ?? 'missing' }, 'task already terminal; result discarded');
  }

  /**
   * The upstream asked to come back later (§3.4): the task stays `working` and says until when, and the job waits in
   * the delayed set, holding no slot and using no attempt.
   */
  private async backOff(action: Extract<SettleAction, { kind: 'back_off' }>, end: RunEnd): Promise<void> {
    const { ctx, tool, log } = end;
    await ctx.flushProgress();
    ctx.close();
    // The wait is a later fetch, which starts as any other: this run's start is recorded first (§21.2.1).
    await end.start?.ensure();
    const until = Date.now() + action.ms;
    const statusMessage = `Backing off until ${new Date(until).toISOString()}: ${action.message}`;
    const held = await bookkeeping(
      this.o.store.suspend(end.taskId, end.lock, { deadlineAt: until + end.queueTimeoutMs, statusMessage }),
    );
    if (held.outcome === 'lock_lost') this.lostWhileWriting(log, 'back-off');
    if (held.outcome === 'gone') {
      log.info({ status: held.status ?? 'missing' }, 'task ended meanwhile; no back-off');
      return;
    }
    log.info({ retryAfterMs: action.ms, until }, 'upstream asked to retry later; the run ends, holding no slot');
    this.o.metrics.backOffs.inc({ tool: tool.name });
    // The upstream said so to every tool that shares the tool's own rate limit (§3.5).
    await this.o.limits?.hold(tool, end.args, end.principal, action.ms).catch((error: unknown) => {
      log.warn({ err: error }, 'could not hold the shared rate limit');
    });
    return this.suspendJob(end.job, end.token, end.taskId, { kind: 'time', until }, log);
  }

  /**
   * The task last ran another version of the tool (PROTOCOL.md §12.11). While a live worker of that version serves
   * the tool (and for at most the lock duration from the first deferral), the job is left to it: back to the delayed
   * set for a moment, no attempt used. Otherwise the tool's `onVersionChange` decides: `resume` and `restart` return
   * (the caller starts the run, `restart` clearing the task's state, steps and answers); `fail` fails the task.
   */
  private async versionChange(run: RunScope, tool: ToolDefinition, recorded: string): Promise<'resume' | 'restart'> {
    const { job, token, taskId, log } = run;
    const versions = { from: recorded, to: tool.version };
    const versionsOf = this.o.versions;
    if (
      versionsOf !== undefined &&
      (await bookkeeping(versionsOf.liveWorkerServes(tool.name, recorded))) &&
      (await bookkeeping(versionsOf.withinWindow(taskId)))
    ) {
      try {
        await job.moveToDelayed(Date.now() + VERSION_DEFER_MS, token);
        log.info(versions, 'task last ran another tool version, which a live worker serves: left to it');
      } catch (error) {
        log.info({ err: error }, 'job not deferred (its lock is gone); it is with, or returns to, the queue');
      }
      throw new DelayedError();
    }
    const policy = tool.onVersionChange;
    if (policy === 'fail') {
      const message =
        `Task ${taskId} started on tool ${tool.name} version ${recorded}; this worker runs version ${tool.version} ` +
        '(onVersionChange: fail)';
      return this.failJob(run, 'VERSION_CHANGED', message);
    }
    log.warn(
      { ...versions, onVersionChange: policy },
      policy === 'restart'
        ? 'task last ran another tool version: restarting it from the top (state, steps and answers cleared)'
        : 'task last ran another tool version: resuming it with its state, steps and answers',
    );
    return policy;
  }

  /** A failed run: the task fails and the job ends unrecoverably, or the job is left to BullMQ's retry. */
  private async endFailed(action: Extract<SettleAction, { kind: 'fail' | 'retry' }>, run: RunScope): Promise<never> {
    const { error } = action;
    const { job, log } = run;
    if (action.kind === 'fail') {
      const serialized = serializeError(error);
      await this.failTask(run, serialized.message, serialized, error);
      throw new UnrecoverableError(serialized.message);
    }
    // The next run starts before its tool (it is no first fetch): this one's start is recorded now (§21.2.1).
    await run.start?.ensure();
    log.warn(
      { err: error, attempts: job.opts.attempts ?? 1, attemptsMade: job.attemptsMade + 1 },
      'tool failed; the job will be retried',
    );
    throw error instanceof Error ? error : new Error(serializeError(error).message);
  }

  /**
   * The run suspended (PROTOCOL.md §12): the job goes to BullMQ's delayed set, holding no slot, until its answer
   * promotes it or the time is up. No attempt is used. Then the no-lost-wake-up check of §12.4.
   */
  private async suspendJob(
    job: Job<unknown, void>,
    token: string | undefined,
    taskId: string,
    suspension: Suspension,
    log: Logger,
  ): Promise<never> {
    // An input wait is delayed past its deadline, so the reaper (not a replay) ends a task nobody answers.
    const until = suspension.kind === 'input' ? suspension.until + this.o.lockDurationMs : suspension.until;
    try {
      await job.moveToDelayed(until, token);
    } catch (error) {
      log.info(
        { err: error },
        'suspended job not delayed (its lock is gone); it is already with, or returns to, the queue',
      );
      throw new DelayedError();
    }
    if (suspension.kind === 'input') {
      try {
        const task = await this.o.store.get(taskId);
        // Every request answered (or the task ended) while the run was suspending: nobody else will promote it.
        if (!task || task.status !== 'input_required') {
          await job.promote();
          log.info({ inputRequest: suspension.n }, 'answered (or ended) while suspending; job promoted');
          throw new DelayedError();
        }
      } catch (error) {
        if (error instanceof DelayedError) throw error;
        // Not fatal: the gateway's promote after the answer, or the delay, brings the job back.
        log.warn({ err: error }, 'could not re-check the task after suspending');
      }
      log.info({ inputRequest: suspension.n, until }, 'run suspended until the input request is answered');
    } else if (suspension.batch && this.o.batches) {
      // Its children may all have finished while it suspended, their promotions refused (it was still active).
      try {
        if (await this.o.batches.parent.shouldWake(taskId)) {
          await job.promote();
          log.info('batch children done while suspending; job promoted');
          throw new DelayedError();
        }
      } catch (error) {
        if (error instanceof DelayedError) throw error;
        log.warn({ err: error }, 'could not re-check the batch after suspending; the poll brings the job back');
      }
      log.debug({ until }, 'run suspended while its batch children run');
    } else if (suspension.waitpoint !== undefined) {
      await this.wakeIfCalled(job, taskId, suspension.waitpoint, log);
      log.info({ waitpoint: suspension.waitpoint, until }, 'run suspended until its waitpoint is called');
    } else {
      log.info({ until }, 'run suspended');
    }
    throw new DelayedError();
  }

  /**
   * No lost wake-up (PROTOCOL.md §32.3): a waitpoint called while its run was suspending had its promotion refused
   * (the job was still active), so the run promotes its own job.
   */
  private async wakeIfCalled(job: Job<unknown, void>, taskId: string, name: string, log: Logger): Promise<void> {
    try {
      if ((await this.o.store.readWaitpoint(taskId, name))?.state !== 'waiting') {
        await job.promote();
        log.info({ waitpoint: name }, 'waitpoint called (or ended) while suspending; job promoted');
        throw new DelayedError();
      }
    } catch (error) {
      if (error instanceof DelayedError) throw error;
      log.warn({ err: error }, 'could not re-check the waitpoint after suspending; its timeout brings the job back');
    }
  }

  /**
   * Asks the tool's own limits (§3.5) whether the run may start. A key function that throws fails the task (the
   * tool's definition is at fault, and no retry would change it); Redis lost is the envelope's (a hand-back).
   */
  private async admit(
    run: RunScope,
    tool: ToolDefinition,
    args: Record<string, unknown>,
    entry: RunningJob,
  ): Promise<LimitWait | undefined> {
    if (!this.o.limits) return undefined;
    try {
      return await this.o.limits.admit(tool, args, run.job, entry);
    } catch (error) {
      if (isRedisUnavailableError(error)) throw error;
      return this.failJob(run, 'INTERNAL', error instanceof Error ? error.message : String(error));
    }
  }

  /** The run waits for its tool's limit (§3.5): the task stays `working` and says why, the job waits delayed. */
  private async waitForLimit(w: {
    job: Job<unknown, void>;
    token: string | undefined;
    taskId: string;
    lock: JobLock;
    wait: LimitWait;
    queueTimeoutMs: number;
    log: Logger;
  }): Promise<void> {
    const until = Date.now() + w.wait.waitMs;
    const held = await bookkeeping(
      this.o.store.suspend(w.taskId, w.lock, {
        deadlineAt: until + w.queueTimeoutMs,
        statusMessage: w.wait.message,
      }),
    );
    if (held.outcome === 'lock_lost') this.lostWhileWriting(w.log, 'limit wait');
    if (held.outcome === 'gone') {
      w.log.info({ status: held.status ?? 'missing' }, 'task ended meanwhile; no limit wait');
      return;
    }
    return this.o.limits?.delay(w.job, w.token, w.wait, w.log);
  }

  /** A cancelled parent's run removes its queued children and aborts its running ones (§26.7); no batch, no-op. */
  private async stopBatch(taskId: string, log: Logger): Promise<void> {
    await this.o.batches?.parent.stopChildren(taskId).catch((error: unknown) => {
      log.warn({ err: error }, 'could not stop the batch children of a cancelled task');
    });
  }

  /**
   * The run of a task cancelled while no run held it (PROTOCOL.md §12.8): the tool's `onCancelled` stops what earlier
   * runs started outside, when they stored anything to find it by. Its failure is logged; the job ends either way.
   */
  private async notifyCancelled(job: Job<unknown, void>, task: TaskRecord, log: Logger): Promise<void> {
    const parsed = JobDataSchema.safeParse(job.data);
    if (!parsed.success) return;
    const tool = this.o.tools.get(parsed.data.tool);
    const steps = task.steps ?? {};
    if (!tool?.onCancelled || (Object.keys(steps).length === 0 && task.state === undefined)) return;
    try {
      await tool.onCancelled({ taskId: task.taskId, arguments: parsed.data.arguments, steps, state: task.state, log });
      log.info('onCancelled ran for a task cancelled between runs');
    } catch (error) {
      log.warn({ err: error }, 'onCancelled failed');
    }
  }

  /**
   * A task whose run goes back for another worker says so until its next run starts (whose start clears it), instead
   * of its last run's progress message (issue 48 P2, PROTOCOL.md §5.7). Under the lock, before the job leaves it; a
   * failed write costs only the message.
   */
  private async sayHandedBack(end: RunEnd): Promise<void> {
    await this.o.store
      .suspend(end.taskId, end.lock, {
        deadlineAt: Date.now() + end.queueTimeoutMs,
        statusMessage: HANDED_BACK_MESSAGE,
      })
      .catch((error: unknown) => end.log.debug({ err: error }, 'could not say that the task waits to be resumed'));
  }

  private handBack(
    job: Job<unknown, void>,
    token: string | undefined,
    log: Logger,
    reason?: CancelReason,
  ): Promise<never> {
    return this.o.envelope.handBack(job, token, log, reason);
  }

  /** A check before the tool ran failed: the task fails with `code`, and the job ends without a retry. */
  private async failJob(run: RunScope, code: SerializedError['code'], message: string): Promise<never> {
    await this.failTask(run, message, { code, message });
    throw new UnrecoverableError(message);
  }

  private async failTask(run: RunScope, message: string, error: SerializedError, cause?: unknown): Promise<void> {
    const { log } = run;
    // A JSON-RPC error is no tool result: the task carries the error alone (PROTOCOL.md §13).
    const fields =
      error.code === 'PROTOCOL_ERROR'
        ? { statusMessage: message, error }
        : {
            statusMessage: message,
            result: { content: [{ type: 'text', text: message }], isError: true } satisfies ToolResult,
            error,
          };
    const written = await this.writeEnd(run, 'failed', fields);
    if (written.ok) log.info({ code: error.code, err: cause, statusMessage: message }, 'task failed');
    else if (written.lockLost) this.lostWhileWriting(log, 'failure');
    else
      log.info({ status: written.status ?? 'missing', statusMessage: message }, 'task already terminal; failure lost');
  }

  /** The gateway cancels the task before it publishes; this only covers an abort that did not come from it. */
  private async ensureCancelled(run: RunScope): Promise<void> {
    const { log } = run;
    const written = await this.writeEnd(run, 'cancelled', {
      cancelReason: 'CLIENT_CANCELLED',
      statusMessage: 'Cancelled',
    });
    if (written.ok) log.info('task was not terminal; marked cancelled');
    else if (written.lockLost) this.lostWhileWriting(log, 'cancel');
    else log.info({ status: written.status ?? 'missing' }, 'tool stopped; task already terminal');
  }

  /** A terminal write was refused: another run holds the job. Nothing is recorded; BullMQ must not finish the job. */
  private lostWhileWriting(log: Logger, what: string): never {
    log.warn(
      { reason: 'LOCK_LOST' },
      `${what} refused: this worker no longer holds the job; another run owns the task`,
    );
    throw new DelayedError();
  }
}

/** The gateway-side fields of a job (principal, session, request), for log lines; absent ones are left out. */
function correlationOf(job: Job<unknown, void>): Record<string, string> {
  const data = (job.data ?? {}) as Record<string, unknown>;
  const fields: Record<string, string> = {};
  for (const key of ['principal', 'sessionId', 'requestId'] as const) {
    if (typeof data[key] === 'string') fields[key] = data[key];
  }
  return fields;
}

/** Runs started for the job, this one included (BullMQ counts every move to active). */
function attemptOf(job: Job<unknown, void>): number {
  return Math.max(1, job.attemptsStarted || job.attemptsMade + 1);
}

/** Marks a failure of the worker's own Redis bookkeeping (as opposed to the tool's) as REDIS_UNAVAILABLE. */
async function bookkeeping<T>(write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (error) {
    if (isRedisUnavailableError(error)) {
      throw new TaskrelayError('REDIS_UNAVAILABLE', 'Redis is unreachable', { cause: error });
    }
    throw error;
  }
}

function minDefined(a: number | undefined, b: number | undefined): number | undefined {
  if (a === undefined) return b;
  return b === undefined ? a : Math.min(a, b);
}

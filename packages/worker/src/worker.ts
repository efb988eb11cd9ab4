import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import { z } from 'zod';
import {
  CancelRequestSchema,
  ConfigError,
  JobDataSchema,
  NonRetryableError,
  RedisTaskStore,
  TaskrelayError,
  createKeys,
  createLogger,
  createRedis,
  isRedisUnavailableError,
  isTerminal,
  parseMessage,
  serializeError,
  type CancelReason,
  type JobLock,
  type Keys,
  type Logger,
  type Redis,
  type SerializedError,
  type TaskRecord,
  type ToolDescriptor,
  type ToolResult,
  type WorkerCatalog,
  withJobSpan,
  isClusterPrefix,
  isRedisTarget,
  toolPool,
} from '@taskrelay/shared';
import { TaskContext, type Suspension } from './context.js';
import { describeIssues, isToolDefinition, toToolResult, type ToolDefinition } from './define-tool.js';
import { SuspendedError, cancelReasonOf } from './errors.js';
import { WorkerMetrics } from './metrics.js';

/** Options of `startWorker`. Only `tools` and a Redis URL are required. */
export interface WorkerOptions {
  /**
   * Redis URL: `redis://host:port/db`, `rediss://` for TLS, `redis+cluster://host:port,host:port` for a Redis Cluster
   * (then `prefix` must be wrapped in `{}`), or `redis+sentinel://host:port,host:port/<master name>`. Required unless
   * `connection` is given.
   */
  redisUrl?: string;
  /** The Redis URL under BullMQ's name for it; used when `redisUrl` is not given. */
  connection?: string;
  /** Prefix of every Redis key, channel and BullMQ queue; must match the gateway's. Default `'taskrelay'`. */
  prefix?: string;
  /** The tools this worker serves (from `defineTool`). At least one; names must be unique. */
  tools: readonly ToolDefinition[];
  /**
   * The name of this worker's pool. The BullMQ queue it consumes is this name plus a digest of its tool names, so
   * workers with different tool sets never share a queue, whatever this says; the gateway routes each call to the pool
   * of a live worker that serves the tool. Default `'default'`.
   */
  queue?: string;
  /** Jobs run at once by this worker. Default `8`. */
  concurrency?: number;
  /**
   * How soon the job of a crashed worker is taken over by another: BullMQ's lock is two thirds of it (renewed every
   * third) and the stalled check runs every sixth, so a dead worker's job is back in the queue within five sixths
   * (PROTOCOL.md §10.5). Default `30000` (30 s).
   */
  lockDurationMs?: number;
  /**
   * How long `close()` lets running tools finish before aborting them with `WORKER_SHUTDOWN` and handing their jobs
   * back (`WORKER_SHUTDOWN_GRACE_MS`). Default `30000` (30 s).
   */
  shutdownGraceMs?: number;
  /** How often the tool catalog is refreshed; it expires after three missed heartbeats. Default `5000` (5 s). */
  heartbeatMs?: number;
  /** Per-task progress throttle: at most one progress write per this many ms, newest value wins. Default `50`. */
  progressIntervalMs?: number;
  /** A warning is logged when a tool is still running this long after its signal aborted. Default `5000` (5 s). */
  abortGraceMs?: number;
  /**
   * How often the status of every running task is re-read, so a missed cancel message still aborts its tool.
   * Default `2000` (2 s).
   */
  cancelSweepMs?: number;
  /** This worker's id in the catalog. Default `<hostname>-<pid>-<random hex>`. */
  workerId?: string;
  /** pino logger. Default: `createLogger('worker')` (JSON lines on stdout, level from `LOG_LEVEL`). */
  logger?: Logger;
  /** Where this worker counts its runs, waits, cancels and slots. Default: a new `WorkerMetrics` of its own. */
  metrics?: WorkerMetrics;
}

/** `WorkerOptions` with every default applied. */
export interface ResolvedWorkerOptions {
  redisUrl: string;
  prefix: string;
  tools: ToolDefinition[];
  queue: string;
  concurrency: number;
  lockDurationMs: number;
  shutdownGraceMs: number;
  heartbeatMs: number;
  progressIntervalMs: number;
  abortGraceMs: number;
  cancelSweepMs: number;
  workerId: string;
  logger: Logger;
  metrics: WorkerMetrics;
}

export interface CloseOptions {
  /**
   * How long running tools may take to finish before they are aborted with `WORKER_SHUTDOWN` (their jobs go back to
   * the queue for another worker, without using up an attempt). Default: the worker's `shutdownGraceMs`.
   */
  graceMs?: number;
}

/** A running worker. */
export interface WorkerHandle {
  readonly workerId: string;
  /** The pool this worker consumes: its `queue` option plus a digest of its tool names (PROTOCOL.md §3.2). */
  readonly queue: string;
  /**
   * Stops the heartbeat (the catalog is removed), stops taking jobs, waits up to `graceMs` for running tools, aborts
   * the rest with `WORKER_SHUTDOWN`, then closes every Redis connection. Safe to call more than once.
   */
  close(options?: CloseOptions): Promise<void>;
}

const redisUrlSchema = z
  .string()
  .trim()
  .refine((v) => isRedisTarget(v), {
    message: 'must be a redis://, rediss://, redis+cluster:// or redis+sentinel:// target',
  });

const ms = (min: number) =>
  z
    .number()
    .int()
    .min(min, { message: `must be a whole number of ms, at least ${min}` });

const WorkerOptionsSchema = z
  .strictObject({
    redisUrl: redisUrlSchema.optional(),
    connection: redisUrlSchema.optional(),
    prefix: z.string().trim().regex(/^\S+$/, { message: 'must be non-empty without spaces' }).default('taskrelay'),
    tools: z
      .array(z.custom<ToolDefinition>(isToolDefinition, { message: 'must hold tool definitions made by defineTool' }))
      .min(1, { message: 'must list at least one tool' }),
    queue: z
      .string()
      .trim()
      .regex(/^[A-Za-z0-9_.-]+$/, { message: 'must be letters, digits, _ . or -' })
      .default('default'),
    concurrency: z.number().int().min(1, { message: 'must be a whole number, at least 1' }).default(8),
    lockDurationMs: ms(100).default(30_000),
    shutdownGraceMs: ms(0).default(30_000),
    heartbeatMs: ms(10).default(5_000),
    progressIntervalMs: ms(0).default(50),
    abortGraceMs: ms(0).default(5_000),
    cancelSweepMs: ms(10).default(2_000),
    workerId: z.string().trim().regex(/^\S+$/, { message: 'must be non-empty without spaces' }).optional(),
    logger: z
      .custom<Logger>((v) => typeof v === 'object' && v !== null && typeof (v as Logger).child === 'function', {
        message: 'must be a pino logger',
      })
      .optional(),
    metrics: z.instanceof(WorkerMetrics, { message: 'must be a WorkerMetrics' }).optional(),
  })
  .refine((o) => o.redisUrl !== undefined || o.connection !== undefined, {
    message: 'is required (redisUrl or connection)',
    path: ['redisUrl'],
  })
  .refine((o) => !(o.redisUrl ?? o.connection ?? '').startsWith('redis+cluster:') || isClusterPrefix(o.prefix), {
    message: 'must be wrapped in {} on a Redis Cluster (one hash slot for every key), e.g. {taskrelay}',
    path: ['prefix'],
  });

/** Applies the defaults of `WorkerOptions`; throws a one-line `ConfigError` for anything invalid. */
export function resolveWorkerOptions(options: WorkerOptions): ResolvedWorkerOptions {
  const parsed = WorkerOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue?.path.map(String).join('.') || 'options';
    throw new ConfigError(`Invalid worker options: ${field} ${issue?.message ?? 'is invalid'}`);
  }
  const o = parsed.data;
  const names = new Set<string>();
  for (const tool of o.tools) {
    if (names.has(tool.name)) throw new ConfigError(`Invalid worker options: two tools are named "${tool.name}"`);
    names.add(tool.name);
  }
  return {
    redisUrl: o.redisUrl ?? o.connection ?? '',
    prefix: o.prefix,
    tools: o.tools,
    queue: o.queue,
    concurrency: o.concurrency,
    lockDurationMs: o.lockDurationMs,
    shutdownGraceMs: o.shutdownGraceMs,
    heartbeatMs: o.heartbeatMs,
    progressIntervalMs: o.progressIntervalMs,
    abortGraceMs: o.abortGraceMs,
    cancelSweepMs: o.cancelSweepMs,
    workerId: o.workerId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
    logger: o.logger ?? createLogger('worker'),
    metrics: o.metrics ?? new WorkerMetrics(),
  };
}

/**
 * Starts a worker: consumes its queue, serves cancels, and publishes its tool catalog (once before this resolves, so
 * a gateway sees the tools at once).
 */
export async function startWorker(options: WorkerOptions): Promise<WorkerHandle> {
  const worker = new TaskWorker(resolveWorkerOptions(options));
  await worker.start();
  return { workerId: worker.workerId, queue: worker.queue, close: (closeOptions) => worker.close(closeOptions) };
}

/** One running job: its abort controller and the grace timer armed when it aborts. */
interface RunningJob {
  readonly controller: AbortController;
  graceTimer: NodeJS.Timeout | undefined;
  /** Whom the task belongs to, for the cancel log lines (known once the task is read). */
  principal?: string;
  /** When BullMQ last renewed (or took) this job's lock: the lock watchdog's clock (PROTOCOL.md §10.4). */
  lockRenewedAt: number;
  /** When its signal aborted (the cancel-latency clock). */
  abortedAt?: number;
}

type RunOutcome = { ok: true; value: unknown } | { ok: false; error: unknown };

/** setTimeout's ceiling; a longer timeout would fire at once. */
const MAX_TIMER_MS = 2_147_483_647;
/** Worker ids whose heartbeat expired this long ago are pruned from the live set by any worker. */
const PRUNE_DEAD_WORKERS_AFTER_MS = 3_600_000;
/** BullMQ fails a job that stalled more than this; out of reach, since each tool has its own `maxStalls` (§10.6). */
const BULLMQ_MAX_STALLED = 1_000_000_000;
/** How long a job may wait in the queue when its data does not say (the gateway's default). */
const DEFAULT_QUEUE_TIMEOUT_MS = 3_600_000;

/** The engine behind `startWorker` (PROTOCOL.md §3, §5, §7). */
class TaskWorker {
  readonly workerId: string;
  readonly queue: string;

  private readonly options: ResolvedWorkerOptions;
  private readonly keys: Keys;
  private readonly log: Logger;
  private readonly tools: Map<string, ToolDefinition>;
  private readonly descriptors: ToolDescriptor[];
  private readonly running = new Map<string, RunningJob>();
  private readonly redis: Redis;
  private readonly subscriber: Redis;
  private readonly bullConnection: Redis;
  private readonly store: RedisTaskStore;
  private readonly metrics: WorkerMetrics;
  private bullWorker: Worker | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private watchdogTimer: NodeJS.Timeout | undefined;
  /** BullMQ's own lock duration, derived from `lockDurationMs` (§10.5). */
  private readonly bullLockMs: number;
  private heartbeatInFlight: Promise<void> | undefined;
  private sweeping = false;
  private subscriberReadyBefore = false;
  private closing = false;
  private closed: Promise<void> | undefined;

  constructor(options: ResolvedWorkerOptions) {
    this.options = options;
    this.workerId = options.workerId;
    // The BullMQ queue is the pool of this tool set (PROTOCOL.md §3.2), never the bare name: a worker only takes jobs of
    // tools it serves.
    this.queue = toolPool(
      options.queue,
      options.tools.map((tool) => tool.name),
    );
    this.keys = createKeys(options.prefix);
    this.log = options.logger.child({ workerId: options.workerId, queue: options.queue });
    this.metrics = options.metrics;
    this.metrics.watchSlots(() => this.running.size, options.concurrency);
    this.tools = new Map(options.tools.map((tool) => [tool.name, tool]));
    this.descriptors = options.tools.map((tool) => tool.descriptor);
    this.redis = this.connect('commands');
    this.subscriber = this.connect('cancel');
    this.bullConnection = this.connect('bullmq');
    this.store = new RedisTaskStore(this.redis, this.keys);
    this.bullLockMs = Math.max(100, Math.round((options.lockDurationMs * 2) / 3));
  }

  async start(): Promise<void> {
    try {
      this.subscriber.on('message', (channel: string, raw: string) => this.onCancelMessage(channel, raw));
      this.subscriber.on('ready', () => {
        // ioredis re-subscribes by itself after a reconnect; what we may have missed meanwhile is read from the hashes.
        if (this.subscriberReadyBefore) {
          this.log.info('cancel subscriber reconnected; re-reading the status of running tasks');
          void this.sweep();
        }
        this.subscriberReadyBefore = true;
      });
      await this.subscriber.subscribe(this.keys.cancelChannel);

      const worker = new Worker<unknown, void>(this.keys.queueName(this.queue), this.process, {
        connection: this.bullConnection,
        prefix: this.keys.bullPrefix,
        concurrency: this.options.concurrency,
        // Lock 2L/3, renewed every L/3, stalled check every L/6: a dead worker's job is re-queued within 5L/6.
        lockDuration: this.bullLockMs,
        stalledInterval: Math.max(50, Math.round(this.options.lockDurationMs / 6)),
        maxStalledCount: BULLMQ_MAX_STALLED,
        name: this.workerId,
      });
      this.bullWorker = worker;
      worker.on('error', (error) => this.log.warn({ err: error }, 'BullMQ worker error'));
      worker.on('stalled', (jobId) =>
        this.log.warn({ taskId: jobId }, 'job stalled: the worker running it stopped renewing its lock; re-queued'),
      );
      worker.on('locksRenewed', ({ jobIds }) => {
        const now = Date.now();
        for (const id of jobIds) {
          const entry = this.running.get(id);
          if (entry) entry.lockRenewedAt = now;
        }
      });
      worker.on('lockRenewalFailed', (jobIds) => {
        for (const id of jobIds) this.loseLock(id, 'lock renewal refused');
      });
      await worker.waitUntilReady();

      await this.publishCatalog();
      this.heartbeatTimer = setInterval(() => this.heartbeat(), this.options.heartbeatMs).unref();
      this.sweepTimer = setInterval(() => void this.sweep(), this.options.cancelSweepMs).unref();
      this.watchdogTimer = setInterval(
        () => this.lockWatchdog(),
        Math.max(25, Math.round(this.options.lockDurationMs / 12)),
      ).unref();
      this.log.debug({ tools: this.descriptors.map((d) => d.name) }, 'worker started');
    } catch (error) {
      await this.abandon();
      throw error;
    }
  }

  close(options: CloseOptions = {}): Promise<void> {
    this.closed ??= this.shutdown(options.graceMs ?? this.options.shutdownGraceMs);
    return this.closed;
  }

  // ---- §5 running a job -------------------------------------------------------------------------------------------

  /** Declared with three parameters: BullMQ only passes its abort signal to a processor of length 3. */
  private readonly process = async (
    job: Job<unknown, void>,
    token: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<void> => {
    const taskId = job.id ?? '';
    // Registered before anything is read, so a cancel arriving during the start check is not lost.
    const controller = new AbortController();
    const entry: RunningJob = { controller, graceTimer: undefined, lockRenewedAt: Date.now() };
    this.running.set(taskId, entry);
    const log = this.log.child({
      taskId,
      jobId: taskId,
      tool: job.name,
      attempt: attemptOf(job),
      ...correlationOf(job),
    });
    const startedAt = Date.now();
    this.metrics.jobsStarted.inc({ tool: job.name });
    if (job.attemptsMade === 0 && job.stalledCounter === 0) {
      this.metrics.queueWait.observe({ tool: job.name }, Math.max(0, startedAt - job.timestamp) / 1000);
    }
    const forward = () => controller.abort(cancelReasonOf(signal as AbortSignal));
    signal?.addEventListener('abort', forward, { once: true });
    controller.signal.addEventListener('abort', () => this.onAbort(entry, log), { once: true });
    try {
      const data = (job.data ?? {}) as { trace?: Record<string, string> };
      await withJobSpan(
        `run ${job.name}`,
        data.trace,
        {
          'taskrelay.task_id': taskId,
          'taskrelay.tool': job.name,
          'taskrelay.attempt': attemptOf(job),
          'taskrelay.worker_id': this.workerId,
        },
        () => this.runJob(job, token, taskId, controller, log),
      );
    } catch (error) {
      // Redis went away while this run recorded its start or its outcome: not the tool's fault, so no attempt is
      // used. The job goes back (or, with Redis still away, returns to the queue when its lock expires).
      if (error instanceof TaskrelayError && error.code === 'REDIS_UNAVAILABLE') {
        log.warn({ err: error.cause }, 'Redis unreachable while recording the run; handing the job back');
        return await this.putBack(job, token, log, 'LOCK_LOST');
      }
      throw error;
    } finally {
      signal?.removeEventListener('abort', forward);
      clearTimeout(entry.graceTimer);
      const endedAt = Date.now();
      this.metrics.runDuration.observe({ tool: job.name }, (endedAt - startedAt) / 1000);
      if (entry.abortedAt !== undefined) {
        const reason = cancelReasonOf(controller.signal);
        this.metrics.cancelLatency.observe({ reason }, (endedAt - entry.abortedAt) / 1000);
      }
      if (this.running.get(taskId) === entry) this.running.delete(taskId);
    }
  };

  private async runJob(
    job: Job<unknown, void>,
    token: string | undefined,
    taskId: string,
    controller: AbortController,
    log: Logger,
  ): Promise<void> {
    if (this.closing) return this.putBack(job, token, log);
    const lock: JobLock = { queue: this.queue, token: token ?? '' };
    const attempt = attemptOf(job);

    const parsed = JobDataSchema.safeParse(job.data);
    const timeoutHint = parsed.success ? parsed.data.timeoutMs : undefined;
    const queueTimeoutMs = (parsed.success ? parsed.data.queueTimeoutMs : undefined) ?? DEFAULT_QUEUE_TIMEOUT_MS;
    // A takeover after a crash re-queues the job: the deadline covers this run, the takeover and the queue again.
    const deadlineAt =
      Date.now() + Math.min(timeoutHint ?? MAX_TIMER_MS, MAX_TIMER_MS) + this.options.lockDurationMs + queueTimeoutMs;
    const started = await bookkeeping(this.store.startRun(taskId, lock, attempt, deadlineAt));
    if (started.lockLost) {
      log.warn('job lock already lost at start; tool not run');
      throw new DelayedError();
    }
    const task = started.record;
    if (!task || isTerminal(task.status)) {
      log.info({ status: task?.status ?? 'missing' }, 'task is missing or already terminal; tool not run');
      if (task?.status === 'cancelled') await this.notifyCancelled(job, task, log);
      return;
    }
    const entry = this.running.get(taskId);
    if (entry?.controller === controller) entry.principal = task.principal;
    // One child logger per job (made by the processor); the principal joins its bindings once known, unless the job's
    // correlation fields already carried it (a gateway's jobs do: no second pass of the bindings through redaction).
    if ((job.data as { principal?: unknown } | undefined)?.principal !== task.principal) {
      log.setBindings({ principal: task.principal });
    }

    if (!parsed.success || parsed.data.taskId !== taskId) {
      const message = parsed.success
        ? `Invalid job data: taskId ${parsed.data.taskId} does not match job id ${taskId}`
        : `Invalid job data: ${describeIssues(parsed.error)}`;
      await this.failTask(taskId, lock, message, { code: 'INTERNAL', message }, log);
      throw new UnrecoverableError(message);
    }
    const { tool: toolName, arguments: args } = parsed.data;

    const tool = this.tools.get(toolName);
    if (!tool) {
      const message = `Tool ${toolName} is not served by worker ${this.workerId} (queue ${this.queue})`;
      await this.failTask(taskId, lock, message, { code: 'TOOL_NOT_FOUND', message }, log);
      throw new UnrecoverableError(message);
    }

    // A crash is not the tool's fault, but a job that keeps killing its workers must stop somewhere (§10.6).
    if (job.stalledCounter > tool.maxStalls) {
      const message =
        `The worker running this task stopped responding ${job.stalledCounter} times (crashed or lost its lock); ` +
        `giving up (maxStalls ${tool.maxStalls})`;
      await this.failTask(taskId, lock, message, { code: 'JOB_LOST', message }, log);
      throw new UnrecoverableError(message);
    }

    // The gateway already capped the tool's own timeout (§7.7); the tool's is applied again for jobs added by others.
    const timeoutMs = minDefined(parsed.data.timeoutMs, tool.timeoutMs);

    const input = tool.inputSchema.safeParse(args);
    if (!input.success) {
      const message = `Invalid arguments for tool ${tool.name}: ${describeIssues(input.error)}`;
      await this.failTask(taskId, lock, message, { code: 'INVALID_ARGUMENTS', message }, log);
      throw new UnrecoverableError(message);
    }

    const ctx = new TaskContext({
      taskId,
      tool: tool.name,
      attempt,
      signal: controller.signal,
      store: this.store,
      lock,
      onLockLost: () => this.loseLock(taskId, 'progress write refused'),
      progressIntervalMs: this.options.progressIntervalMs,
      logger: log,
      record: task,
      durable: this.store,
      inputTimeoutMs: tool.inputTimeoutMs,
      queueTimeoutMs,
      onProgressCoalesced: () => this.metrics.progressCoalesced.inc(),
      onProgressWritten: () => this.metrics.progressWritten.inc(),
    });

    // The timeout fails the task when it fires, not when the tool gets round to returning: a tool that ignores its
    // signal must not keep the caller waiting.
    let timeoutTransition: Promise<void> | undefined;
    const timeoutMessage = `Tool ${tool.name} timed out after ${timeoutMs ?? 0} ms`;
    const onTimeout = () => {
      // A run that suspended is over: its time no longer counts (§12.7).
      if (controller.signal.aborted || ctx.suspension) return;
      log.info({ reason: 'TIMEOUT', timeoutMs }, 'tool timed out; aborting it');
      controller.abort('TIMEOUT' satisfies CancelReason);
      ctx.close();
      const error: SerializedError = { code: 'TIMEOUT', message: timeoutMessage };
      timeoutTransition = this.failTask(taskId, lock, timeoutMessage, error, log).catch((cause: unknown) => {
        log.error({ err: cause }, 'could not record the timeout');
      });
    };
    const timer = timeoutMs === undefined ? undefined : setTimeout(onTimeout, Math.min(timeoutMs, MAX_TIMER_MS));

    let outcome: RunOutcome;
    if (controller.signal.aborted) {
      outcome = { ok: false, error: new Error('aborted before the tool started') };
    } else {
      log.info({ timeoutMs }, 'tool started');
      try {
        outcome = { ok: true, value: await tool.run(input.data, ctx) };
      } catch (error) {
        outcome = { ok: false, error };
      }
    }
    clearTimeout(timer);

    const reason = controller.signal.aborted ? cancelReasonOf(controller.signal) : undefined;
    if (reason === 'LOCK_LOST') {
      // Another run may own the task now: write nothing more. Handing the job back only works if the lock was still
      // ours after all (a watchdog that fired during a Redis outage); otherwise the new owner keeps it.
      ctx.close();
      log.warn({ reason, returned: outcome.ok }, 'run ended after losing the job lock; nothing recorded');
      return this.putBack(job, token, log, reason);
    }
    if (reason === 'TIMEOUT') {
      ctx.close();
      if (outcome.ok) log.info('tool returned after its timeout; result discarded');
      await timeoutTransition;
      throw new UnrecoverableError(timeoutMessage);
    }
    if (reason === 'CLIENT_CANCELLED') {
      ctx.close();
      if (outcome.ok) log.info('tool returned after its task was cancelled; result discarded');
      await this.ensureCancelled(taskId, lock, log);
      // The job ends done, not failed: a cancel is no failure, never retries, and its job is removed at once.
      return;
    }
    if (reason === 'GATEWAY_SHUTDOWN') {
      // The gateway holding a plain call ended it and cancelled its task before telling us.
      ctx.close();
      log.info({ reason }, 'tool stopped: the gateway holding its call shut down');
      return;
    }
    if (ctx.suspension) {
      await ctx.flushProgress();
      ctx.close();
      return this.suspendJob(job, token, taskId, ctx.suspension, outcome, log);
    }
    // WORKER_SHUTDOWN: a finished result is still good; anything else goes back for another worker.
    if (reason === 'WORKER_SHUTDOWN' && !outcome.ok) {
      ctx.close();
      return this.putBack(job, token, log, reason);
    }

    if (outcome.ok) {
      let result: ToolResult | undefined;
      try {
        result = toToolResult(tool, outcome.value);
      } catch (error) {
        outcome = { ok: false, error };
      }
      if (result) {
        await ctx.flushProgress();
        ctx.close();
        const written = await bookkeeping(this.store.transition(taskId, 'completed', { result }, { lock }));
        if (written.ok) log.info('task completed');
        else if (written.lockLost) this.lostWhileWriting(log, 'result');
        else log.info({ status: written.status ?? 'missing' }, 'task already terminal; result discarded');
        return;
      }
    }

    await ctx.flushProgress();
    ctx.close();
    const error = outcome.ok ? undefined : outcome.error;
    const attempts = job.opts.attempts ?? 1;
    if (isNonRetryable(error) || job.attemptsMade + 1 >= attempts) {
      const serialized = serializeError(error);
      await this.failTask(taskId, lock, serialized.message, serialized, log, error);
      throw new UnrecoverableError(serialized.message);
    }
    log.warn({ err: error, attempts, attemptsMade: job.attemptsMade + 1 }, 'tool failed; the job will be retried');
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
    outcome: RunOutcome,
    log: Logger,
  ): Promise<never> {
    if (outcome.ok || !(outcome.error instanceof SuspendedError || isSuspendedError(outcome.error))) {
      log.warn('tool went on after its run suspended; what it returned or threw is discarded');
    }
    // An input wait is delayed past its deadline, so the reaper (not a replay) ends a task nobody answers.
    const until = suspension.kind === 'input' ? suspension.until + this.options.lockDurationMs : suspension.until;
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
        const task = await this.store.get(taskId);
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
    } else {
      log.info({ until }, 'run suspended');
    }
    throw new DelayedError();
  }

  /**
   * The run of a task cancelled while no run held it (PROTOCOL.md §12.8): the tool's `onCancelled` stops what earlier
   * runs started outside, when they stored anything to find it by. Its failure is logged; the job ends either way.
   */
  private async notifyCancelled(job: Job<unknown, void>, task: TaskRecord, log: Logger): Promise<void> {
    const parsed = JobDataSchema.safeParse(job.data);
    if (!parsed.success) return;
    const tool = this.tools.get(parsed.data.tool);
    const steps = task.steps ?? {};
    if (!tool?.onCancelled || (Object.keys(steps).length === 0 && task.state === undefined)) return;
    try {
      await tool.onCancelled({ taskId: task.taskId, arguments: parsed.data.arguments, steps, state: task.state, log });
      log.info('onCancelled ran for a task cancelled between runs');
    } catch (error) {
      log.warn({ err: error }, 'onCancelled failed');
    }
  }

  /** Puts the job back without using an attempt (§5 on WORKER_SHUTDOWN, §10.4); the task stays `working`. */
  private async putBack(
    job: Job<unknown, void>,
    token: string | undefined,
    log: Logger,
    reason: CancelReason = 'WORKER_SHUTDOWN',
  ): Promise<never> {
    try {
      await job.moveToDelayed(Date.now(), token);
      log.info({ reason }, 'job put back for another worker');
    } catch (error) {
      log.info(
        { err: error, reason },
        'job not put back (its lock is gone); it is already with, or returns to, the queue',
      );
    }
    throw new DelayedError();
  }

  private async failTask(
    taskId: string,
    lock: JobLock,
    message: string,
    error: SerializedError,
    log: Logger,
    cause?: unknown,
  ): Promise<void> {
    // A JSON-RPC error is no tool result: the task carries the error alone (PROTOCOL.md §13).
    const fields =
      error.code === 'PROTOCOL_ERROR'
        ? { statusMessage: message, error }
        : {
            statusMessage: message,
            result: { content: [{ type: 'text', text: message }], isError: true } satisfies ToolResult,
            error,
          };
    const written = await bookkeeping(this.store.transition(taskId, 'failed', fields, { lock }));
    if (written.ok) log.info({ code: error.code, err: cause, statusMessage: message }, 'task failed');
    else if (written.lockLost) this.lostWhileWriting(log, 'failure');
    else
      log.info({ status: written.status ?? 'missing', statusMessage: message }, 'task already terminal; failure lost');
  }

  /** The gateway cancels the task before it publishes; this only covers an abort that did not come from it. */
  private async ensureCancelled(taskId: string, lock: JobLock, log: Logger): Promise<void> {
    const written = await bookkeeping(
      this.store.transition(
        taskId,
        'cancelled',
        { cancelReason: 'CLIENT_CANCELLED', statusMessage: 'Cancelled' },
        { lock },
      ),
    );
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

  /** This worker can no longer be the job's owner: abort the run with LOCK_LOST (PROTOCOL.md §10.4). */
  private loseLock(taskId: string, why: string): void {
    const entry = this.running.get(taskId);
    if (!entry || entry.controller.signal.aborted) return;
    this.log.warn({ taskId, principal: entry.principal, reason: 'LOCK_LOST', why }, 'job lock lost; aborting tool');
    entry.controller.abort('LOCK_LOST' satisfies CancelReason);
  }

  /**
   * No renewal for half of `lockDurationMs` (Redis unreachable, say): BullMQ's lock (2/3 of it) is about to expire and
   * another worker may take the job at the next stalled check, so this run stops first. Renewals normally come every
   * sixth to third of `lockDurationMs`, so a healthy worker never gets here (PROTOCOL.md §10.4).
   */
  private lockWatchdog(): void {
    const limitMs = Math.round(this.options.lockDurationMs / 2);
    const cutoff = Date.now() - limitMs;
    for (const [taskId, entry] of this.running) {
      if (entry.lockRenewedAt < cutoff) this.loseLock(taskId, `no lock renewal for ${limitMs} ms`);
    }
  }

  private onAbort(entry: RunningJob, log: Logger): void {
    const reason = cancelReasonOf(entry.controller.signal);
    entry.abortedAt = Date.now();
    log.debug({ reason }, 'tool signal aborted');
    entry.graceTimer = setTimeout(() => {
      log.warn(
        { reason, abortGraceMs: this.options.abortGraceMs },
        'tool still running after its signal aborted; it ignores its signal and keeps its slot until it returns',
      );
    }, this.options.abortGraceMs).unref();
  }

  // ---- §7 cancel ----------------------------------------------------------------------------------------------------

  private onCancelMessage(channel: string, raw: string): void {
    if (channel !== this.keys.cancelChannel) return;
    const request = parseMessage(CancelRequestSchema, raw);
    if (!request) {
      this.log.warn({ raw: raw.slice(0, 200) }, 'malformed cancel message ignored');
      return;
    }
    const entry = this.running.get(request.taskId);
    if (!entry || entry.controller.signal.aborted) return;
    this.log.info(
      { taskId: request.taskId, principal: entry.principal, reason: request.reason },
      'cancel received; aborting tool',
    );
    entry.controller.abort(request.reason);
  }

  /** Aborts every running tool whose task is no longer live in Redis: the durable half of §7. */
  private async sweep(): Promise<void> {
    if (this.sweeping) return;
    const entries = [...this.running].filter(([, entry]) => !entry.controller.signal.aborted);
    if (entries.length === 0) return;
    this.sweeping = true;
    try {
      const states = await this.store.endStates(entries.map(([taskId]) => taskId));
      entries.forEach(([taskId, entry], i) => {
        const state = states[i];
        if (state?.status !== undefined && !isTerminal(state.status)) return;
        if (this.running.get(taskId) !== entry || entry.controller.signal.aborted) return;
        const reason = sweptReason(state);
        this.log.info(
          { taskId, principal: entry.principal, status: state?.status ?? 'missing', reason },
          'task no longer live; aborting tool',
        );
        entry.controller.abort(reason);
      });
    } catch (error) {
      this.log.warn({ err: error }, 'cancel sweep failed');
    } finally {
      this.sweeping = false;
    }
  }

  // ---- §3 catalog ---------------------------------------------------------------------------------------------------

  private async publishCatalog(): Promise<void> {
    const now = Date.now();
    const ttlMs = 3 * this.options.heartbeatMs;
    const catalog: WorkerCatalog = {
      workerId: this.workerId,
      queue: this.queue,
      tools: this.descriptors,
      heartbeatAt: now,
    };
    const replies = await this.redis
      .multi()
      .set(this.keys.workerCatalog(this.workerId), JSON.stringify(catalog), 'PX', ttlMs)
      .zadd(this.keys.workers, now + ttlMs, this.workerId)
      .zremrangebyscore(this.keys.workers, '-inf', now - PRUNE_DEAD_WORKERS_AFTER_MS)
      .exec();
    const failed = replies?.find(([error]) => error);
    if (failed?.[0]) throw failed[0];
  }

  private heartbeat(): void {
    // Skip a beat rather than queue writes behind a slow or reconnecting Redis.
    if (this.heartbeatInFlight) return;
    this.heartbeatInFlight = this.publishCatalog()
      .catch((error: unknown) => this.log.warn({ err: error }, 'heartbeat failed'))
      .finally(() => {
        this.heartbeatInFlight = undefined;
      });
  }

  // ---- shutdown -----------------------------------------------------------------------------------------------------

  private async shutdown(graceMs: number): Promise<void> {
    this.closing = true;
    // The heartbeat goes on while draining: the tools stay listed and callable (docs/MCP.md); calls queue up.
    // BullMQ's close stops fetching at once and resolves when the running jobs are done. The cancel subscriber and the
    // sweep keep working meanwhile: a running tool may still be cancelled during the drain.
    const drained = (this.bullWorker?.close() ?? Promise.resolve()).catch((error: unknown) => {
      this.log.warn({ err: error }, 'BullMQ worker close failed');
    });
    if (!(await settlesWithin(drained, graceMs))) {
      const live = [...this.running].filter(([, entry]) => !entry.controller.signal.aborted);
      this.log.info({ graceMs, taskIds: live.map(([id]) => id) }, 'grace period over; aborting running tools');
      for (const [, entry] of live) entry.controller.abort('WORKER_SHUTDOWN' satisfies CancelReason);
      if (!(await settlesWithin(drained, this.options.abortGraceMs))) {
        this.log.warn(
          { taskIds: [...this.running.keys()] },
          'tools ignore their signal; closing without them (their jobs return to the queue when their locks expire)',
        );
      }
    }
    clearInterval(this.sweepTimer);
    clearInterval(this.watchdogTimer);
    clearInterval(this.heartbeatTimer);
    await this.heartbeatInFlight;
    try {
      await this.redis
        .multi()
        .del(this.keys.workerCatalog(this.workerId))
        .zrem(this.keys.workers, this.workerId)
        .exec();
    } catch (error) {
      this.log.warn({ err: error }, 'could not remove the catalog');
    }
    await Promise.all([quit(this.subscriber), quit(this.redis), quit(this.bullConnection)]);
    this.log.info('worker closed');
  }

  /** Releases whatever `start` had opened when it failed. */
  private async abandon(): Promise<void> {
    this.closing = true;
    clearInterval(this.heartbeatTimer);
    clearInterval(this.sweepTimer);
    clearInterval(this.watchdogTimer);
    await this.bullWorker?.close(true).catch(() => undefined);
    this.subscriber.disconnect();
    this.redis.disconnect();
    this.bullConnection.disconnect();
  }

  private connect(role: string): Redis {
    // Named so `CLIENT LIST` tells the connections of each worker apart.
    const client = createRedis(this.options.redisUrl, { connectionName: `taskrelay-worker:${this.workerId}:${role}` });
    client.on('error', (error: unknown) => {
      this.options.metrics.redisErrors.inc({ connection: role });
      this.log.warn({ err: error, connection: role }, 'Redis connection error');
    });
    client.on('reconnecting', () => this.options.metrics.redisReconnects.inc({ connection: role }));
    return client;
  }
}

/** A `SuspendedError` from any copy of this package. */
function isSuspendedError(error: unknown): boolean {
  return (error as { name?: unknown } | undefined)?.name === 'SuspendedError';
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

function isNonRetryable(error: unknown): boolean {
  if (error instanceof NonRetryableError || error instanceof UnrecoverableError) return true;
  // A tools module may carry its own copy of shared or bullmq: trust the code and the name too.
  const { code, name } = (error ?? {}) as { code?: unknown; name?: unknown };
  return code === 'NON_RETRYABLE' || code === 'PROTOCOL_ERROR' || name === 'UnrecoverableError';
}

/**
 * The abort reason for a run whose task ended without it: the cancel's own reason, TIMEOUT for a deadline the reaper
 * enforced, and LOCK_LOST when the outcome is someone else's (another run finished it, or it is gone).
 */
function sweptReason(
  state: { status: string | undefined; cancelReason?: CancelReason; errorCode?: string } | undefined,
): CancelReason {
  if (state?.status === 'cancelled') return state.cancelReason ?? 'CLIENT_CANCELLED';
  if (state?.status === 'failed' && state.errorCode === 'TIMEOUT') return 'TIMEOUT';
  return 'LOCK_LOST';
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

/** Resolves true when `promise` settles within `ms`, false otherwise. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function quit(client: Redis): Promise<void> {
  try {
    if (client.status === 'end') return;
    // A client that never connected cannot QUIT; it only needs to stop reconnecting.
    if (client.status !== 'ready') client.disconnect();
    else await client.quit();
  } catch {
    client.disconnect();
  }
}

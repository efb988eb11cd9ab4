/**
 * The run of one batch child (PROTOCOL.md §26.3): a BullMQ job `<parent>.<index>` whose data names its parent. It runs
 * only while its parent is live and its outcome unrecorded, with its tool's own signal, timeout, attempts and stall
 * limit, and records its outcome once, under its job lock. Its record moves the parent's progress (coalesced per
 * parent, §26.3) and, when it completes a window or the batch, promotes the parent's job (§26.4).
 */
import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import { z } from 'zod';
import {
  Coalescer,
  MAX_STORED_CHILD_RESULT_CHARS,
  isRedisUnavailableError,
  serializeError,
  type BatchOutcome,
  type BatchStore,
  type CancelReason,
  type FairShare,
  type JobLock,
  type Logger,
  type ProgressUpdate,
  type RedisTaskStore,
  type SerializedError,
  type TaskOutputStore,
  priorityLevelOf,
  queueOfBullName,
} from '@taskrelay/shared';
import { TaskContext } from '../context.js';
import { batchMessage } from '../context-checks.js';
import { RunOutput } from '../output.js';
import { describeIssues, toToolResult, type ToolDefinition } from '../define-tool.js';
import { cancelReasonOf } from '../errors.js';
import type { WorkerMetrics } from '../metrics.js';
import type { BatchQueues } from './batch-queues.js';
import { callTool } from './isolated-run.js';
import { runUnderTimeout, type RunEnvelope } from './run-envelope.js';
import type { RunningJob } from './running-jobs.js';
import type { ToolLimits } from './tool-limits.js';
import { settle, type SettleAction } from './stages/settle.js';
import { writeThroughOutage } from './end-write.js';

/** Parents whose progress this worker coalesces, at most; the oldest is flushed and forgotten beyond it. */
const MAX_PARENT_THROTTLES = 1_000;

/** A child job's data (written by the parent, engine/batch-parent.ts). */
export const ChildJobDataSchema = z.object({
  taskId: z.string().min(1),
  child: z.number().int().nonnegative(),
  tool: z.string(),
  arguments: z.record(z.string(), z.unknown()),
  principal: z.string().optional(),
  timeoutMs: z.number().int().positive().optional(),
  maxOpen: z.number().int().positive().optional(),
});

type ChildJobData = z.infer<typeof ChildJobDataSchema>;

/** A child as its record names it: its parent and index, who owns it, and how its parent's next window is released. */
interface BatchChild {
  parentId: string;
  index: number;
  owner: string;
  parentPool: string;
  tool: string;
  maxOpen: number | undefined;
  level: number;
}

/** What carrying out a child's end works with: its job, its tool and parsed arguments, and its record. */
interface ChildEnd {
  job: Job<unknown, void>;
  token: string | undefined;
  parentId: string;
  tool: ToolDefinition;
  args: Record<string, unknown>;
  timeoutMs: number | undefined;
  record: (outcome: BatchOutcome) => Promise<void>;
  log: Logger;
  ctx: TaskContext;
  /** The batch's principal: whose keyed limits the child counts in (§3.5). */
  principal: string;
}

/** True for a batch child's job (its data names the child's index). */
export function isChildJob(data: unknown): boolean {
  return typeof data === 'object' && data !== null && typeof (data as { child?: unknown }).child === 'number';
}

export interface ChildRunnerOptions {
  tools: ReadonlyMap<string, ToolDefinition>;
  batches: BatchStore;
  /** The parent's progress writes (unlocked: the parent's lock is not this worker's). */
  store: Pick<RedisTaskStore, 'recordProgress'>;
  /** Where a child's output, artifacts and large result go (PROTOCOL.md §34): its parent task's. */
  output?: TaskOutputStore;
  queues: BatchQueues;
  fairShare: Pick<FairShare, 'leave'>;
  metrics: WorkerMetrics;
  log: Logger;
  progressIntervalMs: number;
  isClosing: () => boolean;
  /** What surrounds every run, and the one hand-back (run-envelope.ts): the same as a task's. */
  envelope: RunEnvelope;
  /** The limits runs are admitted by here (PROTOCOL.md §3.5): a child counts like any other run. */
  limits?: ToolLimits;
  /**
   * Releases the next window when the parent this child's record should wake is not waiting (its run live, or lost
   * until a takeover, §26.3 step 4): `BatchParent.releaseFromChild`.
   */
  releaseNext?: (parentId: string, maxOpen: number | undefined, level: number, log: Logger) => Promise<number>;
  /** How long a child's outcome write that finds Redis unreachable is tried again (PROTOCOL.md §10.10); 0: not at all. */
  outageWindowMs?: number;
}

export class ChildRunner {
  private readonly throttles = new Map<string, Coalescer<ProgressUpdate>>();

  constructor(private readonly o: ChildRunnerOptions) {}

  process(job: Job<unknown, void>, token: string | undefined, signal: AbortSignal | undefined): Promise<void> {
    const jobId = job.id ?? '';
    const parentId = (job.data as { taskId?: unknown } | undefined)?.taskId;
    const log = this.o.log.child({ jobId, tool: job.name, ...(typeof parentId === 'string' ? { parentId } : {}) });
    const attributes = {
      'taskrelay.task_id': typeof parentId === 'string' ? parentId : undefined,
      'taskrelay.job_id': jobId,
      'taskrelay.tool': job.name,
      'taskrelay.attempt': Math.max(1, job.attemptsStarted || job.attemptsMade + 1),
    };
    return this.o.envelope.run(job, token, signal, log, attributes, (entry) => this.run(job, token, jobId, entry, log));
  }

  private async run(
    job: Job<unknown, void>,
    token: string | undefined,
    jobId: string,
    entry: RunningJob,
    log: Logger,
  ): Promise<void> {
    if (this.o.isClosing()) return this.o.envelope.handBack(job, token, log);
    const parsed = ChildJobDataSchema.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`Invalid batch child data: ${describeIssues(parsed.error)}`);
    const data = parsed.data;
    entry.parentId = data.taskId;
    const lock: JobLock = { queue: queueOfBullName(job.queueName), token: token ?? '' };
    const child = await this.startChild(job, jobId, data, lock, log);
    if (!child) return;
    entry.principal = child.owner;
    const record = (outcome: BatchOutcome) => this.record(child, lock, outcome, log);

    const checked = this.checkChild(job, data);
    if ('refused' in checked) return record(checked.refused);
    const { tool, args } = checked;
    // A per-key or shared limit (§3.5) may send the child back to wait, holding no slot; a key function that throws
    // fails the child.
    let wait;
    try {
      wait = await this.o.limits?.admit(tool, args, job, entry);
    } catch (error) {
      if (isRedisUnavailableError(error)) throw error;
      return record(failed('INTERNAL', error instanceof Error ? error.message : String(error)));
    }
    if (wait) return this.o.limits?.delay(job, token, wait, log);

    const { controller } = entry;
    // A child reports no progress of its own (its parent's is the children's count) and has no durable state.
    const ctx = new TaskContext({
      taskId: jobId,
      tool: tool.name,
      attempt: Math.max(1, job.attemptsStarted || job.attemptsMade + 1),
      signal: controller.signal,
      store: { recordProgress: () => Promise.resolve('accepted' as const) },
      lock,
      progressIntervalMs: this.o.progressIntervalMs,
      logger: log,
      // A child's output and artifacts are its parent task's; its large result goes by reference (§26.1, §34).
      ...(this.o.output
        ? {
            output: new RunOutput({
              store: this.o.output,
              taskId: child.parentId,
              principal: child.owner,
              lock: { queue: lock.queue, jobId, token: lock.token },
              log,
            }),
          }
        : {}),
    });
    const timeoutMs = data.timeoutMs ?? tool.timeoutMs;
    log.info({ parentId: child.parentId, child: child.index }, 'batch child started');
    const timedOut = () => controller.abort('TIMEOUT' satisfies CancelReason);
    const outcome = await runUnderTimeout(controller.signal, timeoutMs, timedOut, () => callTool(tool, args, ctx, log));
    ctx.close();
    const action = settle({
      outcome,
      reason: controller.signal.aborted ? cancelReasonOf(controller.signal) : undefined,
      suspended: false,
      attemptsMade: job.attemptsMade,
      attempts: job.opts.attempts ?? 1,
    });
    const principal = child.owner;
    return this.carryOut(action, {
      job,
      token,
      parentId: child.parentId,
      tool,
      args,
      timeoutMs,
      record,
      log,
      ctx,
      principal,
    });
  }

  /**
   * Records the child's start under its job lock (§26.3), and takes its job out of its owner's waiting share of the
   * pool. The child as its record names it; undefined when it must not run (its parent ended, its batch stopped, or
   * its outcome is recorded already).
   */
  private async startChild(
    job: Job<unknown, void>,
    jobId: string,
    data: ChildJobData,
    lock: JobLock,
    log: Logger,
  ): Promise<BatchChild | undefined> {
    const parentId = data.taskId;
    const start = await this.o.batches.startChild(parentId, data.child, lock);
    const owner = start.outcome === 'run' ? start.owner : (data.principal ?? '');
    this.o.fairShare.leave(lock.queue, owner, jobId).catch(() => undefined);
    if (start.outcome === 'lock_lost') {
      log.warn('child job lock already lost at start; tool not run');
      throw new DelayedError();
    }
    if (start.outcome !== 'run') {
      log.info({ outcome: start.outcome, parentId }, 'batch child not run (parent ended, batch stopped, or recorded)');
      return undefined;
    }
    const level = priorityLevelOf(job.opts.priority ?? 0);
    return {
      parentId,
      index: data.child,
      owner,
      parentPool: start.parentPool,
      tool: data.tool,
      maxOpen: data.maxOpen,
      level,
    };
  }

  /**
   * The checks before the child's tool runs: the tool is served here, the child has not stalled too often, and its
   * arguments fit the tool's schema. A failed check is the child's failed outcome (`refused`).
   */
  private checkChild(
    job: Job<unknown, void>,
    data: ChildJobData,
  ): { tool: ToolDefinition; args: Record<string, unknown> } | { refused: BatchOutcome } {
    const tool = this.o.tools.get(data.tool);
    if (!tool) {
      return {
        refused: failed(
          'TOOL_NOT_FOUND',
          `Tool ${data.tool} is not served by this worker (queue ${queueOfBullName(job.queueName)})`,
        ),
      };
    }
    if (job.stalledCounter > tool.maxStalls) {
      return {
        refused: failed(
          'JOB_LOST',
          `The worker running this child stopped responding ${job.stalledCounter} times; giving up`,
        ),
      };
    }
    const input = tool.inputSchema.safeParse(data.arguments);
    if (!input.success) {
      return {
        refused: failed('INVALID_ARGUMENTS', `Invalid arguments for tool ${tool.name}: ${describeIssues(input.error)}`),
      };
    }
    return { tool, args: input.data };
  }

  /** Carries out what `settle` decided for the child: the outcome its batch records, and how its job ends. */
  private async carryOut(action: SettleAction, end: ChildEnd): Promise<void> {
    const { job, tool, record, log } = end;
    switch (action.kind) {
      case 'hand_back':
        return this.o.envelope.handBack(job, end.token, log, action.reason);
      case 'timed_out':
        return record(failed('TIMEOUT', `Tool ${tool.name} timed out after ${end.timeoutMs ?? 0} ms`));
      case 'cancelled':
      case 'ended_by_gateway':
      case 'suspend':
        // The parent was cancelled or stopped the batch: nothing is recorded, the job ends.
        log.info({ parentId: end.parentId }, 'batch child stopped with its batch');
        return;
      case 'complete': {
        let result;
        try {
          // Over the stored bound (16 KiB of outcome JSON) the result goes by reference instead of being dropped
          // (§26.1, §34.3); room is left for the outcome's own fields.
          result = await end.ctx.finishResult(toToolResult(tool, action.value), MAX_STORED_CHILD_RESULT_CHARS - 1_024);
        } catch (error) {
          return record(failedWith(serializeError(error)));
        }
        return record({ status: 'completed', result });
      }
      case 'fail':
        return record(failedWith(serializeError(action.error)));
      case 'back_off':
        // The upstream said when to come back (§3.4): the child waits in the delayed set, no attempt used, no slot.
        // Every tool sharing its own rate limit waits as long (§3.5).
        await this.o.limits?.hold(tool, end.args, end.principal, action.ms).catch(() => undefined);
        try {
          await job.moveToDelayed(Date.now() + action.ms, end.token);
          log.info({ retryAfterMs: action.ms }, 'batch child backs off; it runs again after the wait');
        } catch (error) {
          log.info({ err: error }, 'batch child not delayed (its lock is gone); it returns to the queue');
        }
        throw new DelayedError();
      case 'retry':
        log.warn({ err: action.error, attemptsMade: job.attemptsMade + 1 }, 'batch child failed; it will be retried');
        throw action.error instanceof Error ? action.error : new Error(serializeError(action.error).message);
    }
  }

  private async record(child: BatchChild, lock: JobLock, outcome: BatchOutcome, log: Logger): Promise<void> {
    const { parentId, index, owner, parentPool } = child;
    // A failover is waited out while the lock may still be this run's, as a task's end is (§10.10).
    const written = await writeThroughOutage(() => this.o.batches.recordChild(parentId, index, owner, lock, outcome), {
      windowMs: this.o.outageWindowMs ?? 0,
      log,
      what: 'child outcome',
    });
    if (written.outcome === 'lock_lost') {
      log.warn({ reason: 'LOCK_LOST' }, 'child outcome refused: this worker no longer holds the job');
      throw new DelayedError();
    }
    if (written.outcome !== 'recorded') {
      log.info({ outcome: written.outcome }, 'child outcome not recorded (already recorded, or the batch is gone)');
      return;
    }
    this.o.metrics.batchChildren.inc({ tool: child.tool, outcome: outcome.status });
    this.progress(parentId, written.done, written.size, written.failed);
    if (written.wake) {
      const promoted = await this.o.queues.promote(parentPool, parentId);
      log.debug({ parentId, promoted, done: written.done }, 'batch parent woken');
      if (promoted) return;
    }
    // The parent should run and this record did not promote it (not delayed: its run is live, or lost with its worker
    // until a takeover): the batch moves on meanwhile (§26.3 step 4).
    if ((written.wake || written.below) && this.o.releaseNext) {
      await this.o.releaseNext(parentId, child.maxOpen, child.level, log).catch((error: unknown) => {
        log.warn({ err: error, parentId }, 'could not release the next window for a parent that is not waiting');
      });
    }
  }

  /** The parent's progress: children done of the total, coalesced per parent on this worker (§26.3). */
  private progress(parentId: string, done: number, size: number, failedCount: number): void {
    let throttle = this.throttles.get(parentId);
    if (!throttle) {
      if (this.throttles.size >= MAX_PARENT_THROTTLES) {
        const [oldest, value] = this.throttles.entries().next().value as [string, Coalescer<ProgressUpdate>];
        value.flush();
        this.throttles.delete(oldest);
      }
      throttle = new Coalescer<ProgressUpdate>({
        minIntervalMs: this.o.progressIntervalMs,
        send: (update) => {
          this.o.metrics.progressWritten.inc();
          this.o.store.recordProgress(parentId, update).catch((error: unknown) => {
            this.o.log.debug({ err: error, parentId }, 'batch progress write failed');
          });
        },
        onCoalesced: () => this.o.metrics.progressCoalesced.inc(),
      });
      this.throttles.set(parentId, throttle);
    }
    const message = batchMessage({ completed: done - failedCount, failed: failedCount, total: size });
    throttle.push({ progress: done, total: size, message });
    if (done >= size) {
      throttle.flush();
      this.throttles.delete(parentId);
    }
  }
}

function failed(code: SerializedError['code'], message: string): BatchOutcome {
  return failedWith({ code, message });
}

function failedWith(error: SerializedError): BatchOutcome {
  return {
    status: 'failed',
    result: { content: [{ type: 'text', text: error.message }], isError: true },
    error,
  };
}

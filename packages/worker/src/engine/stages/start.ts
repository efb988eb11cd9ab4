/**
 * The start stage of a task's run (PROTOCOL.md §5, §21.2.1): a first run's start, sent and not awaited before its tool,
 * or every other run's, awaited; the tool version the task last ran (§12.11); and a task cancelled between runs told
 * to its tool (§12.8).
 */
import { DelayedError, type Job } from 'bullmq';
import {
  JobDataSchema,
  isTerminal,
  priorityLevelOf,
  type JobLock,
  type Logger,
  type TaskRecord,
} from '@taskrelay/shared';
import type { ToolDefinition } from '../../define-tool.js';
import { bullLockMs } from '../end-write.js';
import { FirstRunStart } from '../first-run-start.js';
import { MAX_TIMER_MS } from '../run-envelope.js';
import type { BatchChild, ChildJobData, ChildRunnerOptions } from './child-scope.js';
import type { TaskRecorder } from './record.js';
import { attemptOf, bookkeeping, type JobRunnerOptions, type ParsedJobData, type RunScope } from './run-scope.js';

/** How long a job left to a worker of its task's tool version waits before any worker may take it again. */
const VERSION_DEFER_MS = 250;

export class TaskStart {
  constructor(
    private readonly o: JobRunnerOptions,
    private readonly recorder: TaskRecorder,
  ) {}

  /**
   * Records the run's start (§5): its deadline, attempt and tool version on the task, and the job out of its
   * principal's waiting share of the pool (§25). The task when its tool is to run; undefined when the task is missing
   * or already ended (a cancelled one's batch is stopped and its tool told, §12.8).
   */
  async record(run: RunScope, parsed: ParsedJobData, queueTimeoutMs: number): Promise<TaskRecord | undefined> {
    const { job, taskId, lock, log } = run;
    const attempt = attemptOf(job);
    const deadlineAt = this.runDeadline(parsed, queueTimeoutMs);
    // Taken: the job no longer counts in its principal's waiting share of the pool (§25), whatever happens next. A
    // gateway's job names its principal, so the start script leaves the share in the same round trip.
    const jobPrincipal = parsed.success ? parsed.data.principal : undefined;
    // The run records the tool version it runs, and does not start a task another version ran (§12.11).
    const versioned = parsed.success ? this.o.tools.get(parsed.data.tool) : undefined;
    const version = { toolVersion: versioned?.version ?? '', deferIfOther: versioned !== undefined };
    let started = await bookkeeping(
      this.o.store.runs.startRun({ taskId, lock, attempt, deadlineAt, sharePrincipal: jobPrincipal, version }),
    );
    if (!started.lockLost && started.versionOther !== undefined && versioned !== undefined) {
      const policy = await this.versionChange(run, versioned, started.versionOther);
      started = await bookkeeping(
        this.o.store.runs.startRun({
          taskId,
          lock,
          attempt,
          deadlineAt,
          sharePrincipal: jobPrincipal,
          version: { toolVersion: versioned.version, reset: policy === 'restart' },
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
        await this.recorder.stopBatch(taskId, log);
        await this.notifyCancelled(job, task, log);
      }
      return undefined;
    }
    return task;
  }

  /** A takeover after a crash re-queues the job: a run's deadline covers it, the takeover and the queue again. */
  runDeadline(parsed: ParsedJobData, queueTimeoutMs: number): number {
    const timeoutHint = parsed.success ? parsed.data.timeoutMs : undefined;
    return Date.now() + Math.min(timeoutHint ?? MAX_TIMER_MS, MAX_TIMER_MS) + this.o.lockDurationMs + queueTimeoutMs;
  }

  /**
   * A first run's start, sent now and not awaited (PROTOCOL.md §21.2.1), or undefined when this run awaits its start
   * before its tool as every other does: BullMQ's first fetch of the job, data naming its principal and a tool served
   * here without per-key or shared limits, and the job younger than half its queue timeout, so the reaper's creation
   * deadline is far off.
   */
  firstRun(run: RunScope, parsed: ParsedJobData, queueTimeoutMs: number): FirstRunStart | undefined {
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
      store: this.o.store.runs,
      read: (id) => bookkeeping(this.o.store.records.get(id)),
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
   * The task last ran another version of the tool (PROTOCOL.md §12.11). While a live worker of that version serves
   * the tool (and for at most the lock duration from the first deferral), the job is left to it: back to the delayed
   * set for a moment, no attempt used. Otherwise the tool's `onVersionChange` decides: `resume` and `restart` return
   * (the caller starts the run, `restart` clearing the task's state, steps and answers); `fail` fails the task.
   */
  async versionChange(run: RunScope, tool: ToolDefinition, recorded: string): Promise<'resume' | 'restart'> {
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
      return this.recorder.failJob(run, 'VERSION_CHANGED', message);
    }
    log.warn(
      { ...versions, onVersionChange: policy },
      policy === 'restart'
        ? 'task last ran another tool version: restarting it from the top (state, steps and answers cleared)'
        : 'task last ran another tool version: resuming it with its state, steps and answers',
    );
    return policy;
  }

  /**
   * The run of a task cancelled while no run held it (PROTOCOL.md §12.8): the tool's `onCancelled` stops what earlier
   * runs started outside, when they stored anything to find it by. Its failure is logged; the job ends either way.
   */
  async notifyCancelled(job: Job<unknown, void>, task: TaskRecord, log: Logger): Promise<void> {
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
}

/**
 * Records the child's start under its job lock (§26.3), and takes its job out of its owner's waiting share of the
 * pool. The child as its record names it; undefined when it must not run (its parent ended, its batch stopped, or
 * its outcome is recorded already).
 */
export async function startChild(
  o: Pick<ChildRunnerOptions, 'batches' | 'fairShare'>,
  job: Job<unknown, void>,
  jobId: string,
  data: ChildJobData,
  lock: JobLock,
  log: Logger,
): Promise<BatchChild | undefined> {
  const parentId = data.taskId;
  const start = await o.batches.startChild(parentId, data.child, lock);
  const owner = start.outcome === 'run' ? start.owner : (data.principal ?? '');
  o.fairShare.leave(lock.queue, owner, jobId, lock.shard).catch(() => undefined);
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
    ...(start.claimed ? { claimed: start.claimed } : {}),
  };
}

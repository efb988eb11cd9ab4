/**
 * The run of one batch child (PROTOCOL.md §26.3): a BullMQ job `<parent>.<index>` whose data names its parent. It runs
 * only while its parent is live and its outcome unrecorded, with its tool's own signal, timeout, attempts and stall
 * limit, and records its outcome once, under its job lock. Its record moves the parent's progress (coalesced per
 * parent, §26.3) and, when it completes a window or the batch, promotes the parent's job (§26.4). Composed of the run's
 * stages (engine/stages/, PROTOCOL.md §21.4): startChild → checkChild and the limits → the tool → settle → ChildRecorder.
 */
import { UnrecoverableError, type Job } from 'bullmq';
import {
  isRedisUnavailableError,
  parseBatchChildId,
  queueOfBullName,
  type BatchOutcome,
  type CancelReason,
  type JobLock,
  type Logger,
} from '@taskrelay/shared';
import { TaskContext } from '../context.js';
import { RunOutput } from '../output.js';
import { describeIssues } from '../define-tool.js';
import { cancelReasonOf } from '../errors.js';
import { callTool } from './isolated-run.js';
import { runUnderTimeout } from './run-envelope.js';
import type { RunningJob } from './running-jobs.js';
import { settle } from './stages/settle.js';
import { checkChild } from './stages/admit.js';
import { ChildJobDataSchema, type ChildRunnerOptions } from './stages/child-scope.js';
import { ChildRecorder, failed } from './stages/record-child.js';
import { startChild } from './stages/start.js';
import { UNREADABLE_JOB_DATA } from './slot-gate.js';

export { ChildJobDataSchema, type ChildRunnerOptions } from './stages/child-scope.js';

/** True for a batch child's job: its data names the child's index, or (data unreadable) its job id does. */
export function isChildJob(job: Pick<Job, 'id' | 'data'>): boolean {
  const data: unknown = job.data;
  if (typeof data === 'object' && data !== null && typeof (data as { child?: unknown }).child === 'number') return true;
  // Data that cannot be read names no child: its job id still does (task ids are hex, so a dot is a child's; §26.2).
  return parseBatchChildId(job.id ?? '') !== undefined;
}

export class ChildRunner {
  private readonly recorder: ChildRecorder;

  constructor(private readonly o: ChildRunnerOptions) {
    this.recorder = new ChildRecorder(o);
  }

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
    const lock: JobLock = { queue: queueOfBullName(job.queueName), token: token ?? '' };
    if (!parsed.success) return this.unreadable(job, jobId, lock, describeIssues(parsed.error), log);
    const data = parsed.data;
    entry.parentId = data.taskId;
    const child = await startChild(this.o, job, jobId, data, lock, log);
    if (!child) return;
    entry.principal = child.owner;
    const record = (outcome: BatchOutcome) => this.recorder.record(child, lock, outcome, log);

    const checked = checkChild(this.o.tools, job, data);
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
    return this.recorder.carryOut(action, {
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
   * A child job whose data cannot be read (not JSON, or not a child's: issue 48 F5, PROTOCOL.md §5.8) fails that child
   * with `Invalid job data: …`, recorded once like any outcome (`batchRecord`), so its parent's aggregate counts it and
   * the batch goes on. Its parent and index come from its job id; with neither, the job alone fails.
   */
  private async unreadable(
    job: Job<unknown, void>,
    jobId: string,
    lock: JobLock,
    issues: string,
    log: Logger,
  ): Promise<void> {
    const why = (job.data as Record<string, unknown> | null | undefined)?.[UNREADABLE_JOB_DATA];
    const message = `Invalid job data: ${typeof why === 'string' ? why : issues}`;
    const ids = parseBatchChildId(jobId);
    if (!ids) throw new UnrecoverableError(message);
    const data = { taskId: ids.parentId, child: ids.index, tool: job.name, arguments: {} };
    const child = await startChild(this.o, job, jobId, data, lock, log);
    if (!child) return;
    log.warn({ parentId: child.parentId, child: child.index }, message);
    return this.recorder.record(child, lock, failed('INTERNAL', message), log);
  }
}

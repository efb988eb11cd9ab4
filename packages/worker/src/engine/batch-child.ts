/**
 * The run of one batch child (PROTOCOL.md §26.3): a BullMQ job `<parent>.<index>` whose data names its parent. It runs
 * only while its parent is live and its outcome unrecorded, with its tool's own signal, timeout, attempts and stall
 * limit, and records its outcome once, under its job lock. Its record moves the parent's progress (coalesced per
 * parent, §26.3) and, when it completes a window or the batch, promotes the parent's job (§26.4). Composed of the run's
 * stages (engine/stages/, PROTOCOL.md §21.4), as a task's: startChild → ChildAdmission (the checks, then the limits) →
 * ChildExecute (the context, the tool under its timeout) → settle → ChildRecorder.
 */
import { UnrecoverableError, type Job } from 'bullmq';
import {
  parseBatchChildId,
  queueOfBullName,
  shardOfBullPrefix,
  type BatchOutcome,
  type JobLock,
  type Logger,
} from '@taskrelay/shared';
import { describeIssues } from '../define-tool.js';
import { cancelReasonOf } from '../errors.js';
import type { RunningJob } from './running-jobs.js';
import { settle } from './stages/settle.js';
import { ChildAdmission } from './stages/admit.js';
import { ChildExecute } from './stages/execute.js';
import { attemptOf } from './stages/run-scope.js';
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
  private readonly admission: ChildAdmission;
  private readonly execute: ChildExecute;

  constructor(private readonly o: ChildRunnerOptions) {
    this.recorder = new ChildRecorder(o);
    this.admission = new ChildAdmission(o);
    this.execute = new ChildExecute(o);
  }

  process(job: Job<unknown, void>, token: string | undefined, signal: AbortSignal | undefined): Promise<void> {
    const jobId = job.id ?? '';
    const parentId = (job.data as { taskId?: unknown } | undefined)?.taskId;
    const log = this.o.log.child({ jobId, tool: job.name, ...(typeof parentId === 'string' ? { parentId } : {}) });
    const attributes = {
      'taskrelay.task_id': typeof parentId === 'string' ? parentId : undefined,
      'taskrelay.job_id': jobId,
      'taskrelay.tool': job.name,
      'taskrelay.attempt': attemptOf(job),
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
    // In the sharded layout the job's shard is its queue's, not the one its id names (its parent's, §26.10).
    const shard = shardOfBullPrefix(job.prefix);
    const lock: JobLock = { queue: queueOfBullName(job.queueName), token: token ?? '', ...(shard ? { shard } : {}) };
    if (!parsed.success) return this.unreadable(job, jobId, lock, describeIssues(parsed.error), log);
    const data = parsed.data;
    entry.parentId = data.taskId;
    const child = await startChild(this.o, job, jobId, data, lock, log);
    if (!child) return;
    entry.principal = child.owner;
    const record = (outcome: BatchOutcome) => this.recorder.record(child, lock, outcome, log);
    if (child.claimed) {
      log.info({ parentId: child.parentId, child: child.index }, 'batch child claimed by an earlier run; counting it');
      return record(child.claimed);
    }

    const checked = this.admission.check(job, data);
    if ('refused' in checked) return record(checked.refused);
    const { tool, args } = checked;
    // A per-key or shared limit (§3.5) may send the child back to wait, holding no slot.
    const admitted = await this.admission.admit(tool, args, job, entry);
    if ('refused' in admitted) return record(admitted.refused);
    if (admitted.wait) return this.o.limits?.delay(job, token, admitted.wait, log);

    const { controller } = entry;
    const ctx = this.execute.context(job, { jobId, child, tool, lock, entry, log });
    const timeoutMs = data.timeoutMs ?? tool.timeoutMs;
    log.info({ parentId: child.parentId, child: child.index }, 'batch child started');
    const outcome = await this.execute.run(controller, tool, args, ctx, timeoutMs, log);
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

/**
 * The run of one task's job (PROTOCOL.md §5, §10, §12, §21.2): BullMQ's processor, composed of its stages
 * (engine/stages/): start (a first run's pipelined, §21.2.1) → admit (the job's checks, then the tool's limits) →
 * execute (the tool with its context, under its timeout) → settle (pure) → record (what the task and the job become).
 */
import type { Job } from 'bullmq';
import { JobDataSchema, queueOfBullName, type JobLock, type Logger } from '@taskrelay/shared';
import { cancelReasonOf } from '../errors.js';
import { isChildJob } from './batch-child.js';
import { TaskLogKeeper } from './log-keeper.js';
import type { RunningJob } from './running-jobs.js';
import { TaskAdmission } from './stages/admit.js';
import { TaskExecute } from './stages/execute.js';
import { TaskRecorder } from './stages/record.js';
import {
  DEFAULT_QUEUE_TIMEOUT_MS,
  attemptOf,
  minDefined,
  type JobRunnerOptions,
  type ParsedJobData,
  type RunScope,
} from './stages/run-scope.js';
import { settle } from './stages/settle.js';
import { TaskStart } from './stages/start.js';

export type { JobRunnerOptions } from './stages/run-scope.js';
export { HANDED_BACK_MESSAGE } from './stages/record.js';

export class JobRunner {
  private readonly record: TaskRecorder;
  private readonly start: TaskStart;
  private readonly admission: TaskAdmission;
  private readonly execute: TaskExecute;

  constructor(private readonly o: JobRunnerOptions) {
    this.record = new TaskRecorder(o);
    this.start = new TaskStart(o, this.record);
    this.admission = new TaskAdmission(o, this.record);
    this.execute = new TaskExecute(o, this.record);
  }

  /** Declared with three parameters: BullMQ only passes its abort signal to a processor of length 3. */
  readonly process = async (
    job: Job<unknown, void>,
    token: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<void> => {
    // A batch child has no task of its own (§26.3): its run is the child runner's.
    if (this.o.batches && isChildJob(job)) return this.o.batches.children.process(job, token, signal);
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
    if (this.o.isClosing()) return this.o.envelope.handBack(job, token, log);
    const lock: JobLock = { queue: queueOfBullName(job.queueName), token: token ?? '' };
    const run: RunScope = { job, token, taskId, lock, log };
    const parsed = JobDataSchema.safeParse(job.data);
    const queueTimeoutMs = (parsed.success ? parsed.data.queueTimeoutMs : undefined) ?? DEFAULT_QUEUE_TIMEOUT_MS;
    // Before anything else of the run is written (§21.2.1).
    run.start = this.start.firstRun(run, parsed, queueTimeoutMs);
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
    const { job, taskId, log } = run;
    // A first run, whose start is on its way (§21.2.1), knows what a task that never ran holds: no state, steps or
    // questions, and the job's principal; the context reads the rest from the start's answer when it needs it.
    const task = run.start ? undefined : await this.start.record(run, parsed, queueTimeoutMs);
    if (!run.start && !task) return;
    const principal = task?.principal ?? (parsed.success ? parsed.data.principal : undefined) ?? '';
    entry.principal = principal;
    // One child logger per job (made by the processor); the principal joins its bindings once known, unless the job's
    // correlation fields already carried it (a gateway's jobs do: no second pass of the bindings through redaction).
    if ((job.data as { principal?: unknown } | undefined)?.principal !== principal) {
      log.setBindings({ principal });
    }
    const { data, tool, input } = await this.admission.check(run, parsed);
    // The gateway already capped the tool's own timeout (§7.7); the tool's is applied again for jobs added by others.
    const timeoutMs = minDefined(data.timeoutMs, tool.timeoutMs);

    // A per-key or shared limit (§3.5) may send the run back to wait, holding no slot.
    const wait = await this.admission.admit(run, tool, input, entry);
    if (wait) return this.record.waitForLimit({ ...run, wait, queueTimeoutMs });

    const { controller } = entry;
    // The tool's log lines are also kept with its task (PROTOCOL.md §30.4).
    const keeper = new TaskLogKeeper(this.o.store.logs, taskId, attemptOf(job), log);
    const ctx = this.execute.context(run, { entry, tool, data, task, keeper, queueTimeoutMs, principal });
    const { outcome, timeout } = await this.execute.run(run, controller, tool, input, ctx, timeoutMs);
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
    return this.record.carryOut(action, {
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

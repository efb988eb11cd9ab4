/**
 * The execute stage of a run (PROTOCOL.md §21.2, §26.3, §31): the run's `TaskContext`, and its tool called behind one
 * `callTool` (in the worker's thread or an isolated child) under its timeout, which fails the task when it fires
 * (`TaskExecute`); a batch child's (`ChildExecute`) has its parent's output and no durable state of its own.
 */
import type { Job } from 'bullmq';
import type { JobData, CancelReason, JobLock, Logger, SerializedError, TaskRecord } from '@taskrelay/shared';
import { TaskContext } from '../../context.js';
import type { ToolDefinition } from '../../define-tool.js';
import { RunOutput } from '../../output.js';
import { callTool } from '../isolated-run.js';
import type { TaskLogKeeper } from '../log-keeper.js';
import { runUnderTimeout } from '../run-envelope.js';
import type { RunningJob } from '../running-jobs.js';
import type { BatchChild, ChildRunnerOptions } from './child-scope.js';
import type { TaskRecorder } from './record.js';
import type { RunOutcome } from './settle.js';
import { attemptOf, type JobRunnerOptions, type RunScope, type RunTimeout } from './run-scope.js';

export class TaskExecute {
  constructor(
    private readonly o: JobRunnerOptions,
    private readonly recorder: TaskRecorder,
  ) {}

  /** The run's context: its task, lock and bounds, and the hosts of its members (batches, waitpoints, output). */
  context(
    run: RunScope,
    c: {
      entry: RunningJob;
      tool: ToolDefinition;
      data: JobData;
      task: TaskRecord | undefined;
      keeper: TaskLogKeeper;
      queueTimeoutMs: number;
      principal: string;
    },
  ): TaskContext {
    const { job, taskId, lock, log } = run;
    const { tool, data, task, queueTimeoutMs, principal } = c;
    const { metrics } = this.o;
    return new TaskContext({
      taskId,
      tool: tool.name,
      attempt: attemptOf(job),
      signal: c.entry.controller.signal,
      store: this.o.store.runs,
      lock,
      onLockLost: () => this.o.running.loseLock(taskId, 'progress write refused'),
      progressIntervalMs: this.o.progressIntervalMs,
      logger: c.keeper.wrap(log),
      ...(task ? { record: task } : {}),
      ...(run.start ? { start: run.start } : {}),
      durable: this.o.store.runs,
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
  }

  /**
   * Runs the tool under its timeout. The timeout fails the task when it fires, not when the tool gets round to
   * returning: a tool that ignores its signal must not keep the caller waiting.
   */
  async run(
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
      timeout.failed = this.recorder.failTask(run, timeout.message, error).catch((cause: unknown) => {
        log.error({ err: cause }, 'could not record the timeout');
      });
    };
    const outcome = await runUnderTimeout(controller.signal, timeoutMs, onTimeout, () => {
      log.info({ timeoutMs, ...(tool.isolation ? { isolate: tool.isolation.mode } : {}) }, 'tool started');
      return callTool(tool, input, ctx, log);
    });
    return { outcome, timeout };
  }
}

export class ChildExecute {
  constructor(private readonly o: Pick<ChildRunnerOptions, 'progressIntervalMs' | 'output'>) {}

  /**
   * The child's context. A child reports no progress of its own (its parent's is the children's count) and has no
   * durable state; its output and artifacts are its parent task's, and its large result goes by reference (§26.1, §34).
   */
  context(
    job: Job<unknown, void>,
    c: { jobId: string; child: BatchChild; tool: ToolDefinition; lock: JobLock; entry: RunningJob; log: Logger },
  ): TaskContext {
    const { jobId, child, tool, lock, entry, log } = c;
    return new TaskContext({
      taskId: jobId,
      tool: tool.name,
      attempt: attemptOf(job),
      signal: entry.controller.signal,
      store: { recordProgress: () => Promise.resolve('accepted' as const) },
      lock,
      progressIntervalMs: this.o.progressIntervalMs,
      logger: log,
      ...(this.o.output
        ? {
            output: new RunOutput({
              store: this.o.output,
              taskId: child.parentId,
              principal: child.owner,
              // A child's lock is on its own shard in the sharded layout (§26.10), not its parent task's.
              lock: { queue: lock.queue, jobId, token: lock.token, ...(lock.shard ? { shard: lock.shard } : {}) },
              log,
            }),
          }
        : {}),
    });
  }

  /** Runs the child's tool under its timeout; the timeout aborts it, and its outcome is recorded as the child's. */
  run(
    controller: AbortController,
    tool: ToolDefinition,
    args: Record<string, unknown>,
    ctx: TaskContext,
    timeoutMs: number | undefined,
    log: Logger,
  ): Promise<RunOutcome> {
    const timedOut = () => controller.abort('TIMEOUT' satisfies CancelReason);
    return runUnderTimeout(controller.signal, timeoutMs, timedOut, () => callTool(tool, args, ctx, log));
  }
}

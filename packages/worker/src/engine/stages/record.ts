/**
 * The record stage of a task's run (PROTOCOL.md §21.3): carries out what `settle` decided — the task's terminal write
 * (sent after a first run's start on the same connection, §21.2.1), a suspension, a back-off or a limit wait — and ends
 * the job as BullMQ must see it. Every terminal write of a task's run goes through `writeEnd`.
 */
import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import {
  serializeError,
  type CancelReason,
  type JobLock,
  type Logger,
  type SerializedError,
  type TaskStatus,
  type ToolResult,
  type TransitionFields,
  type TransitionOutcome,
} from '@taskrelay/shared';
import type { Suspension } from '../../context-types.js';
import { toToolResult } from '../../define-tool.js';
import { bullLockMs, writeThroughOutage } from '../end-write.js';
import type { LimitWait } from '../tool-limits.js';
import { failOrRetry, type SettleAction } from './settle.js';
import { bookkeeping, type JobRunnerOptions, type RunEnd, type RunScope } from './run-scope.js';

/** What a terminal write of each status carries, for its log lines (§10.10). */
const WRITTEN_AS: Partial<Record<TaskStatus, string>> = { completed: 'result', failed: 'failure', cancelled: 'cancel' };
/** What a task whose run went back says until its next run starts (§5.7); the Python worker says the same. */
export const HANDED_BACK_MESSAGE = 'Waiting to be resumed: its worker stopped and put its run back in the queue';

export class TaskRecorder {
  constructor(private readonly o: JobRunnerOptions) {}

  /**
   * A terminal write of this run, sent at once: a first run's start went before it on the same connection, so Redis
   * runs it after the start (§21.2.1), and its answer is read with the start's. A start refused for a lost lock reads
   * as the write's; a task gone reads as `status` undefined.
   */
  async writeEnd(
    run: Pick<RunScope, 'taskId' | 'lock' | 'start' | 'log'>,
    to: TaskStatus,
    fields: TransitionFields,
  ): Promise<TransitionOutcome> {
    const start = run.start?.beforeEnd();
    // Redis unreachable (a failover) is waited out while the lock may still be this run's (§10.10): the outcome is
    // kept, not dropped for a re-run once the lock expires.
    const retry = { windowMs: bullLockMs(this.o.lockDurationMs), log: run.log, what: WRITTEN_AS[to] ?? to };
    const written = writeThroughOutage(
      () => bookkeeping(this.o.store.runs.transition(run.taskId, to, fields, { lock: run.lock })),
      retry,
    );
    if (!start) return written;
    const [started, outcome] = await Promise.all([start, written]);
    if (!started.ok && started.lockLost) return { ok: false, status: undefined, lockLost: true };
    return outcome;
  }

  /** Carries out what `settle` decided (§21.3): what the task records, and how the job ends. */
  async carryOut(action: SettleAction, end: RunEnd): Promise<void> {
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
  async complete(value: unknown, end: RunEnd): Promise<void> {
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
  async backOff(action: Extract<SettleAction, { kind: 'back_off' }>, end: RunEnd): Promise<void> {
    const { ctx, tool, log } = end;
    await ctx.flushProgress();
    ctx.close();
    // The wait is a later fetch, which starts as any other: this run's start is recorded first (§21.2.1).
    await end.start?.ensure();
    const until = Date.now() + action.ms;
    const statusMessage = `Backing off until ${new Date(until).toISOString()}: ${action.message}`;
    const held = await bookkeeping(
      this.o.store.runs.suspend(end.taskId, end.lock, { deadlineAt: until + end.queueTimeoutMs, statusMessage }),
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

  /** A failed run: the task fails and the job ends unrecoverably, or the job is left to BullMQ's retry. */
  async endFailed(action: Extract<SettleAction, { kind: 'fail' | 'retry' }>, run: RunScope): Promise<never> {
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
  async suspendJob(
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
        const task = await this.o.store.records.get(taskId);
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
  async wakeIfCalled(job: Job<unknown, void>, taskId: string, name: string, log: Logger): Promise<void> {
    try {
      if ((await this.o.store.waitpoints.read(taskId, name))?.state !== 'waiting') {
        await job.promote();
        log.info({ waitpoint: name }, 'waitpoint called (or ended) while suspending; job promoted');
        throw new DelayedError();
      }
    } catch (error) {
      if (error instanceof DelayedError) throw error;
      log.warn({ err: error }, 'could not re-check the waitpoint after suspending; its timeout brings the job back');
    }
  }

  /** The run waits for its tool's limit (§3.5): the task stays `working` and says why, the job waits delayed. */
  async waitForLimit(w: {
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
      this.o.store.runs.suspend(w.taskId, w.lock, {
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
  async stopBatch(taskId: string, log: Logger): Promise<void> {
    await this.o.batches?.parent.stopChildren(taskId).catch((error: unknown) => {
      log.warn({ err: error }, 'could not stop the batch children of a cancelled task');
    });
  }

  /**
   * A task whose run goes back for another worker says so until its next run starts (whose start clears it), instead
   * of its last run's progress message (issue 48 P2, PROTOCOL.md §5.7). Under the lock, before the job leaves it; a
   * failed write costs only the message.
   */
  async sayHandedBack(end: RunEnd): Promise<void> {
    await this.o.store.runs
      .suspend(end.taskId, end.lock, {
        deadlineAt: Date.now() + end.queueTimeoutMs,
        statusMessage: HANDED_BACK_MESSAGE,
      })
      .catch((error: unknown) => end.log.debug({ err: error }, 'could not say that the task waits to be resumed'));
  }

  handBack(job: Job<unknown, void>, token: string | undefined, log: Logger, reason?: CancelReason): Promise<never> {
    return this.o.envelope.handBack(job, token, log, reason);
  }

  /** A check before the tool ran failed: the task fails with `code`, and the job ends without a retry. */
  async failJob(run: RunScope, code: SerializedError['code'], message: string): Promise<never> {
    await this.failTask(run, message, { code, message });
    throw new UnrecoverableError(message);
  }

  async failTask(run: RunScope, message: string, error: SerializedError, cause?: unknown): Promise<void> {
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
  async ensureCancelled(run: RunScope): Promise<void> {
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
  lostWhileWriting(log: Logger, what: string): never {
    log.warn(
      { reason: 'LOCK_LOST' },
      `${what} refused: this worker no longer holds the job; another run owns the task`,
    );
    throw new DelayedError();
  }
}

/**
 * A first run's deferred start (PROTOCOL.md §21.2.1). A job's first fetch runs the tool before `startRun` is sent; the
 * start then goes at the earliest of: the run's end (in the same script as its terminal transition, one round trip),
 * the first context member that needs it (`DeferredStart.ensure`), or `START_DEFER_MS` after the run began.
 */
import { isTerminal, type Logger, type RedisTaskStore, type RunStart, type TaskRecord } from '@taskrelay/shared';
import type { DeferredStart } from '../context.js';
import { writeThroughOutage } from './end-write.js';
import { sweptReason } from './cancel-watch.js';
import type { RunningJobs } from './running-jobs.js';

/** How long a first run may go before its start is recorded: `startedAt`, the deadline and the fair-share leave. */
export const START_DEFER_MS = 100;

export interface FirstRunStartOptions {
  store: Pick<RedisTaskStore, 'startRun'>;
  running: Pick<RunningJobs, 'abort' | 'loseLock'>;
  start: RunStart;
  log: Logger;
  deferMs?: number;
  /** How long a start that finds Redis unreachable (a failover) is tried again (PROTOCOL.md §10.10); 0: not at all. */
  outageWindowMs?: number;
}

export class FirstRunStart implements DeferredStart {
  private sent: Promise<TaskRecord | undefined> | undefined;
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly o: FirstRunStartOptions) {
    this.timer = setTimeout(() => void this.ensure(), o.deferMs ?? START_DEFER_MS);
    this.timer.unref();
  }

  ensure(): Promise<TaskRecord | undefined> {
    this.sent ??= this.send();
    return this.sent;
  }

  /**
   * The run's end is about to be written: the start to send with it, in one script, or undefined when the start was
   * sent already (the end then goes alone, after it on the same connection).
   */
  takeForEnd(): RunStart | undefined {
    if (this.sent) return undefined;
    clearTimeout(this.timer);
    this.sent = Promise.resolve(undefined);
    return this.o.start;
  }

  /** The run is over: no start is sent any more (a hand-back's next run starts as any later run does). */
  close(): void {
    clearTimeout(this.timer);
    this.sent ??= Promise.resolve(undefined);
  }

  private async send(): Promise<TaskRecord | undefined> {
    clearTimeout(this.timer);
    const { start, running, log } = this.o;
    const { taskId } = start;
    let started: Awaited<ReturnType<RedisTaskStore['startRun']>>;
    try {
      const startRun = () =>
        this.o.store.startRun(
          taskId,
          start.lock,
          start.attempt,
          start.deadlineAt,
          start.sharePrincipal,
          start.version,
          start.startedAt,
        );
      // The tool is running already: a failover is waited out while the lock may hold, as a run's end is (§10.10).
      started = await writeThroughOutage(startRun, { windowMs: this.o.outageWindowMs ?? 0, log, what: 'start' });
    } catch (error) {
      // As at a start before the tool: Redis lost while recording the run is no fault of the tool's. The run ends as
      // one that lost its lock, and its job is handed back (or returns to the queue when the lock expires).
      log.warn({ err: error }, 'Redis unreachable while recording the deferred start; the run stops');
      running.loseLock(taskId, 'deferred start not recorded');
      return undefined;
    }
    if (started.lockLost) {
      running.loseLock(taskId, 'deferred start refused');
      return undefined;
    }
    const task = started.record;
    if (!task || isTerminal(task.status)) {
      // Cancelled (or ended, or deleted) before this run began, and the cancel's remove did not reach the job.
      const reason = sweptReason(
        task && { status: task.status, cancelReason: task.cancelReason, errorCode: task.error?.code },
      );
      running.abort(taskId, reason, 'task ended before its run recorded its start; aborting tool', {
        status: task?.status ?? 'missing',
      });
      return undefined;
    }
    return task;
  }
}

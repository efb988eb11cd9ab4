/**
 * A first run's start, pipelined (PROTOCOL.md §21.2.1). `startRun` is sent as the run begins, before its job checks
 * and its tool, and is not awaited: the tool begins at once. Every later write of the run goes on the same command
 * connection, so Redis runs the start first; the members that write durably await its answer (`PendingStart.ensure`),
 * and the end is sent at once and then read with it. A start that finds its task already ended aborts the run when its
 * answer arrives, one round trip after the run began. The start answers a task that starts without its record (issue
 * 46): a member that reads the record (`PendingStart.record`) reads it then, once.
 */
import { isTerminal, type Logger, type Runs, type RunStart, type TaskRecord } from '@taskrelay/shared';
import type { PendingStart } from '../context-types.js';
import { writeThroughOutage } from './end-write.js';
import { sweptReason } from './cancel-watch.js';
import type { RunningJobs } from './running-jobs.js';

export interface FirstRunStartOptions {
  store: Pick<Runs, 'startRun'>;
  /** Reads the task's record (after a start answered without it). */
  read: (taskId: string) => Promise<TaskRecord | undefined>;
  running: Pick<RunningJobs, 'abort' | 'loseLock'>;
  start: RunStart;
  log: Logger;
  /** How long a start that finds Redis unreachable (a failover) is tried again (PROTOCOL.md §10.10); 0: not at all. */
  outageWindowMs?: number;
}

/** What the start answered, as the run's end reads it; `record` when the start returned it (a task already ended). */
export type StartAnswer = { ok: true; record?: TaskRecord } | { ok: false; lockLost: boolean };

export class FirstRunStart implements PendingStart {
  private readonly answer: Promise<StartAnswer>;
  private readonly goes: Promise<boolean>;
  private recordRead: Promise<TaskRecord | undefined> | undefined;
  /** Set once the run's end is sent: from then on the start's answer aborts nothing, the end's answer decides. */
  private ended = false;

  /** Sends the start: call it before anything else of the run is written. */
  constructor(private readonly o: FirstRunStartOptions) {
    const { start } = o;
    const startRun = () => o.store.startRun({ ...start, brief: true });
    // The first try goes out at once, unawaited (the pipelined start); only a try that found Redis unreachable is
    // repeated, while the lock may hold, as a run's end is (§10.10): the tool is running already.
    this.answer = writeThroughOutage(startRun, { windowMs: o.outageWindowMs ?? 0, log: o.log, what: 'start' }).then(
      (started): StartAnswer => {
        if (started.lockLost) return this.refused(true, 'start refused');
        if (started.started) return { ok: true };
        const task = started.record;
        if (task && !isTerminal(task.status)) return { ok: true, record: task };
        if (!this.ended) {
          // Cancelled (or ended, or deleted) before this run began, and the cancel's remove did not reach the job.
          const reason = sweptReason(
            task && { status: task.status, cancelReason: task.cancelReason, errorCode: task.error?.code },
          );
          o.running.abort(start.taskId, reason, 'task ended before its run recorded its start; aborting tool', {
            status: task?.status ?? 'missing',
          });
        }
        return { ok: false, lockLost: false };
      },
      (error: unknown): StartAnswer => {
        // As at a start before the tool: Redis lost while recording the run is no fault of the tool's. The run ends
        // as one that lost its lock, and its job is handed back (or returns to the queue when the lock expires).
        o.log.warn({ err: error }, 'Redis unreachable while recording the start; the run stops');
        return this.refused(true, 'start not recorded');
      },
    );
    this.goes = this.answer.then((a) => a.ok);
  }

  private refused(lockLost: boolean, why: string): StartAnswer {
    if (!this.ended) this.o.running.loseLock(this.o.start.taskId, why);
    return { ok: false, lockLost };
  }

  /** True once the start is answered and the run goes on; false when it must not (its signal has aborted). Never
   * rejects. */
  ensure(): Promise<boolean> {
    return this.goes;
  }

  /**
   * The task as the run started, read once after the start's answer (undefined when the run must not go on, or the
   * task is gone). Rejects when Redis does not answer the read; the next call reads again.
   */
  record(): Promise<TaskRecord | undefined> {
    if (this.recordRead) return this.recordRead;
    const read = this.answer.then((a) => {
      if (!a.ok) return undefined;
      return a.record ?? this.o.read(this.o.start.taskId);
    });
    this.recordRead = read;
    read.catch(() => {
      if (this.recordRead === read) this.recordRead = undefined;
    });
    return read;
  }

  /**
   * The run's end is being sent (after the start, on the same connection): the start's answer, to read with the
   * end's. From now on that answer aborts nothing.
   */
  beforeEnd(): Promise<StartAnswer> {
    this.ended = true;
    return this.answer;
  }
}

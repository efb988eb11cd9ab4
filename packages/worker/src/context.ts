import { Coalescer, type JobLock, type Logger, type ProgressUpdate, type RedisTaskStore } from '@taskrelay/shared';
import { CancelledError, cancelReasonOf } from './errors.js';

/**
 * What a tool's `run` receives besides its input. Every member is safe to destructure
 * (`const { progress, sleep } = ctx`).
 */
export interface ToolContext {
  /**
   * The task this run belongs to (also the BullMQ job id). Stable across every run of the task: execution is
   * at-least-once (a crashed worker's job runs again elsewhere), so key external side effects on it.
   */
  readonly taskId: string;
  /** The tool's name. */
  readonly tool: string;
  /**
   * Runs started for this task, this one included: 1 on the first; a retry after an error, a takeover after a
   * crash and a hand-back at shutdown each start a new run. Above 1, an earlier run may have had side effects.
   */
  readonly attempt: number;
  /**
   * Aborts when the client cancels the task, when the tool runs past its `timeoutMs`, or when the worker shuts down.
   * `signal.reason` is the `CancelReason` (`'CLIENT_CANCELLED' | 'TIMEOUT' | 'WORKER_SHUTDOWN' | 'GATEWAY_SHUTDOWN' |
   * 'LOCK_LOST'`; `LOCK_LOST`: this worker lost the job, another run owns the task now). Pass it to
   * `fetch`, child processes and the like; a tool that ignores it keeps its worker slot until it returns, and its
   * result is discarded.
   */
  readonly signal: AbortSignal;
  /**
   * Reports progress. Synchronous and cheap: values are throttled per task (`progressIntervalMs`, newest wins) and
   * written to Redis in the background; a failed write is logged, never thrown. `progress` must increase: a value
   * not greater than the last accepted one is dropped.
   *
   * @throws RangeError when `progress` or `total` is not a finite number.
   */
  progress(progress: number, total?: number, message?: string): void;
  /** A pino logger whose lines carry `taskId` and `tool`. */
  readonly log: Logger;
  /**
   * Resolves after `ms` milliseconds; rejects with a `CancelledError` as soon as the signal aborts.
   *
   * @throws RangeError (as a rejection) when `ms` is negative or not finite.
   */
  sleep(ms: number): Promise<void>;
  /** Throws a `CancelledError` when the signal has aborted; otherwise does nothing. */
  throwIfCancelled(): void;
}

export interface TaskContextOptions {
  taskId: string;
  tool: string;
  attempt: number;
  signal: AbortSignal;
  /** Where progress goes; only `recordProgress` is used. */
  store: Pick<RedisTaskStore, 'recordProgress'>;
  /** The job lock every progress write is checked against (PROTOCOL.md §10.4). Default: none. */
  lock?: JobLock;
  /** Called when a progress write is refused because the lock is gone. */
  onLockLost?: () => void;
  /** Per-task progress throttle (PROTOCOL.md §8). */
  progressIntervalMs: number;
  /** Already bound to the task (`taskId`, `tool`). */
  logger: Logger;
  /** Metrics hooks: a value merged by the throttle, a write sent to Redis. */
  onProgressCoalesced?: () => void;
  onProgressWritten?: () => void;
}

/**
 * The `ToolContext` of one job attempt, plus the two hooks the processor needs: `flushProgress` before the terminal
 * transition (so 100/100 lands before the result) and `close` once the run is over.
 */
export class TaskContext implements ToolContext {
  readonly taskId: string;
  readonly tool: string;
  readonly attempt: number;
  readonly signal: AbortSignal;
  readonly log: Logger;

  private readonly store: Pick<RedisTaskStore, 'recordProgress'>;
  private readonly lock: JobLock | undefined;
  private readonly onLockLost: (() => void) | undefined;
  private readonly coalescer: Coalescer<ProgressUpdate>;
  private readonly writes = new Set<Promise<void>>();
  private lastProgress: number | undefined;
  private closed = false;

  constructor(options: TaskContextOptions) {
    this.taskId = options.taskId;
    this.tool = options.tool;
    this.attempt = options.attempt;
    this.signal = options.signal;
    this.log = options.logger;
    this.store = options.store;
    this.lock = options.lock;
    this.onLockLost = options.onLockLost;
    this.coalescer = new Coalescer<ProgressUpdate>({
      minIntervalMs: options.progressIntervalMs,
      send: (update) => {
        options.onProgressWritten?.();
        this.write(update);
      },
      ...(options.onProgressCoalesced ? { onCoalesced: options.onProgressCoalesced } : {}),
    });
  }

  readonly progress = (progress: number, total?: number, message?: string): void => {
    if (typeof progress !== 'number' || !Number.isFinite(progress)) {
      throw new RangeError(`progress must be a finite number (got ${String(progress)})`);
    }
    if (total !== undefined && (typeof total !== 'number' || !Number.isFinite(total))) {
      throw new RangeError(`total must be a finite number (got ${String(total)})`);
    }
    if (this.closed) {
      this.log.debug({ progress }, 'progress after the run ended dropped');
      return;
    }
    if (this.lastProgress !== undefined && progress <= this.lastProgress) {
      this.log.debug({ progress, last: this.lastProgress }, 'progress not greater than the last value dropped');
      return;
    }
    this.lastProgress = progress;
    const update: ProgressUpdate = { progress };
    if (total !== undefined) update.total = total;
    if (message !== undefined) update.message = String(message);
    this.coalescer.push(update);
  };

  readonly sleep = (ms: number): Promise<void> => {
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      return Promise.reject(new RangeError(`sleep needs a finite, non-negative number of ms (got ${String(ms)})`));
    }
    const signal = this.signal;
    if (signal.aborted) return Promise.reject(new CancelledError(cancelReasonOf(signal)));
    return new Promise<void>((resolve, reject) => {
      // setImmediate for 0 so a tight `sleep(0)` loop yields without the 1 ms timer floor.
      const clear = () => (ms === 0 ? clearImmediate(immediate) : clearTimeout(timer));
      const onAbort = () => {
        clear();
        reject(new CancelledError(cancelReasonOf(signal)));
      };
      const done = () => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const immediate = ms === 0 ? setImmediate(done) : undefined;
      const timer = ms === 0 ? undefined : setTimeout(done, ms);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  };

  readonly throwIfCancelled = (): void => {
    if (this.signal.aborted) throw new CancelledError(cancelReasonOf(this.signal));
  };

  /** Writes the pending progress value (if any) and waits for every write in flight. Never rejects. */
  async flushProgress(): Promise<void> {
    this.coalescer.flush();
    while (this.writes.size > 0) await Promise.all(this.writes);
  }

  /** Ends the run: a pending progress value is dropped and later `progress` calls are ignored. */
  close(): void {
    this.closed = true;
    this.coalescer.cancel();
  }

  private write(update: ProgressUpdate): void {
    const write: Promise<void> = this.store
      .recordProgress(this.taskId, update, this.lock)
      .then(
        (outcome) => {
          if (outcome === 'lock_lost') {
            this.log.warn({ progress: update.progress }, 'progress refused: this worker no longer holds the job');
            this.onLockLost?.();
          } else if (outcome !== 'accepted') {
            this.log.debug({ progress: update.progress, outcome }, 'progress not recorded');
          }
        },
        (error: unknown) => {
          this.log.warn({ err: error, progress: update.progress }, 'progress write failed');
        },
      )
      .finally(() => this.writes.delete(write));
    this.writes.add(write);
  }
}

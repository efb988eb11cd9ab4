/**
 * A run's background writes (PROTOCOL.md §8, §15): `ctx.progress`, throttled per task, and `ctx.notify`, each sent
 * under the run's job lock without the handler waiting; `flush` before the run's terminal write waits for them all, so
 * the last progress and every log message reach the caller before the result.
 */
import {
  Coalescer,
  type JobLock,
  type LogLevel,
  type LogMessage,
  type Logger,
  type ProgressUpdate,
} from '@taskrelay/shared';
import { checkNotifyArgs, checkProgressArgs } from './context-checks.js';
import type { TaskContextOptions } from './context-types.js';
import { MAX_PROGRESS_MESSAGE_BYTES, boundedText, wellFormedJson, wellFormedText } from './well-formed.js';

export class RunMessages {
  private readonly taskId: string;
  private readonly log: Logger;
  private readonly store: TaskContextOptions['store'];
  private readonly lock: JobLock | undefined;
  private readonly onLockLost: (() => void) | undefined;
  private readonly coalescer: Coalescer<ProgressUpdate>;
  private readonly writes = new Set<Promise<void>>();
  private lastProgress: number | undefined;
  private closed = false;

  constructor(options: TaskContextOptions) {
    this.taskId = options.taskId;
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

  progress(progress: number, total?: number, message?: string): void {
    checkProgressArgs(progress, total);
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
    // Well-formed, or the store's script refuses the whole update (§22.4).
    // Bounded, or a flood of long messages gets the gateway's subscriber cut (§22.4).
    if (message !== undefined) {
      update.message = boundedText(wellFormedText(String(message)), MAX_PROGRESS_MESSAGE_BYTES);
    }
    this.coalescer.push(update);
  }

  notify(level: LogLevel, data: unknown, logger?: string): void {
    checkNotifyArgs(level, data);
    if (this.closed) {
      this.log.debug({ level }, 'log message after the run ended dropped');
      return;
    }
    const recordLog = this.store.recordLog?.bind(this.store);
    if (!recordLog) {
      this.log.info({ level, data }, 'log message (no client route in this context)');
      return;
    }
    const message: LogMessage = { level, data: wellFormedJson(data) };
    if (logger !== undefined) message.logger = wellFormedText(String(logger));
    // In the same write set as progress: flushProgress waits for it, so every message is published before the task's
    // terminal status and reaches the caller before the result.
    const write: Promise<void> = recordLog(this.taskId, message, this.lock)
      .then(
        (outcome) => {
          if (outcome === 'lock_lost') {
            this.log.warn({ level }, 'log message refused: this worker no longer holds the job');
            this.onLockLost?.();
          } else if (outcome !== 'published') {
            this.log.debug({ level, outcome }, 'log message not published');
          }
        },
        (error: unknown) => this.log.warn({ err: error, level }, 'log message write failed'),
      )
      .finally(() => this.writes.delete(write));
    this.writes.add(write);
  }

  /** Writes the pending progress value (if any) and waits for every write in flight. Never rejects. */
  async flush(): Promise<void> {
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

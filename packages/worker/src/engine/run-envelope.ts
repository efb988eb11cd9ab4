/**
 * The envelope of every run a worker makes, a task's (`job-run.ts`) and a batch child's (`batch-child.ts`) alike
 * (PROTOCOL.md §21.2): what surrounds the tool, whatever the job is.
 * - The run is tracked in `RunningJobs` before anything is read, so a cancel during its start is not lost.
 * - BullMQ's abort signal is forwarded to the run's own controller, and an aborted run that keeps running is reported
 *   after `abortGraceMs`.
 * - Metrics: runs started, the queue wait of a first run, the run's duration, the cancel latency.
 * - A span per run, under the trace the job carries.
 * - Redis lost while the run recorded its start or outcome is not the tool's fault: the job is handed back, and no
 *   attempt is used.
 * - One hand-back (`handBack`), for a draining worker, a lost lock and a lost Redis alike.
 * - The entry is released only by the run that added it.
 * - The tool runs under its timeout the same way in both (`runUnderTimeout`).
 * Before this file the child runner carried a copy of all of it, and the copies had drifted (the child handed back
 * behind the jobs queued meanwhile, and recorded no queue wait, cancel latency, span or abort grace).
 */
import { WaitingError, DelayedError, type Job } from 'bullmq';
import {
  TaskrelayError,
  isRedisUnavailableError,
  withJobSpan,
  type CancelReason,
  type Logger,
  type SpanAttributes,
} from '@taskrelay/shared';
import { cancelReasonOf } from '../errors.js';
import type { WorkerMetrics } from '../metrics.js';
import { moveToWait } from './bullmq-adapter.js';
import type { RunningJob, RunningJobs } from './running-jobs.js';
import type { RunOutcome } from './stages/settle.js';

/** setTimeout's ceiling; a longer timeout would fire at once. */
export const MAX_TIMER_MS = 2_147_483_647;

export interface RunEnvelopeOptions {
  running: RunningJobs;
  metrics: WorkerMetrics;
  abortGraceMs: number;
  /**
   * Wakes the idle workers of a BullMQ queue (by its qualified name, `<BullMQ prefix>:<BullMQ name>`; BullMQ's marker):
   * BullMQ's own move of an active job back to its priority level sets none, so without it an idle worker would see
   * the handed-back job only at its next block timeout (5 s).
   */
  wakeWorkers: (queueQualifiedName: string) => Promise<void>;
}

/** What a run's body gets: its entry in `RunningJobs` (its controller, its lock watch). */
export type RunBody = (entry: RunningJob) => Promise<void>;

export class RunEnvelope {
  constructor(private readonly o: RunEnvelopeOptions) {}

  /** Runs `body` inside the envelope; `attributes` name the run on its span. */
  async run(
    job: Job<unknown, void>,
    token: string | undefined,
    signal: AbortSignal | undefined,
    log: Logger,
    attributes: SpanAttributes,
    body: RunBody,
  ): Promise<void> {
    const id = job.id ?? '';
    const entry = this.o.running.add(id);
    const { controller } = entry;
    const { metrics } = this.o;
    const startedAt = Date.now();
    metrics.jobsStarted.inc({ tool: job.name });
    if (job.attemptsMade === 0 && job.stalledCounter === 0) {
      metrics.queueWait.observe({ tool: job.name }, Math.max(0, startedAt - job.timestamp) / 1000);
    }
    const forward = () => controller.abort(cancelReasonOf(signal as AbortSignal));
    signal?.addEventListener('abort', forward, { once: true });
    controller.signal.addEventListener('abort', () => this.onAbort(entry, log), { once: true });
    try {
      const trace = (job.data as { trace?: Record<string, string> } | undefined)?.trace;
      await withJobSpan(`run ${job.name}`, trace, attributes, () => body(entry));
    } catch (error) {
      // Redis went away while this run recorded its start or its outcome: not the tool's fault, so no attempt is
      // used. The job goes back (or, with Redis still away, returns to the queue when its lock expires).
      if (isRedisLoss(error)) {
        log.warn({ err: errorCause(error) }, 'Redis unreachable while recording the run; handing the job back');
        return await this.handBack(job, token, log, 'LOCK_LOST');
      }
      throw error;
    } finally {
      signal?.removeEventListener('abort', forward);
      clearTimeout(entry.graceTimer);
      const endedAt = Date.now();
      metrics.runDuration.observe({ tool: job.name }, (endedAt - startedAt) / 1000);
      if (entry.abortedAt !== undefined) {
        metrics.cancelLatency.observe(
          { reason: cancelReasonOf(controller.signal) },
          (endedAt - entry.abortedAt) / 1000,
        );
      }
      // A slot of a per-key limit (§3.5) goes back however the run ended, and wakes the runs waiting for it.
      await entry.release?.().catch((error: unknown) => {
        log.warn({ err: error }, 'could not give back the run’s limit slot; its lease ends it');
      });
      this.o.running.release(id, entry);
    }
  }

  /**
   * Puts the job back without using an attempt (§5 on WORKER_SHUTDOWN, §10.4), at the front of its queue: ahead of
   * every job of its fair-share priority (§25), and so of every job its principal queued after it (BullMQ's
   * `moveToWait`, which scores it `priority × 2³²` with no counter). A task stays `working`; a child stays unrecorded.
   * A delayed move of 0 ms, as before, re-entered it behind every job of its priority queued meanwhile.
   */
  async handBack(
    job: Job<unknown, void>,
    token: string | undefined,
    log: Logger,
    reason: CancelReason = 'WORKER_SHUTDOWN',
  ): Promise<never> {
    try {
      await moveToWait(job, token);
      log.info({ reason }, 'job put back, at the front of its queue, for another worker');
    } catch (error) {
      log.info(
        { err: error, reason },
        'job not put back (its lock is gone); it is already with, or returns to, the queue',
      );
      throw new DelayedError();
    }
    await this.o
      .wakeWorkers(job.queueQualifiedName)
      .catch((error: unknown) => log.debug({ err: error }, 'could not wake idle workers'));
    throw new WaitingError();
  }

  private onAbort(entry: RunningJob, log: Logger): void {
    const reason = cancelReasonOf(entry.controller.signal);
    entry.abortedAt = Date.now();
    log.debug({ reason }, 'tool signal aborted');
    entry.graceTimer = setTimeout(() => {
      log.warn(
        { reason, abortGraceMs: this.o.abortGraceMs },
        'tool still running after its signal aborted; it ignores its signal and keeps its slot until it returns',
      );
    }, this.o.abortGraceMs).unref();
  }
}

/**
 * Runs the tool (`call`) under its timeout, a task's and a batch child's alike: `onTimeout` when it fires first. A run
 * whose signal aborted before the tool started does not start it.
 */
export async function runUnderTimeout(
  signal: AbortSignal,
  timeoutMs: number | undefined,
  onTimeout: () => void,
  call: () => unknown,
): Promise<RunOutcome> {
  const timer = timeoutMs === undefined ? undefined : setTimeout(onTimeout, Math.min(timeoutMs, MAX_TIMER_MS));
  try {
    if (signal.aborted) return { ok: false, error: new Error('aborted before the tool started') };
    return { ok: true, value: await call() };
  } catch (error) {
    return { ok: false, error };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Redis lost, however it surfaced: the store's own error (`bookkeeping` in job-run.ts marks a failed write as
 * `REDIS_UNAVAILABLE`) or ioredis's, from a write that was not wrapped.
 */
function isRedisLoss(error: unknown): boolean {
  return (error instanceof TaskrelayError && error.code === 'REDIS_UNAVAILABLE') || isRedisUnavailableError(error);
}

function errorCause(error: unknown): unknown {
  return error instanceof TaskrelayError && error.cause !== undefined ? error.cause : error;
}

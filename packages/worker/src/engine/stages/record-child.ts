/**
 * The record stage of a batch child's run (PROTOCOL.md §26.3, §26.4): carries out what `settle` decided — the outcome
 * its batch records once, under its job lock — moves its parent's progress (coalesced per parent) and wakes the parent
 * when the record completes a window or the batch.
 */
import { DelayedError } from 'bullmq';
import {
  Coalescer,
  MAX_STORED_CHILD_RESULT_CHARS,
  serializeError,
  type BatchOutcome,
  type JobLock,
  type Logger,
  type ProgressUpdate,
  type SerializedError,
} from '@taskrelay/shared';
import { batchMessage } from '../../context-checks.js';
import { toToolResult } from '../../define-tool.js';
import type { SettleAction } from './settle.js';
import { writeThroughOutage } from '../end-write.js';
import type { BatchChild, ChildEnd, ChildRunnerOptions } from './child-scope.js';

/** Parents whose progress this worker coalesces, at most; the oldest is flushed and forgotten beyond it. */
const MAX_PARENT_THROTTLES = 1_000;

export class ChildRecorder {
  private readonly throttles = new Map<string, Coalescer<ProgressUpdate>>();

  constructor(private readonly o: ChildRunnerOptions) {}

  /** Carries out what `settle` decided for the child: the outcome its batch records, and how its job ends. */
  async carryOut(action: SettleAction, end: ChildEnd): Promise<void> {
    const { job, tool, record, log } = end;
    switch (action.kind) {
      case 'hand_back':
        return this.o.envelope.handBack(job, end.token, log, action.reason);
      case 'timed_out':
        return record(failed('TIMEOUT', `Tool ${tool.name} timed out after ${end.timeoutMs ?? 0} ms`));
      case 'cancelled':
      case 'ended_by_gateway':
      case 'suspend':
        // The parent was cancelled or stopped the batch: nothing is recorded, the job ends.
        log.info({ parentId: end.parentId }, 'batch child stopped with its batch');
        return;
      case 'complete': {
        let result;
        try {
          // Over the stored bound (16 KiB of outcome JSON) the result goes by reference instead of being dropped
          // (§26.1, §34.3); room is left for the outcome's own fields.
          result = await end.ctx.finishResult(toToolResult(tool, action.value), MAX_STORED_CHILD_RESULT_CHARS - 1_024);
        } catch (error) {
          return record(failedWith(serializeError(error)));
        }
        return record({ status: 'completed', result });
      }
      case 'fail':
        return record(failedWith(serializeError(action.error)));
      case 'back_off':
        // The upstream said when to come back (§3.4): the child waits in the delayed set, no attempt used, no slot.
        // Every tool sharing its own rate limit waits as long (§3.5).
        await this.o.limits?.hold(tool, end.args, end.principal, action.ms).catch(() => undefined);
        try {
          await job.moveToDelayed(Date.now() + action.ms, end.token);
          log.info({ retryAfterMs: action.ms }, 'batch child backs off; it runs again after the wait');
        } catch (error) {
          log.info({ err: error }, 'batch child not delayed (its lock is gone); it returns to the queue');
        }
        throw new DelayedError();
      case 'retry':
        log.warn({ err: action.error, attemptsMade: job.attemptsMade + 1 }, 'batch child failed; it will be retried');
        throw action.error instanceof Error ? action.error : new Error(serializeError(action.error).message);
    }
  }

  async record(child: BatchChild, lock: JobLock, outcome: BatchOutcome, log: Logger): Promise<void> {
    const { parentId, index, owner, parentPool } = child;
    // A failover is waited out while the lock may still be this run's, as a task's end is (§10.10).
    const written = await writeThroughOutage(() => this.o.batches.recordChild(parentId, index, owner, lock, outcome), {
      windowMs: this.o.outageWindowMs ?? 0,
      log,
      what: 'child outcome',
    });
    if (written.outcome === 'lock_lost') {
      log.warn({ reason: 'LOCK_LOST' }, 'child outcome refused: this worker no longer holds the job');
      throw new DelayedError();
    }
    if (written.outcome !== 'recorded') {
      log.info({ outcome: written.outcome }, 'child outcome not recorded (already recorded, or the batch is gone)');
      return;
    }
    this.o.metrics.batchChildren.inc({ tool: child.tool, outcome: outcome.status });
    this.progress(parentId, written.done, written.size, written.failed);
    if (written.wake) {
      const promoted = await this.o.queues.promote(parentPool, parentId);
      log.debug({ parentId, promoted, done: written.done }, 'batch parent woken');
      if (promoted) return;
    }
    // The parent should run and this record did not promote it (not delayed: its run is live, or lost with its worker
    // until a takeover): the batch moves on meanwhile (§26.3 step 4).
    if ((written.wake || written.below) && this.o.releaseNext) {
      await this.o.releaseNext(parentId, child.maxOpen, child.level, log).catch((error: unknown) => {
        log.warn({ err: error, parentId }, 'could not release the next window for a parent that is not waiting');
      });
    }
  }

  /** The parent's progress: children done of the total, coalesced per parent on this worker (§26.3). */
  progress(parentId: string, done: number, size: number, failedCount: number): void {
    let throttle = this.throttles.get(parentId);
    if (!throttle) {
      if (this.throttles.size >= MAX_PARENT_THROTTLES) {
        const [oldest, value] = this.throttles.entries().next().value as [string, Coalescer<ProgressUpdate>];
        value.flush();
        this.throttles.delete(oldest);
      }
      throttle = new Coalescer<ProgressUpdate>({
        minIntervalMs: this.o.progressIntervalMs,
        send: (update) => {
          this.o.metrics.progressWritten.inc();
          this.o.store.recordProgress(parentId, update).catch((error: unknown) => {
            this.o.log.debug({ err: error, parentId }, 'batch progress write failed');
          });
        },
        onCoalesced: () => this.o.metrics.progressCoalesced.inc(),
      });
      this.throttles.set(parentId, throttle);
    }
    const message = batchMessage({ completed: done - failedCount, failed: failedCount, total: size });
    throttle.push({ progress: done, total: size, message });
    if (done >= size) {
      throttle.flush();
      this.throttles.delete(parentId);
    }
  }
}

export function failed(code: SerializedError['code'], message: string): BatchOutcome {
  return failedWith({ code, message });
}

export function failedWith(error: SerializedError): BatchOutcome {
  return {
    status: 'failed',
    result: { content: [{ type: 'text', text: error.message }], isError: true },
    error,
  };
}

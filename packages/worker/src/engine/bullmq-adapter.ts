/**
 * Every use the worker makes of BullMQ's internals, in one place (issue 47 item 5), each with a test named for the
 * BullMQ behaviour it relies on (packages/worker/test/bullmq-adapter.integration.test.ts):
 * - `Worker.moveToActive` (protected, for this kind of extension) is where a job is taken, and `processJob` where its
 *   run ends: the slot gate (slot-gate.ts) sits between them.
 * - `Worker.createJob` parses a job's stored data while taking it, outside any processor.
 * - `handleCompleted` fetches the next job with a completion (`fetchNextCallback`), `handleFailed` with a failure or a
 *   delay; the gate decides whether they may.
 * - A queue's "a job is waiting" marker is the sorted set `<qualified name>:marker`, member "0".
 * - A queue's rate limiter is the string `<qualified name>:limiter`: a value of at least the queue's `max` holds every
 *   worker's takes until its TTL ends (what `Queue.rateLimit` writes); a marker's score is when a worker blocked on it
 *   takes next; `Job.moveToWait` puts a taken job back at the front of its priority, attempts kept, and sets no
 *   marker (what BullMQ's `RateLimitError` does).
 * - The lock manager (`Worker.lockManager`, protected) renews each lock it tracks on its own timer, and tracks a job
 *   until `processJob` returns: `moveToWait` here stops the renewal of the run's lock before the move.
 * The Python worker's are in packages/worker-python/src/taskrelay_worker/engine/bullmq_adapter.py; the gateway's in
 * packages/gateway/src/tasks/bullmq-adapter.ts.
 */
import { Worker, type Job, type JobJson, type WorkerOptions, type Processor } from 'bullmq';
import type { RedisClient } from '@taskrelay/shared';
import { UNREADABLE_JOB_DATA, type SlotGate } from './slot-gate.js';

/** BullMQ's "a job is waiting" marker of a queue, by the queue's qualified name (its key layout, not ours). */
export function bullmqMarkerKey(queueQualifiedName: string): string {
  return `${queueQualifiedName}:marker`;
}

/** BullMQ's rate limiter of a queue (a count with the window's TTL), by the queue's qualified name. */
export function bullmqLimiterKey(queueQualifiedName: string): string {
  return `${queueQualifiedName}:limiter`;
}

/** 2⁵³ − 1, the count BullMQ's `Queue.rateLimit` writes: more than any queue's `max`. */
const LIMITER_HELD = Number.MAX_SAFE_INTEGER;

/**
 * Holds the takes of the queue `queueQualifiedName` for `ms` (PROTOCOL.md §3.3): the limiter as BullMQ's
 * `Queue.rateLimit` writes it, for the queue a job came from (its shard's, in the sharded layout), with no Queue object
 * per queue; and the queue's marker due when the hold ends (BullMQ's delayed-job marker, member "1", never moved
 * later), so a worker blocked on the marker wakes then: a Worker that found the queue rate-limited blocks on the marker
 * with no timer of its own (bullmq-Python always; Node's when its take found no job), and would otherwise sleep until
 * its block timeout. One round trip (the two keys share the queue's slot).
 */
export async function holdTakes(redis: RedisClient, queueQualifiedName: string, ms: number): Promise<void> {
  const holdMs = Math.max(1, Math.ceil(ms));
  await redis
    .multi()
    .set(bullmqLimiterKey(queueQualifiedName), LIMITER_HELD, 'PX', holdMs)
    .zadd(bullmqMarkerKey(queueQualifiedName), 'LT', Date.now() + holdMs, '1')
    .exec();
}

/** A job that holds one of the gate's slots (set on the Job object BullMQ hands to the processor). */
const HOLDS_SLOT = Symbol('taskrelay.holdsSlot');
/** Stops the renewal of the lock of a job's run: set by the GatedWorker running it, while it runs. */
const UNTRACK_LOCK = Symbol('taskrelay.untrackLock');
type Tagged = { [HOLDS_SLOT]?: true; [UNTRACK_LOCK]?: () => void };

/**
 * `Job.moveToWait` (the job back at the front of its priority, attempts kept), with its run's lock no longer renewed
 * first. BullMQ's lock manager renews every lock it tracks on its own timer, and tracks a job until its processor
 * returns: a renewal that reached Redis just after the move found no lock, and the Worker said `could not renew lock
 * for job …` (an `error` event) of a job that was back in its queue as meant. Seen in 1 of 300 hand-backs with a
 * 50-ms renewal, and as a drain's hand-backs at its grace's end.
 */
export async function moveToWait(job: Job, token: string | undefined): Promise<void> {
  (job as Tagged)[UNTRACK_LOCK]?.();
  await job.moveToWait(token);
}

export interface GatedWorkerOptions extends WorkerOptions {
  gate: SlotGate;
  /** The priority level of this queue's tool (§25.1): a freed slot goes to the earliest level's Worker first. */
  level?: number;
  /** Puts this queue's "a job is waiting" marker back, for a worker elsewhere to take the job this one cannot. */
  wakeOthers: () => Promise<void>;
}

/** A BullMQ Worker of one tool queue that takes a job only with a slot of its process's gate. */
export class GatedWorker<DataType = unknown, ResultType = void> extends Worker<DataType, ResultType> {
  private readonly gate: SlotGate;
  private readonly wakeOthers: () => Promise<void>;
  private readonly level: number;
  /**
   * Jobs this Worker holds a slot for and has not started yet. BullMQ's main loop fetches in sequence before it starts
   * what it fetched: waiting for a slot there with such a job in hand would hold that job unstarted until another slot
   * frees (seen as a 7 s stall of a job on an idle slot).
   */
  private unstarted = 0;

  constructor(name: string, processor: Processor<DataType, ResultType>, options: GatedWorkerOptions) {
    const { gate, wakeOthers, level, ...workerOptions } = options;
    super(name, processor, { ...workerOptions, concurrency: gate.size });
    this.gate = gate;
    this.wakeOthers = wakeOthers;
    this.level = level ?? 3;
  }

  protected override async moveToActive(token: string, name?: string): Promise<Job<DataType, ResultType>> {
    if (!this.gate.tryAcquire()) {
      await this.wakeOthers().catch(() => undefined);
      // "No job now": BullMQ starts what it has fetched, then comes back here.
      if (this.unstarted > 0) return undefined as unknown as Job<DataType, ResultType>;
      if (!(await this.gate.acquire(this.level))) return undefined as unknown as Job<DataType, ResultType>;
    }
    let job: Job<DataType, ResultType> | undefined;
    try {
      job = await super.moveToActive(token, name);
    } finally {
      if (job) {
        (job as Tagged)[HOLDS_SLOT] = true;
        this.unstarted += 1;
      } else {
        this.gate.release();
      }
    }
    return job;
  }

  protected override createJob(data: JobJson, jobId: string): Job<DataType, ResultType> {
    try {
      return super.createJob(data, jobId);
    } catch (error) {
      if (!(error instanceof SyntaxError)) throw error;
      const reason = `its stored data is not valid JSON (${error.message})`;
      return super.createJob({ ...data, data: JSON.stringify({ [UNREADABLE_JOB_DATA]: reason }) }, jobId);
    }
  }

  override async processJob(
    job: Job<DataType, ResultType>,
    token: string,
    fetchNextCallback: () => boolean = () => true,
  ): Promise<void | Job<DataType, ResultType>> {
    let next: void | Job<DataType, ResultType> = undefined;
    if ((job as Tagged)[HOLDS_SLOT]) this.unstarted = Math.max(0, this.unstarted - 1);
    const jobId = job.id;
    if (jobId !== undefined) (job as Tagged)[UNTRACK_LOCK] = () => this.lockManager.untrackJob(jobId);
    try {
      next = await super.processJob(job, token, fetchNextCallback);
    } finally {
      delete (job as Tagged)[UNTRACK_LOCK];
      if ((job as Tagged)[HOLDS_SLOT]) {
        delete (job as Tagged)[HOLDS_SLOT];
        // The next job fetched with this one's completion takes its slot over.
        if (next && typeof next === 'object') {
          (next as Tagged)[HOLDS_SLOT] = true;
          this.unstarted += 1;
        } else {
          this.gate.release();
        }
      }
    }
    return next;
  }

  protected override handleCompleted(
    result: ResultType,
    job: Job<DataType, ResultType>,
    token: string,
    fetchNextCallback: () => boolean = () => true,
    span?: Parameters<Worker<DataType, ResultType>['handleCompleted']>[4],
  ): Promise<Job<DataType, ResultType>> {
    // The slot passes to the next job only when no other tool's Worker waits for one (they go first).
    return super.handleCompleted(result, job, token, () => fetchNextCallback() && this.gate.waiting === 0, span);
  }

  protected override handleFailed(
    err: Error,
    job: Job<DataType, ResultType>,
    token: string,
    _fetchNextCallback?: () => boolean,
    span?: Parameters<Worker<DataType, ResultType>['handleFailed']>[4],
  ): Promise<Job<DataType, ResultType>> {
    // Never fetch with a failure or a delay: BullMQ's delayed path fetches through `moveToActive`, which would wait
    // for a slot while this job still holds one.
    return super.handleFailed(err, job, token, () => false, span);
  }
}

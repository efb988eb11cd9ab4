/**
 * One process-wide limit over the BullMQ Workers of a worker's tool queues (PROTOCOL.md §3.2). Hand-written because
 * BullMQ (OSS) has no worker that consumes several queues, and its `concurrency` is per Worker: N tool queues with
 * `concurrency: C` each would run up to N × C jobs in one process. The gate sits where BullMQ takes a job
 * (`moveToActive`, protected in BullMQ 6 for this kind of extension) and where it ends one (`processJob`), so a job
 * holds a slot from the moment it is taken until its Worker is done with it.
 *
 * - A full process takes nothing: a Worker whose queue's marker woke it while every slot is busy puts the marker back
 *   (so a worker of another process with a free slot wakes and takes the job) and waits for a slot here, holding no
 *   job and no lock.
 * - A freed slot goes to the waiting Worker of the earliest priority level (its tool's, PROTOCOL.md §25.1), the
 *   longest waiting first within a level; when none waits, a finishing job hands its slot to the next job BullMQ
 *   fetches with its completion (the same round trip, as BullMQ does alone).
 * - A failed or delayed job (suspend, hand-back, retry) fetches nothing with its move: its slot is freed, and the next
 *   job comes through `moveToActive` like any other.
 */
import { Worker, type Job, type JobJson, type WorkerOptions, type Processor } from 'bullmq';

/**
 * The key of the data a job gets when its stored data is not JSON (issue 48 F5): `{ [UNREADABLE_JOB_DATA]: reason }`.
 * BullMQ parses the data while it takes the job, outside any processor: the parse error left the job active and
 * unprocessed, taken again at each stall check and never failed. With this data it reaches the processor, which fails
 * its task with the reason.
 */
export const UNREADABLE_JOB_DATA = 'taskrelay.unreadableJobData';

/** A job that holds one of the gate's slots (set on the Job object BullMQ hands to the processor). */
const HOLDS_SLOT = Symbol('taskrelay.holdsSlot');
type Tagged = { [HOLDS_SLOT]?: true };

export class SlotGate {
  private used = 0;
  private readonly waiters: Array<{ level: number; grant: (granted: boolean) => void }> = [];
  private closed = false;

  constructor(readonly size: number) {}

  /** Slots in use now. */
  get inUse(): number {
    return this.used;
  }

  /** Workers waiting for a slot now. */
  get waiting(): number {
    return this.waiters.length;
  }

  tryAcquire(): boolean {
    if (this.closed || this.used >= this.size) return false;
    this.used += 1;
    return true;
  }

  /** Resolves true with a slot, or false when the gate closed first. `level`: 1 is served first (§25.1). */
  acquire(level = 3): Promise<boolean> {
    if (this.tryAcquire()) return Promise.resolve(true);
    if (this.closed) return Promise.resolve(false);
    return new Promise((grant) => {
      // Kept sorted by level, first come first within one: the head is the next to be served.
      const at = this.waiters.findIndex((w) => w.level > level);
      this.waiters.splice(at === -1 ? this.waiters.length : at, 0, { level, grant });
    });
  }

  /** A slot is free: it goes straight to the first waiting Worker, if any. */
  release(): void {
    const next = this.waiters.shift();
    if (next) next.grant(true);
    else this.used = Math.max(0, this.used - 1);
  }

  /** Shutting down: every waiter gets no slot (its Worker takes nothing more). */
  close(): void {
    this.closed = true;
    for (const waiter of this.waiters.splice(0)) waiter.grant(false);
  }
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
    try {
      next = await super.processJob(job, token, fetchNextCallback);
    } finally {
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

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
 *
 * The BullMQ Worker that takes its jobs through the gate, `GatedWorker`, is in `bullmq-adapter.ts`, with every other
 * use of BullMQ's internals.
 */

/**
 * The key of the data a job gets when its stored data is not JSON (issue 48 F5): `{ [UNREADABLE_JOB_DATA]: reason }`.
 * BullMQ parses the data while it takes the job, outside any processor: the parse error left the job active and
 * unprocessed, taken again at each stall check and never failed. With this data it reaches the processor, which fails
 * its task with the reason.
 */
export const UNREADABLE_JOB_DATA = 'taskrelay.unreadableJobData';

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

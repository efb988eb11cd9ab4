import type { CancelReason, Logger } from '@taskrelay/shared';

/** How long, and how many, cancels that found no run are kept for a run about to register (PROTOCOL.md §21.2.1). */
const UNDELIVERED_MS = 30_000;
const UNDELIVERED_MAX = 10_000;

/** One running job: its abort controller and the grace timer armed when it aborts. */
export interface RunningJob {
  readonly controller: AbortController;
  graceTimer: NodeJS.Timeout | undefined;
  /** Whom the task belongs to, for the cancel log lines (known once the task is read). */
  principal?: string;
  /** When BullMQ last renewed (or took) this job's lock: the lock watch's clock (PROTOCOL.md §10.4). */
  lockRenewedAt: number;
  /** When its signal aborted (the cancel-latency clock). */
  abortedAt?: number;
  /** For a batch child (PROTOCOL.md §26): its parent task, whose cancel aborts it. */
  parentId?: string;
  /**
   * The tool has returned and the run is writing its own end (issue 48 F6): the cancel sweep leaves it alone, or it
   * would read the terminal status the run itself just wrote and take it for another's (`LOCK_LOST`). The end's
   * writes are lock- and status-checked themselves.
   */
  settling?: true;
  /** Gives back what the run holds of its tool's limits (PROTOCOL.md §3.5); the envelope calls it as the run ends. */
  release?: () => Promise<void>;
}

/**
 * The jobs this worker runs, keyed by job id (= task id): one `AbortController` each. An entry is removed only by the
 * run that added it, so a job handed back and fetched again by this worker never loses its new controller.
 */
export class RunningJobs {
  private readonly jobs = new Map<string, RunningJob>();
  /** Cancels that found no run here, by task, oldest first (`cancel`, `add`). */
  private readonly undelivered = new Map<string, { reason: CancelReason; at: number }>();

  /**
   * @param onCount called with the number of runs after each run registers or leaves: the worker switches its command
   * connection's batching by it (PROTOCOL.md §21.2.2).
   */
  constructor(
    private readonly log: Logger,
    private readonly onCount: (runs: number) => void = () => undefined,
  ) {}

  get size(): number {
    return this.jobs.size;
  }

  /**
   * Registered before anything is read, so a cancel arriving during the start check is not lost. A cancel that came
   * for this task before it was registered (its job fetched as the gateway cancelled it, PROTOCOL.md §21.2.1) aborts
   * the new entry at once, so a first run, whose start it does not wait for, does not run the tool.
   */
  add(taskId: string): RunningJob {
    const entry: RunningJob = { controller: new AbortController(), graceTimer: undefined, lockRenewedAt: Date.now() };
    this.jobs.set(taskId, entry);
    this.onCount(this.jobs.size);
    const early = this.undelivered.get(taskId);
    if (early !== undefined) {
      this.undelivered.delete(taskId);
      if (Date.now() - early.at <= UNDELIVERED_MS)
        this.abort(taskId, early.reason, 'cancel received before the run began');
    }
    return entry;
  }

  /**
   * A cancel message for a task with no run here: kept a while, for a run about to register (`add`). Bounded: the
   * oldest go first. Most are for tasks other workers run, and expire unused.
   */
  private keepUndelivered(taskId: string, reason: CancelReason): void {
    if (this.undelivered.size >= UNDELIVERED_MAX) {
      const oldest = this.undelivered.keys().next().value;
      if (oldest !== undefined) this.undelivered.delete(oldest);
    }
    this.undelivered.set(taskId, { reason, at: Date.now() });
  }

  get(taskId: string): RunningJob | undefined {
    return this.jobs.get(taskId);
  }

  /** Removes `entry` if it is still the one held for `taskId`. */
  release(taskId: string, entry: RunningJob): void {
    if (this.jobs.get(taskId) !== entry) return;
    this.jobs.delete(taskId);
    this.onCount(this.jobs.size);
  }

  /** The running jobs whose signal has not aborted yet. */
  live(): Array<[taskId: string, entry: RunningJob]> {
    return [...this.jobs].filter(([, entry]) => !entry.controller.signal.aborted);
  }

  /** The running jobs whose tool may still be stopped: not aborted, not writing their own end (the sweep's). */
  unsettled(): Array<[taskId: string, entry: RunningJob]> {
    return this.live().filter(([, entry]) => entry.settling === undefined);
  }

  ids(): string[] {
    return [...this.jobs.keys()];
  }

  /** Aborts the run of `taskId` with `reason`, unless it is gone or already aborted. */
  abort(taskId: string, reason: CancelReason, message: string, fields: Record<string, unknown> = {}): void {
    const entry = this.jobs.get(taskId);
    if (!entry || entry.controller.signal.aborted) return;
    const level = reason === 'LOCK_LOST' ? 'warn' : 'info';
    this.log[level]({ taskId, principal: entry.principal, reason, ...fields }, message);
    entry.controller.abort(reason);
  }

  /** A cancel message (PROTOCOL.md §7): aborts the task's run here, or keeps it for a run about to register. */
  cancel(taskId: string, reason: CancelReason, message: string): void {
    if (!this.jobs.has(taskId)) {
      this.keepUndelivered(taskId, reason);
      return;
    }
    this.abort(taskId, reason, message);
  }

  /** Aborts every running child of batch `parentId` (its parent was cancelled, §26.7). */
  abortChildren(parentId: string, reason: CancelReason, message: string): void {
    for (const [jobId, entry] of this.jobs) {
      if (entry.parentId === parentId) this.abort(jobId, reason, message, { parentId });
    }
  }

  /** This worker can no longer be the job's owner: abort the run with LOCK_LOST (PROTOCOL.md §10.4). */
  loseLock(taskId: string, why: string): void {
    this.abort(taskId, 'LOCK_LOST', 'job lock lost; aborting tool', { why });
  }

  /** BullMQ renewed these jobs' locks. */
  renewed(jobIds: readonly string[], now = Date.now()): void {
    for (const id of jobIds) {
      const entry = this.jobs.get(id);
      if (entry) entry.lockRenewedAt = now;
    }
  }

  /**
   * The lock watch: no renewal for `limitMs` (Redis unreachable, say) means BullMQ's lock is about to expire and
   * another worker may take the job at the next stalled check, so this run stops first (PROTOCOL.md §10.4).
   */
  loseUnrenewed(limitMs: number, now = Date.now()): void {
    const cutoff = now - limitMs;
    for (const [taskId, entry] of this.jobs) {
      if (entry.lockRenewedAt < cutoff) this.loseLock(taskId, `no lock renewal for ${limitMs} ms`);
    }
  }
}

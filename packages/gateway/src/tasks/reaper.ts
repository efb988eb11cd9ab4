/**
 * The reaper (PROTOCOL.md §10.3): no task stays non-terminal for ever. Every gateway runs it; a lease in Redis lets
 * one at a time do the work. It depends on no in-process event: what it judges is in Redis (the task's deadline, its
 * BullMQ job), so a dead gateway or worker, a stall-failed or evicted job all end in a terminal task.
 */
import type { Logger, TaskStore } from '@taskrelay/shared';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';

export interface ReaperOptions {
  /** This gateway's id: the lease holder. */
  holder: string;
  /** How often a pass runs. */
  intervalMs: number;
  /** Tasks looked at per script call; a full batch runs another call at once. Default 500. */
  batch?: number;
  /**
   * Once per pass of the lease holder: drops from the operators' task index the ids of tasks that are gone
   * (PROTOCOL.md §30.2); resolves with how many.
   */
  pruneIndex?: () => Promise<number>;
}

export class Reaper {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  private readonly batch: number;

  constructor(
    private readonly store: TaskStore,
    private readonly log: Logger,
    private readonly metrics: GatewayMetrics,
    private readonly options: ReaperOptions,
  ) {
    this.batch = options.batch ?? 500;
  }

  start(): void {
    this.schedule();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running;
  }

  /** One pass now (tests and shutdown use it); resolves when done. Never rejects. */
  async pass(): Promise<void> {
    this.running ??= this.run().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      void this.pass().finally(() => this.schedule());
    }, this.options.intervalMs);
    this.timer.unref();
  }

  private async run(): Promise<void> {
    try {
      // Bounded: a backlog is worked off over passes, never in one long loop.
      let held = false;
      for (let round = 0; round < 20 && !this.stopped; round++) {
        const outcome = await this.store.runs.reap(this.options.holder, {
          batch: this.batch,
          leaseMs: this.options.intervalMs * 3,
        });
        held ||= outcome.ran;
        for (const task of outcome.reaped) {
          this.metrics.tasksReaped.inc({ code: task.code });
          this.log.warn({ taskId: task.taskId, code: task.code, statusMessage: task.message }, 'reaper failed a task');
        }
        if (!outcome.ran || outcome.looked < this.batch) break;
      }
      if (held && !this.stopped && this.options.pruneIndex) {
        const dropped = await this.options.pruneIndex();
        if (dropped > 0) this.log.debug({ dropped }, 'task index pruned of tasks that are gone');
      }
    } catch (error) {
      this.log.warn({ err: error }, 'reaper pass failed; retrying next interval');
    }
  }
}

/**
 * The cancel watch (PROTOCOL.md §7): cancel messages on the cancel channel abort a running tool at once; a periodic
 * sweep re-reads the status of every running task, so a message missed (a subscriber reconnect, say) still aborts it.
 * In the sharded layout the worker listens on the cancel channel of each shard of its tools only (§1.2).
 */
import {
  CancelRequestSchema,
  isTerminal,
  messageEvent,
  parseMessage,
  subscribeTo,
  type CancelReason,
  type Keys,
  type Logger,
  type RedisClient,
  type TaskStore,
} from '@taskrelay/shared';
import type { RunningJobs } from './running-jobs.js';

export interface CancelWatchOptions {
  subscriber: RedisClient;
  keys: Keys;
  store: TaskStore;
  running: RunningJobs;
  log: Logger;
  sweepMs: number;
}

export class CancelWatch {
  private timer: NodeJS.Timeout | undefined;
  private sweeping = false;
  private readyBefore = false;
  private channels: ReadonlySet<string> = new Set();

  constructor(private readonly o: CancelWatchOptions) {}

  /** Listens on `channels`: the home `cancelChannel` in the single layout, each tool shard's in the sharded one. */
  async start(channels: readonly string[]): Promise<void> {
    const { subscriber, keys } = this.o;
    this.channels = new Set(channels);
    subscriber.on(messageEvent(keys), (channel: string, raw: string) => this.onMessage(channel, raw));
    subscriber.on('ready', () => {
      // ioredis re-subscribes by itself after a reconnect; what we may have missed meanwhile is read from the hashes.
      if (this.readyBefore) {
        this.o.log.info('cancel subscriber reconnected; re-reading the status of running tasks');
        void this.sweep();
      }
      this.readyBefore = true;
    });
    // A Cluster's sharded subscribers (the sharded layout, §1.2) reconnect apart from the cluster: ioredis re-subscribes
    // them and says `subscribersReady` (at the start too, before or after our subscriptions: every one after them
    // sweeps, which is harmless).
    let started = false;
    subscriber.on('subscribersReady', () => {
      if (!started) return;
      this.o.log.info('cancel subscribers re-subscribed; re-reading the status of running tasks');
      void this.sweep();
    });
    await subscribeTo(subscriber, keys, channels);
    started = true;
    this.timer = setInterval(() => void this.sweep(), this.o.sweepMs).unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private onMessage(channel: string, raw: string): void {
    if (!this.channels.has(channel)) return;
    const request = parseMessage(CancelRequestSchema, raw);
    if (!request) {
      this.o.log.warn({ raw: raw.slice(0, 200) }, 'malformed cancel message ignored');
      return;
    }
    this.o.running.cancel(request.taskId, request.reason, 'cancel received; aborting tool');
    this.o.running.abortChildren(request.taskId, request.reason, 'parent cancelled; aborting batch child');
  }

  /** Aborts every running tool whose task is no longer live in Redis: the durable half of §7. */
  async sweep(): Promise<void> {
    if (this.sweeping) return;
    const entries = this.o.running.unsettled();
    if (entries.length === 0) return;
    this.sweeping = true;
    try {
      // A batch child has no task of its own: it lives while its parent does (§26.7).
      const states = await this.o.store.records.endStates(entries.map(([taskId, entry]) => entry.parentId ?? taskId));
      let unread = 0;
      entries.forEach(([taskId, entry], i) => {
        const state = states[i];
        // A read that failed (a failover) says nothing about the task: no abort (PROTOCOL.md §10.10).
        if (state === undefined) {
          unread += 1;
          return;
        }
        if (state.status !== undefined && !isTerminal(state.status)) return;
        // Only the run the states were read for: a job fetched again since has a controller of its own.
        // A run that began writing its own end during the read may have written the status read here (issue 48 F6).
        if (this.o.running.get(taskId) !== entry || entry.settling !== undefined) return;
        this.o.running.abort(taskId, sweptReason(state), 'task no longer live; aborting tool', {
          status: state.status ?? 'missing',
        });
      });
      if (unread > 0) this.o.log.warn({ unread }, 'cancel sweep could not read some running tasks; left running');
    } catch (error) {
      this.o.log.warn({ err: error }, 'cancel sweep failed');
    } finally {
      this.sweeping = false;
    }
  }
}

/**
 * The abort reason for a run whose task ended without it: the cancel's own reason, TIMEOUT for a deadline the reaper
 * enforced, and LOCK_LOST when the outcome is someone else's (another run finished it, or it is gone).
 */
export function sweptReason(
  state: { status: string | undefined; cancelReason?: CancelReason; errorCode?: string } | undefined,
): CancelReason {
  if (state?.status === 'cancelled') return state.cancelReason ?? 'CLIENT_CANCELLED';
  if (state?.status === 'failed' && state.errorCode === 'TIMEOUT') return 'TIMEOUT';
  return 'LOCK_LOST';
}

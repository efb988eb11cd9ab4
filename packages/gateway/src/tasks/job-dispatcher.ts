/**
 * Turns tasks into BullMQ jobs and carries cancels to whichever worker holds them (PROTOCOL.md §4, §7).
 */
import { Queue } from 'bullmq';
import {
  FairShare,
  type RedisClient,
  TaskrelayError,
  type CancelReason,
  type CancelRequest,
  type JobData,
  type Keys,
  type Logger,
} from '@taskrelay/shared';
import type { CatalogTool } from './catalog.js';

/** Events BullMQ keeps per queue (its `events` stream): nothing of ours reads them, so a short tail is enough. */
const QUEUE_EVENTS_MAX_LEN = 1_000;
/** How long a fair-share entry outlives its job's longest possible wait and run (PROTOCOL.md §25). */
const FAIR_SHARE_SLACK_MS = 60_000;

/** How long a job's fair-share entry is kept: its longest wait and run, and a minute (PROTOCOL.md §25). */
export function fairShareTtlMs(data: Pick<JobData, 'queueTimeoutMs' | 'timeoutMs'>): number {
  return (data.queueTimeoutMs ?? 0) + (data.timeoutMs ?? 0) + FAIR_SHARE_SLACK_MS;
}

export interface JobDispatcherOptions {
  /**
   * How long a queue that was never connected may take to become ready before the call fails as "task store
   * unavailable" (BullMQ would otherwise wait for Redis indefinitely). Default 2000 ms.
   */
  readyTimeoutMs?: number;
}

export class JobDispatcher {
  private readonly queues = new Map<string, Queue>();
  private readonly readyTimeoutMs: number;
  private readonly fairShare: FairShare;

  /**
   * @param connection the dispatcher's own connection (fail-fast options, see `FAIL_FAST_REDIS_OPTIONS`), shared by its
   *   queues, so BullMQ's scripts and traffic stay off the gateway's command connection. The caller closes it.
   */
  constructor(
    private readonly connection: RedisClient,
    private readonly keys: Keys,
    private readonly log: Logger,
    options: JobDispatcherOptions = {},
  ) {
    this.readyTimeoutMs = options.readyTimeoutMs ?? 2_000;
    this.fairShare = new FairShare(connection, keys);
  }

  /**
   * Adds the task's job to its pool with its principal's fair-share priority (PROTOCOL.md §25): behind the jobs of
   * principals with shorter backlogs, never behind a whole backlog of another's.
   */
  async enqueue(tool: CatalogTool, data: JobData, entered?: { priority: number }): Promise<void> {
    const queue = await this.ready(tool.queue);
    const principal = data.principal ?? '';
    // `entered`: the task's creation already entered the job in its share (one round trip fewer, §25).
    const priority =
      entered?.priority ?? (await this.fairShare.enter(tool.queue, principal, data.taskId, fairShareTtlMs(data)));
    const added = queue.add(tool.name, data, {
      jobId: data.taskId,
      priority,
      attempts: tool.attempts ?? 1,
      ...(tool.backoff === undefined
        ? {}
        : { backoff: { type: tool.backoff.type, delay: tool.backoff.delayMs, jitter: tool.backoff.jitter ?? 0 } }),
      // The task hash holds the result; the job is only the work item. Failed ones (cancels included) stay a little
      // while for inspection, bounded per queue (bounded Redis, issue 9).
      removeOnComplete: true,
      removeOnFail: { age: 3600, count: 1_000 },
    });
    try {
      await added;
    } catch (error) {
      await this.fairShare.leave(tool.queue, principal, data.taskId).catch(() => undefined);
      throw error;
    }
  }

  /**
   * Called after the task is already `cancelled` in its hash. A waiting job is removed so it never starts; a running
   * one is aborted by the worker that holds it, which the pub/sub message wakes (the hash is the durable record).
   */
  async cancel(taskId: string, queueName: string, reason: CancelReason, principal?: string): Promise<void> {
    try {
      const queue = await this.ready(queueName);
      // A delayed job (a suspended run, PROTOCOL.md §12.8) is promoted: one last run finds the task cancelled and
      // lets the tool stop what it started outside (`onCancelled`). A waiting one is removed, unless a worker holds
      // its lock (then that worker sees the cancel instead).
      const job = await queue.getJob(taskId);
      if (job && (await job.isDelayed())) await job.promote();
      else {
        await queue.remove(taskId);
        // A job removed before any worker took it leaves its principal's share here (a taken one left at its start).
        if (principal !== undefined) await this.fairShare.leave(queueName, principal, taskId);
      }
    } catch (error) {
      this.log.debug({ taskId, err: error }, 'job not removed from queue');
    }
    const message: CancelRequest = { taskId, reason };
    await this.connection.publish(this.keys.cancelChannel, JSON.stringify(message));
  }

  /**
   * Moves a suspended task's delayed job to the wait list, so a worker resumes it now (PROTOCOL.md §12.3). A job that
   * is not delayed (still active, already resumed, gone) is left alone: the worker's own check covers it (§12.4).
   */
  async promote(taskId: string, queueName: string): Promise<void> {
    try {
      const job = await (await this.ready(queueName)).getJob(taskId);
      await job?.promote();
    } catch (error) {
      this.log.debug({ taskId, err: error }, 'job not promoted (not delayed)');
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }

  /** The queue, once BullMQ has set it up; a queue first used while Redis is away fails fast instead of waiting. */
  private async ready(name: string): Promise<Queue> {
    const queue = this.queue(name);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(
        () => reject(new TaskrelayError('REDIS_UNAVAILABLE', `Queue ${name} could not connect to Redis`)),
        this.readyTimeoutMs,
      );
    });
    try {
      await Promise.race([queue.waitUntilReady(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
    return queue;
  }

  private queue(name: string): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(this.keys.queueName(name), {
        connection: this.connection,
        prefix: this.keys.bullPrefix,
        streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
      });
      queue.on('error', (error) => this.log.warn({ err: error, queue: name }, 'queue error'));
      this.queues.set(name, queue);
    }
    return queue;
  }
}

/**
 * Turns tasks into BullMQ jobs and carries cancels to whichever worker holds them (PROTOCOL.md §4, §7).
 */
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { CancelReason, CancelRequest, JobData, Keys, Logger } from '@taskrelay/shared';
import type { CatalogTool } from './catalog.js';

export class JobDispatcher {
  private readonly queues = new Map<string, Queue>();

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly log: Logger,
  ) {}

  async enqueue(tool: CatalogTool, data: JobData): Promise<void> {
    await this.queue(tool.queue).add(tool.name, data, {
      jobId: data.taskId,
      attempts: tool.attempts ?? 1,
      ...(tool.backoff === undefined
        ? {}
        : { backoff: { type: tool.backoff.type, delay: tool.backoff.delayMs, jitter: tool.backoff.jitter ?? 0 } }),
      // The task hash holds the result; the job is only the work item.
      removeOnComplete: true,
      removeOnFail: { age: 24 * 3600, count: 10_000 },
    });
  }

  /**
   * Called after the task is already `cancelled` in its hash. A waiting job is removed so it never starts; a running
   * one is aborted by the worker that holds it, which the pub/sub message wakes (the hash is the durable record).
   */
  async cancel(taskId: string, queueName: string, reason: CancelReason): Promise<void> {
    try {
      // One script: removes the job unless a worker holds its lock (then the worker sees the cancel instead).
      await this.queue(queueName).remove(taskId);
    } catch (error) {
      this.log.debug({ taskId, err: error }, 'job not removed from queue');
    }
    const message: CancelRequest = { taskId, reason };
    await this.redis.publish(this.keys.cancelChannel, JSON.stringify(message));
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }

  private queue(name: string): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(this.keys.queueName(name), { connection: this.redis, prefix: this.keys.bullPrefix });
      queue.on('error', (error) => this.log.warn({ err: error, queue: name }, 'queue error'));
      this.queues.set(name, queue);
    }
    return queue;
  }
}

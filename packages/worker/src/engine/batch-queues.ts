/**
 * BullMQ queues of the pools a batch touches (PROTOCOL.md §26): a parent adds its children's jobs to the child tool's
 * pool, and a child promotes its parent's job in the parent's pool. One `Queue` per pool, on the worker's command
 * connection (a `Queue` never blocks), made on first use.
 */
import { Queue } from 'bullmq';
import type { Keys, Logger, RedisClient } from '@taskrelay/shared';

/** BullMQ's events stream per queue: nothing of ours reads it (as the gateway's dispatcher). */
const QUEUE_EVENTS_MAX_LEN = 1_000;

export class BatchQueues {
  private readonly queues = new Map<string, Queue>();

  constructor(
    private readonly connection: RedisClient,
    private readonly keys: Keys,
    private readonly log: Logger,
  ) {}

  /** The queue of a pool, under the BullMQ prefix of `keys` (a shard's in the sharded layout, PROTOCOL.md §1.1). */
  get(pool: string, keys: Keys = this.keys): Queue {
    const id = keys.bullPrefix === this.keys.bullPrefix ? pool : `${keys.bullPrefix}\n${pool}`;
    let queue = this.queues.get(id);
    if (!queue) {
      queue = new Queue(keys.queueName(pool), {
        connection: this.connection,
        prefix: keys.bullPrefix,
        streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
      });
      queue.on('error', (error) => this.log.warn({ err: error, queue: pool }, 'batch queue error'));
      this.queues.set(id, queue);
    }
    return queue;
  }

  /** Moves a delayed job to the queue now; a job that is not delayed (running, gone) is left alone. */
  async promote(pool: string, jobId: string): Promise<boolean> {
    try {
      const job = await this.get(pool, this.keys.forTask(jobId)).getJob(jobId);
      if (!job) return false;
      await job.promote();
      return true;
    } catch {
      return false;
    }
  }

  async close(): Promise<void> {
    // The connection is the worker's; closing a Queue built on a given connection leaves it open.
    await Promise.all([...this.queues.values()].map((queue) => queue.close().catch(() => undefined)));
    this.queues.clear();
  }
}

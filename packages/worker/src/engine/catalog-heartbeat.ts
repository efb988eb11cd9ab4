/**
 * The catalog heartbeat (PROTOCOL.md §3): this worker's tool catalog, written with an expiry of three beats and
 * listed in the live-worker set, so a gateway routes only to workers that are alive and a dead one drops out. Each beat
 * also leaves the pool's catalog in `P:pools`, which outlives the worker: a pool scaled to zero keeps its tools listed
 * for the gateway's catalog retention (§24).
 */
import type { Keys, Logger, PoolCatalog, RedisClient, ToolDescriptor, WorkerCatalog } from '@taskrelay/shared';

/** Worker ids whose heartbeat expired this long ago are pruned from the live set by any worker. */
const PRUNE_DEAD_WORKERS_AFTER_MS = 3_600_000;

export interface CatalogHeartbeatOptions {
  redis: RedisClient;
  keys: Keys;
  workerId: string;
  /** The pool this worker consumes (PROTOCOL.md §3.2). */
  queue: string;
  /** Its `TASKRELAY_QUEUE` name, before the tool digest. */
  queueName: string;
  tools: readonly ToolDescriptor[];
  heartbeatMs: number;
  log: Logger;
}

export class CatalogHeartbeat {
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;

  constructor(private readonly o: CatalogHeartbeatOptions) {}

  /** Publishes the catalog once (a failure throws: the worker does not start unlisted), then on every beat. */
  async start(): Promise<void> {
    await this.publish();
    this.timer = setInterval(() => this.beat(), this.o.heartbeatMs).unref();
  }

  /** Stops beating and waits for a beat in flight, so `remove` is the last write. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.inFlight;
  }

  /** Takes the catalog down: gateways stop routing here at once instead of after three missed beats. */
  async remove(): Promise<void> {
    const { redis, keys, workerId } = this.o;
    await redis.multi().del(keys.workerCatalog(workerId)).zrem(keys.workers, workerId).exec();
  }

  private async publish(): Promise<void> {
    const { redis, keys, workerId } = this.o;
    const now = Date.now();
    const ttlMs = 3 * this.o.heartbeatMs;
    const catalog: WorkerCatalog = {
      workerId,
      queue: this.o.queue,
      queueName: this.o.queueName,
      tools: [...this.o.tools],
      heartbeatAt: now,
    };
    const pool: PoolCatalog = {
      pool: this.o.queue,
      queueName: this.o.queueName,
      tools: [...this.o.tools],
      lastSeenAt: now,
    };
    const replies = await redis
      .multi()
      .set(keys.workerCatalog(workerId), JSON.stringify(catalog), 'PX', ttlMs)
      .zadd(keys.workers, now + ttlMs, workerId)
      .hset(keys.pools, this.o.queue, JSON.stringify(pool))
      .zremrangebyscore(keys.workers, '-inf', now - PRUNE_DEAD_WORKERS_AFTER_MS)
      .exec();
    const failed = replies?.find(([error]) => error);
    if (failed?.[0]) throw failed[0];
  }

  private beat(): void {
    // Skip a beat rather than queue writes behind a slow or reconnecting Redis.
    if (this.inFlight) return;
    this.inFlight = this.publish()
      .catch((error: unknown) => this.o.log.warn({ err: error }, 'heartbeat failed'))
      .finally(() => {
        this.inFlight = undefined;
      });
  }
}

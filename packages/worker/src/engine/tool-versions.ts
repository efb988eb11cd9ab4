/**
 * Tool versions across a deploy (PROTOCOL.md §12.11): whether a run should leave a task to a live worker of the version
 * the task last ran, and for how long. The catalog is the truth about who is alive; the deferral window is a
 * timestamp in Redis with an expiry, so every worker of the new version agrees on when to stop deferring.
 */
import { WorkerCatalogSchema, catalogQueueName, type Keys, type RedisClient } from '@taskrelay/shared';

export interface ToolVersionsOptions {
  redis: RedisClient;
  keys: Keys;
  /** This worker's `TASKRELAY_QUEUE`: only workers of the same one consume the same tool queue. */
  queueName: string;
  /** How long, from a task's first deferral, runs leave it to a worker of its version (the lock duration). */
  windowMs: number;
}

export class ToolVersions {
  constructor(private readonly o: ToolVersionsOptions) {}

  /** True while a live worker of this queue name serves `tool` at `version` (by its catalog). */
  async liveWorkerServes(tool: string, version: string): Promise<boolean> {
    const { redis, keys, queueName } = this.o;
    const ids = await redis.zrangebyscore(keys.workers, Date.now(), '+inf');
    if (ids.length === 0) return false;
    const catalogs = await redis.mget(...ids.map((id) => keys.workerCatalog(id)));
    return catalogs.some((raw) => {
      if (raw === null) return false;
      let parsed;
      try {
        parsed = WorkerCatalogSchema.safeParse(JSON.parse(raw));
      } catch {
        return false;
      }
      return (
        parsed.success &&
        catalogQueueName(parsed.data) === queueName &&
        parsed.data.tools.some((t) => t.name === tool && t.version === version)
      );
    });
  }

  /** True while the task's deferral window, opened by its first deferral (now, if none yet), is not over. */
  async withinWindow(taskId: string): Promise<boolean> {
    const { redis, keys, windowMs } = this.o;
    const key = keys.forTask(taskId).versionWait(taskId);
    const now = Date.now();
    await redis.set(key, String(now), 'PX', windowMs * 2, 'NX');
    const first = Number(await redis.get(key));
    return !Number.isFinite(first) || now - first < windowMs;
  }
}

import type { Keys } from '../protocol/keys.js';
import type { ShardPlacement } from '../placement.js';
import type { RedisClient } from '../redis.js';
import { RunLogs } from './run-logs.js';
import { Runs } from './runs.js';
import { StoreRunner } from './store-runner.js';
import { TaskRecords, type TaskRecordsOptions } from './task-records.js';
import { Waitpoints } from './waitpoints.js';

export type TaskStoreOptions = TaskRecordsOptions;

/**
 * The Redis task store, as its aggregates over one `StoreRunner` (one connection, one script runner, one key
 * routing): `records` (create, get, list), `runs` (start, transition, suspend, progress: the lock-checked writes),
 * `logs` (kept log lines) and `waitpoints`. Gateway and worker both hold one; a caller uses the aggregate it needs.
 * This holder stays so the processes build the aggregates once and pass one value down, not four.
 */
export class TaskStore {
  /**
   * The one runner of the command connection: the other stores on it (limits, outputs, batches, the webhook outbox)
   * are built over it too, so a process loads its scripts and routes its keys once per connection.
   */
  readonly runner: StoreRunner;
  readonly records: TaskRecords;
  readonly runs: Runs;
  readonly logs: RunLogs;
  readonly waitpoints: Waitpoints;

  constructor(redis: RedisClient, keys: Keys, options: TaskStoreOptions = {}) {
    this.runner = new StoreRunner(redis, keys);
    this.records = new TaskRecords(this.runner, options);
    this.runs = new Runs(this.runner, options.reaperIntervalMs);
    this.logs = new RunLogs(this.runner);
    this.waitpoints = new Waitpoints(this.runner);
  }

  /** The placement registry, in the sharded layout (PROTOCOL.md §1.1): what a reader of every shard reads. */
  get placement(): ShardPlacement | undefined {
    return this.runner.placement;
  }

  /** The keys of every shard tasks may be on (PROTOCOL.md §1.1). */
  everyShard(): Promise<Keys[]> {
    return this.runner.everyShard();
  }

  /** Records that this build's scripts generation started (PROTOCOL.md §29.2); returns it. */
  announceScriptsGeneration(now = Date.now()): Promise<string> {
    return this.runner.announceScriptsGeneration(now);
  }
}

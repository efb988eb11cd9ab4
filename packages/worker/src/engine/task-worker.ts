/**
 * The engine behind `startWorker` (PROTOCOL.md §21): owns the connections and the lifecycle, and wires the parts that
 * each own one concern — `JobRunner` (the run of a job, `settle`), `CancelWatch` (§7), `CatalogHeartbeat` (§3) and
 * the lock watch over `RunningJobs` (§10.4).
 */
import { WaitpointOpener } from './waitpoint-host.js';
import {
  BatchStore,
  TaskStore,
  TaskOutputStore,
  BlobObjects,
  ToolLimitStore,
  createKeys,
  FairShare,
  createRedis,
  coalesceEveryCommand,
  setWriteCoalescing,
  toolPool,
  toolQueue,
  DEFAULT_PRIORITY,
  bullQueueKey,
  keyLayoutOf,
  type CancelReason,
  type Keys,
  type Logger,
  type RedisClient,
} from '@taskrelay/shared';
import type { CloseOptions, ResolvedWorkerOptions } from '../options.js';
import { CancelWatch } from './cancel-watch.js';
import { CatalogHeartbeat } from './catalog-heartbeat.js';
import { ChildRunner } from './batch-child.js';
import { BatchParent } from './batch-parent.js';
import { BatchQueues } from './batch-queues.js';
import { JobRunner } from './job-run.js';
import { ToolLimits } from './tool-limits.js';
import { ToolVersions } from './tool-versions.js';
import { RunEnvelope } from './run-envelope.js';
import { RunningJobs } from './running-jobs.js';
import { GatedWorker, bullmqMarkerKey } from './bullmq-adapter.js';
import { SlotGate } from './slot-gate.js';
import { bullLockMs } from './end-write.js';

/**
 * Where a worker is in its life, as Temporal's worker documents its `State`. Each state is entered once, in order;
 * a failed start goes from starting to failed after undoing itself, and a worker closed before it started goes to
 * stopped at once.
 * - `initialized`: built; connections created, nothing subscribed or listed.
 * - `starting`: subscribing to cancels, connecting BullMQ, publishing the first catalog.
 * - `running`: taking jobs; heartbeat, cancel sweep and lock watch on.
 * - `draining`: `close()` was called: BullMQ fetches no more (a job fetched anyway is handed back), running tools may
 *   finish within the grace and may still be cancelled; the catalog stays listed, so calls queue up for other workers.
 * - `stopping`: drained (or the grace and the abort grace are over): timers stopped, the catalog removed, connections
 *   quitting.
 * - `stopped`: every connection closed.
 * - `failed`: `start()` failed; what it had opened is closed again.
 */
export type WorkerState = 'initialized' | 'starting' | 'running' | 'draining' | 'stopping' | 'stopped' | 'failed';

/** BullMQ fails a job that stalled more than this; out of reach, since each tool has its own `maxStalls` (§10.6). */
const BULLMQ_MAX_STALLED = 1_000_000_000;

export class TaskWorker {
  readonly workerId: string;
  /** The pool of this tool set in the catalog (§3.2, §24); jobs queue per tool (`queues`). */
  readonly queue: string;
  /** Tool name → the BullMQ queue this worker consumes for it (`toolQueue`, §3.2). */
  readonly queues: ReadonlyMap<string, string>;

  private stateValue: WorkerState = 'initialized';
  private readonly options: ResolvedWorkerOptions;
  private readonly keys: Keys;
  private readonly log: Logger;
  private readonly running: RunningJobs;
  private readonly redis: RedisClient;
  private readonly subscriber: RedisClient;
  private readonly bullConnection: RedisClient;
  private readonly store: TaskStore;
  /** The object store of values stored apart (§34.7), when configured. */
  private readonly objects: BlobObjects | undefined;
  private readonly runner: JobRunner;
  private readonly cancelWatch: CancelWatch;
  private readonly heartbeat: CatalogHeartbeat;
  private readonly batchQueues: BatchQueues;
  /** One BullMQ Worker per tool queue, under one process-wide limit (`gate`). */
  private bullWorkers: GatedWorker[] = [];
  private readonly gate: SlotGate;
  private lockWatchTimer: NodeJS.Timeout | undefined;
  private starting: Promise<void> | undefined;
  private closed: Promise<void> | undefined;

  constructor(options: ResolvedWorkerOptions) {
    this.options = options;
    this.workerId = options.workerId;
    this.queue = toolPool(
      options.queue,
      options.tools.map((tool) => ({ name: tool.name, version: tool.version })),
    );
    this.queues = new Map(options.tools.map((tool) => [tool.name, toolQueue(options.queue, tool.name)]));
    this.gate = new SlotGate(options.concurrency);
    this.keys = createKeys(options.prefix, keyLayoutOf(options.redisUrl, options.prefix, options.keyLayout));
    this.log = options.logger.child({ workerId: options.workerId, queue: options.queue });
    // Several runs at once: the start, progress and end writes of one event-loop turn go to Redis as one write (one
    // system call here and in Redis, PROTOCOL.md §21.2.2); a lone run's go at once. BullMQ's own calls (its take and
    // its finish) on its connection too.
    this.running = new RunningJobs(this.log, (runs) => {
      setWriteCoalescing(this.redis, runs > 1);
      setWriteCoalescing(this.bullConnection, runs > 1);
    });
    options.metrics.watchSlots(() => this.running.size, options.concurrency);
    this.redis = this.connect('commands');
    // Sharded pub/sub in the sharded layout: on a cluster each cancel channel is subscribed on its shard's master.
    this.subscriber = this.connect('cancel', { shardedSubscribers: this.keys.layout === 'sharded' });
    this.bullConnection = this.connect('bullmq');
    coalesceEveryCommand(this.bullConnection);
    this.store = new TaskStore(this.redis, this.keys);
    const tools = new Map(options.tools.map((tool) => [tool.name, tool]));
    const fairShare = new FairShare(this.store.runner);
    const isClosing = () => this.stateValue !== 'running' && this.stateValue !== 'starting';
    // Batches (§26): the parent's fan-out and the child runs share one store and one set of queues.
    const batchStore = new BatchStore(this.store.runner);
    const envelope = new RunEnvelope({
      running: this.running,
      metrics: options.metrics,
      abortGraceMs: options.abortGraceMs,
      wakeWorkers: (queueQualifiedName) => this.wakeWorkers(queueQualifiedName),
    });
    this.batchQueues = new BatchQueues(this.redis, this.keys, this.log);
    // Per-key and shared limits (§3.5) and every rate limit's exact count (§3.3): only tools that declare one ask; the
    // rest never reach Redis for it.
    const limits = new ToolLimits({
      store: new ToolLimitStore(this.store.runner),
      redis: this.redis,
      queues: this.batchQueues,
      leaseMs: options.lockDurationMs,
      metrics: options.metrics,
      log: this.log,
    });
    this.objects = options.blobStore.kind === 's3' ? new BlobObjects(options.blobStore) : undefined;
    const output = new TaskOutputStore(this.store.runner, options.output, this.objects);
    const parent = new BatchParent({
      redis: this.redis,
      keys: this.keys,
      store: batchStore,
      queues: this.batchQueues,
      ownQueueName: options.queue,
      tools,
      metrics: options.metrics,
      ...(this.store.placement === undefined ? {} : { placement: this.store.placement }),
    });
    const batches = {
      parent,
      children: new ChildRunner({
        output,
        tools,
        batches: batchStore,
        store: this.store.runs,
        queues: this.batchQueues,
        fairShare,
        metrics: options.metrics,
        log: this.log,
        progressIntervalMs: options.progressIntervalMs,
        isClosing,
        envelope,
        limits,
        releaseNext: (parentId, maxOpen, level, log) => parent.releaseFromChild(parentId, maxOpen, level, log),
        outageWindowMs: bullLockMs(options.lockDurationMs),
      }),
    };
    this.runner = new JobRunner({
      output,
      workerId: this.workerId,
      tools,
      store: this.store,
      fairShare,
      batches,
      running: this.running,
      metrics: options.metrics,
      log: this.log,
      lockDurationMs: options.lockDurationMs,
      progressIntervalMs: options.progressIntervalMs,
      isClosing,
      envelope,
      limits,
      waitpoints: new WaitpointOpener({
        redis: this.redis,
        keys: this.keys,
        store: this.store.waitpoints,
        secret: options.waitpointSecret,
      }),
      versions: new ToolVersions({
        redis: this.redis,
        keys: this.keys,
        queueName: options.queue,
        windowMs: options.lockDurationMs,
      }),
    });
    this.cancelWatch = new CancelWatch({
      subscriber: this.subscriber,
      keys: this.keys,
      store: this.store,
      running: this.running,
      log: this.log,
      sweepMs: options.cancelSweepMs,
    });
    this.heartbeat = new CatalogHeartbeat({
      redis: this.redis,
      keys: this.keys,
      workerId: this.workerId,
      queue: this.queue,
      queueName: options.queue,
      tools: options.tools.map((tool) => tool.descriptor),
      heartbeatMs: options.heartbeatMs,
      log: this.log,
    });
  }

  get state(): WorkerState {
    return this.stateValue;
  }

  start(): Promise<void> {
    this.starting ??= this.open();
    return this.starting;
  }

  private async open(): Promise<void> {
    this.enter('starting', ['initialized']);
    try {
      const shards = await this.toolShards();
      // Before any job is taken: a cancel published from now on is heard. In the sharded layout, the cancel channel of
      // each shard this worker consumes, and no other tool's (§1.2).
      await this.cancelWatch.start(
        this.keys.layout === 'sharded' ? shards.map((s) => s.keys.cancelChannel) : [this.keys.cancelChannel],
      );
      const { lockDurationMs } = this.options;
      await this.applyToolLimits();
      // One BullMQ Worker per tool queue (§3.2) and, in the sharded layout, per shard of it (§1.1): every worker of a
      // tool takes the jobs of all its shards; the gate bounds the process.
      for (const { queue, keys } of shards) {
        const worker = new GatedWorker<unknown, void>(keys.queueName(queue), this.runner.process, {
          gate: this.gate,
          level: Math.min(...this.options.tools.filter((t) => this.queues.get(t.name) === queue).map(levelOf)),
          wakeOthers: () => this.wakeWorkers(bullQueueKey(keys.bullPrefix, keys.queueName(queue))),
          connection: this.bullConnection,
          prefix: keys.bullPrefix,
          // Lock 2L/3, renewed every L/3, stalled check every L/6: a dead worker's job is re-queued within 5L/6
          // (§10.5).
          lockDuration: bullLockMs(lockDurationMs),
          stalledInterval: Math.max(50, Math.round(lockDurationMs / 6)),
          maxStalledCount: BULLMQ_MAX_STALLED,
          name: this.workerId,
        });
        this.bullWorkers.push(worker);
        worker.on('error', (error) => this.log.warn({ err: error, queue }, 'BullMQ worker error'));
        worker.on('stalled', (jobId) =>
          this.log.warn(
            { taskId: jobId, queue },
            'job stalled: the worker running it stopped renewing its lock; re-queued',
          ),
        );
        worker.on('locksRenewed', ({ jobIds }) => this.running.renewed(jobIds));
        worker.on('lockRenewalFailed', (jobIds) => {
          for (const id of jobIds) this.running.loseLock(id, 'lock renewal refused');
        });
      }
      await Promise.all(this.bullWorkers.map((worker) => worker.waitUntilReady()));
      await this.heartbeat.start();
      // Renewals come every sixth to third of the lock duration: none for half of it means the lock is about to go.
      const limitMs = Math.round(lockDurationMs / 2);
      this.lockWatchTimer = setInterval(
        () => this.running.loseUnrenewed(limitMs),
        Math.max(25, Math.round(lockDurationMs / 12)),
      ).unref();
      this.enter('running', ['starting']);
      this.log.debug({ tools: this.options.tools.map((t) => t.name) }, 'worker started');
    } catch (error) {
      await this.abandon();
      throw error;
    }
  }

  close(options: CloseOptions = {}): Promise<void> {
    this.closed ??= this.shutdown(options.graceMs ?? this.options.shutdownGraceMs);
    return this.closed;
  }

  private async shutdown(graceMs: number): Promise<void> {
    // A close during the start waits for it: then the worker is RUNNING (and drains) or FAILED (already undone).
    await this.starting?.catch(() => undefined);
    if (this.stateValue === 'failed') return;
    if (this.stateValue === 'initialized') {
      await this.abandon('stopped');
      return;
    }
    this.enter('draining', ['running']);
    // BullMQ's close stops fetching at once and resolves when the running jobs are done. The heartbeat, the cancel
    // subscriber and the sweep keep working meanwhile: the tools stay listed, and a running tool may still be cancelled.
    // The gate first: a Worker waiting for a slot takes nothing now.
    this.gate.close();
    const drained = Promise.all(
      this.bullWorkers.map((worker) =>
        worker.close().catch((error: unknown) => {
          this.log.warn({ err: error }, 'BullMQ worker close failed');
        }),
      ),
    );
    if (!(await settlesWithin(drained, graceMs))) {
      const live = this.running.live();
      this.log.info({ graceMs, taskIds: live.map(([id]) => id) }, 'grace period over; aborting running tools');
      for (const [, entry] of live) entry.controller.abort('WORKER_SHUTDOWN' satisfies CancelReason);
      if (!(await settlesWithin(drained, this.options.abortGraceMs))) {
        this.log.warn(
          { taskIds: this.running.ids() },
          'tools ignore their signal; closing without them (their jobs return to the queue when their locks expire)',
        );
      }
    }
    this.enter('stopping', ['draining']);
    this.cancelWatch.stop();
    clearInterval(this.lockWatchTimer);
    await this.heartbeat.stop();
    try {
      await this.heartbeat.remove();
    } catch (error) {
      this.log.warn({ err: error }, 'could not remove the catalog');
    }
    await this.batchQueues.close();
    await Promise.all([quit(this.subscriber), quit(this.redis), quit(this.bullConnection)]);
    this.enter('stopped', ['stopping']);
    this.log.info('worker closed');
  }

  /** Releases whatever `start` had opened when it failed (or closes a worker that never started). */
  private async abandon(end: 'failed' | 'stopped' = 'failed'): Promise<void> {
    this.stateValue = end;
    this.cancelWatch.stop();
    clearInterval(this.lockWatchTimer);
    await this.heartbeat.stop();
    this.gate.close();
    await Promise.all(this.bullWorkers.map((worker) => worker.close(true).catch(() => undefined)));
    this.subscriber.disconnect();
    this.redis.disconnect();
    this.bullConnection.disconnect();
    this.objects?.close();
  }

  private enter(next: WorkerState, from: readonly WorkerState[]): void {
    if (!from.includes(this.stateValue)) {
      throw new Error(`Worker cannot go from ${this.stateValue} to ${next}`);
    }
    // One debug line per move, so a lifecycle test (and an operator at LOG_LEVEL=debug) sees each state once, in order.
    this.log.debug({ from: this.stateValue, to: next }, 'worker state');
    this.stateValue = next;
  }

  /**
   * Writes each tool's fleet-wide limits onto its queue with BullMQ's own `setGlobalConcurrency` and
   * `setGlobalRateLimit` (PROTOCOL.md §3.3), and takes away a limit the tool no longer sets: the newest worker to start
   * sets them, so a deploy that changes a limit changes it for the fleet.
   */
  /**
   * The BullMQ queues this worker consumes: one per tool queue in the single layout; in the sharded layout one per
   * shard of each (`shards` on the tool), each under its shard's BullMQ prefix, placed here if no process did yet.
   */
  private async toolShards(): Promise<Array<{ queue: string; keys: Keys; shards: number }>> {
    const out: Array<{ queue: string; keys: Keys; shards: number }> = [];
    const seen = new Set<string>();
    for (const tool of this.options.tools) {
      const queue = this.queues.get(tool.name) ?? toolQueue(this.options.queue, tool.name);
      if (seen.has(queue)) continue;
      seen.add(queue);
      const placement = this.store.placement;
      if (placement === undefined) {
        out.push({ queue, keys: this.keys, shards: 1 });
        continue;
      }
      const codes = await placement.codes(queue, tool.shards);
      for (const code of codes) out.push({ queue, keys: this.keys.forShard(code), shards: codes.length });
    }
    return out;
  }

  private async applyToolLimits(): Promise<void> {
    const shards = await this.toolShards();
    for (const tool of this.options.tools) {
      const toolQueueName = this.queues.get(tool.name) ?? toolQueue(this.options.queue, tool.name);
      // BullMQ's queue-wide limits (a plain rate limit's pacer, §3.3); a per-key or shared one is the worker's (§3.5),
      // and the queue then gets none.
      // Across N shards each gets its part, rounded up: at most limit + N - 1 in all (docs/SCALING.md).
      const { concurrency, rateLimit } = tool;
      for (const { queue: name, keys, shards: n } of shards.filter((s) => s.queue === toolQueueName)) {
        const queue = this.batchQueues.get(name, keys);
        await (concurrency === undefined
          ? queue.removeGlobalConcurrency()
          : queue.setGlobalConcurrency(Math.ceil(concurrency / n)));
        await (rateLimit === undefined
          ? queue.removeGlobalRateLimit()
          : queue.setGlobalRateLimit(Math.ceil(rateLimit.max / n), rateLimit.perMs));
      }
    }
  }

  /** Sets BullMQ's "a job is waiting" marker of a queue (its key layout, not ours; "0" is its "a job is waiting"). */
  private async wakeWorkers(queueQualifiedName: string): Promise<void> {
    await this.redis.zadd(bullmqMarkerKey(queueQualifiedName), 0, '0');
  }

  private connect(role: string, options: { shardedSubscribers?: boolean } = {}): RedisClient {
    // Named so `CLIENT LIST` tells the connections of each worker apart.
    const client = createRedis(this.options.redisUrl, {
      connectionName: `taskrelay-worker:${this.workerId}:${role}`,
      ...options,
    });
    this.options.metrics.watchRedis(client, role, this.log);
    return client;
  }
}

/** A tool's priority level (PROTOCOL.md §25.1): its definition's, else the default. */
function levelOf(tool: { descriptor: { priority?: number } }): number {
  return tool.descriptor.priority ?? DEFAULT_PRIORITY;
}

/** Resolves true when `promise` settles within `ms`, false otherwise. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function quit(client: RedisClient): Promise<void> {
  try {
    if (client.status === 'end') return;
    // A client that never connected cannot QUIT; it only needs to stop reconnecting.
    if (client.status !== 'ready') client.disconnect();
    else await client.quit();
  } catch {
    client.disconnect();
  }
}

/**
 * Turns tasks into BullMQ jobs and carries cancels to whichever worker holds them (PROTOCOL.md §4, §7).
 */
import { Queue } from 'bullmq';
import {
  FairShare,
  StoreRunner,
  jobOptions,
  type JobAddScript,
  type RedisClient,
  TaskrelayError,
  type CancelReason,
  type CancelRequest,
  type JobData,
  type Keys,
  type Logger,
  DEFAULT_PRIORITY,
  priorityBase,
  publishOn,
} from '@taskrelay/shared';
import type { CatalogTool } from './catalog.js';
import {
  ADD_PRIORITIZED_JOB_ARGS,
  ADD_PRIORITIZED_JOB_KEYS,
  bullmqAddPrioritizedLua,
  recordJobAdd,
} from './bullmq-adapter.js';

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
  /** Where BullMQ's add script comes from (`bullmqAddPrioritizedLua`; a test passes a BullMQ without it). */
  addScript?: () => { lua: string } | { missing: string };
}

export class JobDispatcher {
  private readonly queues = new Map<string, Queue>();
  private readonly readyTimeoutMs: number;
  private readonly fairShare: FairShare;
  private readonly addScript: () => { lua: string } | { missing: string };
  /** BullMQ's add script for `prepare`; null once it turned out not to be usable (then `enqueue` adds). */
  private addLua: string | null | undefined;

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
    // The dispatcher's own connection gets its own runner: scripts load once per connection.
    this.fairShare = new FairShare(new StoreRunner(connection, keys));
    this.addScript = options.addScript ?? (() => bullmqAddPrioritizedLua());
  }

  /**
   * Adds the task's job to its pool with its principal's fair-share priority (PROTOCOL.md §25): behind the jobs of
   * principals with shorter backlogs, never behind a whole backlog of another's.
   */
  async enqueue(tool: CatalogTool, data: JobData, entered?: { priority: number }, delayMs = 0): Promise<void> {
    const queue = await this.ready(tool.queue, data.taskId);
    const principal = data.principal ?? '';
    // `entered`: the task's creation already entered the job in its share (one round trip fewer, §25).
    const priority =
      entered?.priority ??
      (await this.fairShare.enter(
        tool.queue,
        principal,
        data.taskId,
        fairShareTtlMs(data),
        priorityBase(data.priority ?? DEFAULT_PRIORITY),
      ));
    // A delayed start (PROTOCOL.md §33.1) is a BullMQ delayed job: it enters the prioritized set, at this priority,
    // when it is due.
    const options = jobOptions(data.taskId, priority, tool);
    const added = queue.add(tool.name, data, delayMs > 0 ? { ...options, delay: delayMs } : options);
    try {
      await added;
    } catch (error) {
      await this.fairShare.leave(tool.queue, principal, data.taskId).catch(() => undefined);
      throw error;
    }
  }

  /**
   * Adds the task's job unless it exists (PROTOCOL.md §10.10): the replay of an idempotency key whose first call
   * stored the task but could not add its job (Redis unavailable, a failover) adds it now, so the retry runs the task
   * instead of returning one the reaper will fail. True when it added the job.
   */
  async ensureEnqueued(tool: CatalogTool, data: JobData, delayMs = 0): Promise<boolean> {
    const queue = await this.ready(tool.queue, data.taskId);
    if (await queue.getJob(data.taskId)) return false;
    await this.enqueue(tool, data, undefined, delayMs);
    return true;
  }

  /**
   * The task's job as BullMQ would add it (`Queue.add` with `jobOptions`), for the task's create script to add in
   * the same round trip (PROTOCOL.md §10.1): BullMQ builds the keys and arguments itself, onto a recording client in
   * place of its transaction, and the create puts the fair-share priority into them. Undefined when this BullMQ
   * does not lend itself to that (an unexpected script or backend): then `enqueue` adds the job after the create.
   */
  async prepare(tool: CatalogTool, data: JobData): Promise<JobAddScript | undefined> {
    if (this.addLua === undefined) {
      const loaded = this.addScript();
      this.addLua = 'lua' in loaded ? loaded.lua : this.noAddInCreate(loaded.missing);
    }
    if (this.addLua === null) return undefined;
    const queue = await this.ready(tool.queue, data.taskId);
    // Priority 1 stands in for the fair-share priority, which the create script sets (it picks the same script).
    const recorded = await recordJobAdd(queue, tool.name, data, jobOptions(data.taskId, 1, tool));
    if (typeof recorded === 'string') {
      this.addLua = this.noAddInCreate(recorded);
      return undefined;
    }
    const { command, args } = recorded;
    if (
      !command.startsWith('addPrioritizedJob:') ||
      args.length !== ADD_PRIORITIZED_JOB_KEYS + ADD_PRIORITIZED_JOB_ARGS
    ) {
      this.addLua = this.noAddInCreate(`unexpected add command ${command} of ${args.length} keys and arguments`);
      return undefined;
    }
    const [packedArgs, json, packedOpts] = args.slice(ADD_PRIORITIZED_JOB_KEYS) as [
      string | Buffer,
      string,
      string | Buffer,
    ];
    return {
      lua: this.addLua,
      keys: args.slice(0, ADD_PRIORITIZED_JOB_KEYS) as string[],
      args: [packedArgs, json, packedOpts],
    };
  }

  /** The create script runs no add from now on: said once, at warn (every job then costs one round trip more). */
  private noAddInCreate(why: string): null {
    this.log.warn({ reason: why }, 'BullMQ add not in the create script: jobs are added after it, by Queue.add');
    return null;
  }

  /**
   * Called after the task is already `cancelled` in its hash. A running job is aborted by the worker that holds it,
   * which the pub/sub message wakes (the hash is the durable record); a waiting job is removed so it never starts. The
   * message goes first: a worker that takes the job before the remove meets the cancel as its run registers, and a
   * first run, which runs its tool before reading the task (PROTOCOL.md §21.2.1), does not run it.
   */
  async cancel(
    taskId: string,
    queueName: string,
    reason: CancelReason,
    principal?: string,
    started = true,
  ): Promise<void> {
    const message: CancelRequest = { taskId, reason };
    // The task's tool shard's channel in the sharded layout: only the workers of its tool hear it (PROTOCOL.md §1.2).
    await publishOn(this.connection, this.keys, this.keys.forTask(taskId).cancelChannel, JSON.stringify(message));
    try {
      const queue = await this.ready(queueName, taskId);
      // A delayed job of a task that ran (a suspended run, PROTOCOL.md §12.8) is promoted: one last run finds the task
      // cancelled and lets the tool stop what it started outside (`onCancelled`). A waiting one, or the delayed job of
      // a start not reached yet (§33.1: nothing ran, so nothing outside to stop), is removed, unless a worker holds its
      // lock (then that worker sees the cancel instead).
      const job = await queue.getJob(taskId);
      if (job && started && (await job.isDelayed())) await job.promote();
      else {
        await queue.remove(taskId);
        // A job removed before any worker took it leaves its principal's share here (a taken one left at its start).
        if (principal !== undefined) await this.fairShare.leave(queueName, principal, taskId);
      }
    } catch (error) {
      this.log.debug({ taskId, err: error }, 'job not removed from queue');
    }
  }

  /**
   * Moves a suspended task's delayed job to the wait list, so a worker resumes it now (PROTOCOL.md §12.3). A job that
   * is not delayed (still active, already resumed, gone) is left alone: the worker's own check covers it (§12.4).
   */
  async promote(taskId: string, queueName: string): Promise<void> {
    try {
      const job = await (await this.ready(queueName, taskId)).getJob(taskId);
      await job?.promote();
    } catch (error) {
      this.log.debug({ taskId, err: error }, 'job not promoted (not delayed)');
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }

  /**
   * The queue of a task's job, once BullMQ has set it up; a queue first used while Redis is away fails fast instead
   * of waiting. In the sharded layout the task's id names the shard whose BullMQ prefix the queue is under (§1.1).
   */
  private async ready(name: string, taskId: string): Promise<Queue> {
    const queue = this.queue(name, this.keys.forTask(taskId));
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

  private queue(name: string, keys: Keys): Queue {
    const id = keys.bullPrefix === this.keys.bullPrefix ? name : `${keys.bullPrefix}\n${name}`;
    let queue = this.queues.get(id);
    if (!queue) {
      queue = new Queue(keys.queueName(name), {
        connection: this.connection,
        prefix: keys.bullPrefix,
        streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
      });
      queue.on('error', (error) => this.log.warn({ err: error, queue: name }, 'queue error'));
      this.queues.set(id, queue);
    }
    return queue;
  }
}

/**
 * The limits a worker admits runs by itself (PROTOCOL.md §3.5): a concurrency limit per key of the arguments, and a
 * rate limit per key or shared by name. BullMQ (OSS) has neither, so the run envelope asks here before the handler
 * runs, for a task's run and a batch child's alike: a refused run ends holding no worker slot and waits in BullMQ's
 * delayed set, woken by the run that frees a slot (or, for a rate limit, when the window has room). A plain rate limit
 * is counted here too, exactly, since BullMQ's fixed windows let up to twice `max` start within one `perMs` (§3.3):
 * BullMQ's limiter only paces its takes, and its refused run waits at the front of its queue.
 */
import { randomUUID } from 'node:crypto';
import { DelayedError, type Job } from 'bullmq';
import {
  TaskrelayError,
  principalScopedKey,
  queueOfBullName,
  type Logger,
  type RedisClient,
  type SlotLimit,
  type ToolLimitStore,
} from '@taskrelay/shared';
import type { ToolDefinition } from '../define-tool.js';
import { holdTakes, moveToWait } from './bullmq-adapter.js';
import type { WorkerMetrics } from '../metrics.js';
import type { BatchQueues } from './batch-queues.js';
import type { RunningJob } from './running-jobs.js';

/** Why and how long a run waits. */
export interface LimitWait {
  limit: 'slot' | 'rate';
  waitMs: number;
  /** The task's `statusMessage` while it waits. */
  message: string;
  /** The slot limit it waits for (its key computed once), for the look after the delayed move. */
  slot?: SlotLimit;
  /** A plain rate limit's wait (§3.3): its queue's BullMQ limiter is held, and the job goes back to the front. */
  paced?: true;
}

/**
 * A limit key for `args`. A key function that throws is the tool's definition at fault (no retry would change it):
 * one error, with one message, for a task's run and a batch child's alike.
 */
function keyOf(
  tool: ToolDefinition,
  limit: { keyOf: (args: Record<string, unknown>) => string; acrossPrincipals: boolean },
  args: Record<string, unknown>,
  principal: string,
) {
  let value: string;
  try {
    value = limit.keyOf(args);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw new TaskrelayError('INTERNAL', `The limit key of tool ${tool.name} failed: ${why}`);
  }
  // Per principal unless the tool says otherwise (§3.5): bob's runs on tenant `acme` never hold alice's `acme`.
  return limit.acrossPrincipals ? value : principalScopedKey(principal, value);
}

/** How many times a release skips waiters that cannot be woken before it leaves the rest to their delays. */
const WAKE_ROUNDS = 3;

export interface ToolLimitsOptions {
  store: ToolLimitStore;
  /** Where BullMQ's limiter of a job's queue is held (§3.3). */
  redis: RedisClient;
  queues: BatchQueues;
  /** A slot's lease (the lock duration): a SIGKILLed holder's slot comes back within it. */
  leaseMs: number;
  metrics: WorkerMetrics;
  log: Logger;
}

export class ToolLimits {
  constructor(private readonly o: ToolLimitsOptions) {}

  /**
   * Admits a run of `tool` with `args` (parsed): undefined when it may start, its slot (if any) held until the run's
   * envelope releases it (`entry.release`); else why and how long it waits. A key function that throws fails the
   * run as the tool would.
   */
  async admit(
    tool: ToolDefinition,
    args: Record<string, unknown>,
    job: Job<unknown, void>,
    entry: RunningJob,
  ): Promise<LimitWait | undefined> {
    const { rate, slot } = tool.admitted;
    const jobId = job.id ?? '';
    const principal = entry.principal ?? '';
    if (rate) {
      const key = keyOf(tool, rate, args, principal);
      const taken = await this.o.store.takeStart({ ...rate, key }, `${jobId}:${randomUUID()}`);
      // The window is full now: no worker of the queue takes before it has room (§3.3, step 2). Not held (Redis
      // briefly away): a take too early is refused by the log, and holds it then.
      if (taken.ok && rate.paced && taken.roomInMs !== undefined && taken.roomInMs > 0) {
        await holdTakes(this.o.redis, job.queueQualifiedName, taken.roomInMs).catch((error: unknown) => {
          this.o.log.debug({ err: error }, 'queue’s rate limiter not held');
        });
      }
      if (!taken.ok) {
        this.o.metrics.limitWaits.inc({ tool: tool.name, limit: 'rate' });
        const scope = rate.scope.startsWith('name:') ? rate.scope.slice(5) : tool.name;
        const per = rate.keyName === '' ? '' : ` per ${rate.keyName}`;
        return {
          limit: 'rate',
          waitMs: taken.waitMs,
          message: `Waiting for rate limit ${scope}: at most ${rate.max} starts per ${rate.perMs} ms${per}`,
          ...(rate.paced ? { paced: true as const } : {}),
        };
      }
    }
    if (!slot) return undefined;
    const limit: SlotLimit = { tool: tool.name, key: keyOf(tool, slot, args, principal), limit: slot.limit };
    // A limit shared across principals keeps a line fair between them (§3.5).
    if (slot.acrossPrincipals) limit.principal = principal;
    const waiter = `${queueOfBullName(job.queueName)} ${jobId}`;
    const taken = await this.o.store.takeSlot(limit, jobId, waiter, this.o.leaseMs);
    if (!taken.ok) {
      this.o.metrics.limitWaits.inc({ tool: tool.name, limit: 'slot' });
      return {
        limit: 'slot',
        waitMs: Math.min(taken.waitMs, this.o.leaseMs),
        message: `Waiting for a slot: tool ${tool.name} runs at most ${slot.limit} at once per ${slot.keyName}`,
        slot: limit,
      };
    }
    // Renewed every third of the lease while the run lasts; released however the run ends.
    const renew = setInterval(
      () => {
        this.o.store.takeSlot(limit, jobId, waiter, this.o.leaseMs, 'renew').catch((error: unknown) => {
          this.o.log.debug({ err: error, tool: tool.name }, 'slot lease not renewed');
        });
      },
      Math.max(50, Math.round(this.o.leaseMs / 3)),
    ).unref();
    entry.release = async () => {
      clearInterval(renew);
      await this.wakeNext(limit, await this.o.store.releaseSlot(limit, jobId, waiter));
    };
    return undefined;
  }

  /**
   * Puts a refused run's job in BullMQ's delayed set for `wait.waitMs` (no attempt used, no slot held) and throws
   * BullMQ's `DelayedError`. A slot waiter then looks once more: a slot freed before the move (its releaser's promotion
   * found the job still active, and dropped it from the line) means it promotes itself; no room means the look puts it
   * back in line, so the next release wakes it. Either way no wake is lost. A plain rate limit's run goes back to the
   * front of its queue instead (`backToFront`).
   */
  async delay(job: Job<unknown, void>, token: string | undefined, wait: LimitWait, log: Logger): Promise<never> {
    if (wait.paced) return this.backToFront(job, token, wait, log);
    try {
      await job.moveToDelayed(Date.now() + wait.waitMs, token);
    } catch (error) {
      log.info({ err: error }, 'waiting job not delayed (its lock is gone); it returns to the queue');
      throw new DelayedError();
    }
    if (wait.slot) {
      const jobId = job.id ?? '';
      const room = await this.o.store
        .takeSlot(wait.slot, jobId, `${queueOfBullName(job.queueName)} ${jobId}`, this.o.leaseMs, 'peek')
        .catch(() => ({ ok: false }));
      if (room.ok) await job.promote().catch(() => undefined);
    }
    log.info({ limit: wait.limit, waitMs: wait.waitMs }, 'run waits for its tool’s limit, holding no slot');
    throw new DelayedError();
  }

  /**
   * A plain rate limit's refused run (§3.3, step 3): the queue's BullMQ limiter is held for the wait first, so no
   * worker takes the job again before there is room, then the job goes back to the front of its wait list, its
   * attempts kept, and BullMQ's `DelayedError` says the move is done.
   */
  private async backToFront(
    job: Job<unknown, void>,
    token: string | undefined,
    wait: LimitWait,
    log: Logger,
  ): Promise<never> {
    // The hold's marker also wakes a worker when it ends: BullMQ's move back sets none for a job with a priority (every
    // taskrelay job has one). Not held (Redis briefly away): the job is taken again sooner, or at a worker's block
    // timeout, and refused again if need be; nothing is lost.
    await holdTakes(this.o.redis, job.queueQualifiedName, wait.waitMs).catch((error: unknown) => {
      log.debug({ err: error }, 'queue’s rate limiter not held');
    });
    try {
      await moveToWait(job, token);
    } catch (error) {
      log.info({ err: error }, 'waiting job not moved back (its lock is gone); it returns to the queue');
      throw new DelayedError();
    }
    log.info(
      { limit: wait.limit, waitMs: wait.waitMs },
      'run waits for its tool’s rate limit at the front of its queue',
    );
    throw new DelayedError();
  }

  /** A back-off (§3.4) of a tool with a rate limit holds that limit for the tool and every tool that shares it. */
  async hold(tool: ToolDefinition, args: Record<string, unknown>, principal: string, ms: number): Promise<void> {
    const { rate } = tool.admitted;
    if (!rate) return;
    await this.o.store.hold({ scope: rate.scope, key: keyOf(tool, rate, args, principal) }, ms);
  }

  /**
   * Promotes the waiters a release answered. One whose job is gone (its task was cancelled or ended while it waited)
   * leaves the line, and the next in line is woken in its place, for a few rounds: a stale head of the line would
   * otherwise hold every later waiter to its delay's end. One whose job is not delayed but still there (its refused run
   * has not made its delayed move yet, or it was woken already) stays in line: its look after the move (step 3), or its
   * take, uses the room. Dropping it raced that look: a look that ran first kept it in line, the drop then took it out,
   * and it slept to its delay's end.
   */
  private async wakeNext(limit: SlotLimit, answered: string[]): Promise<void> {
    const tried = new Set<string>();
    let next = answered;
    for (let round = 0; round < WAKE_ROUNDS; round++) {
      const fresh = next.filter((w) => !tried.has(w));
      if (fresh.length === 0) return;
      for (const w of fresh) tried.add(w);
      const woken = await Promise.all(fresh.map((w) => this.promote(w)));
      const gone = fresh.filter((_w, i) => woken[i] === 'gone');
      if (gone.length === 0) return;
      await this.o.store.dropWaiters(limit, gone);
      next = await this.o.store.releaseSlot(limit, '', '');
    }
  }

  private async promote(waiter: string): Promise<'woken' | 'there' | 'gone'> {
    const space = waiter.indexOf(' ');
    if (space <= 0) return 'gone';
    const [pool, jobId] = [waiter.slice(0, space), waiter.slice(space + 1)];
    if (await this.o.queues.promote(pool, jobId)) return 'woken';
    const state = await this.o.queues
      .get(pool)
      .getJobState(jobId)
      .catch(() => 'unknown');
    return state === 'unknown' || state === 'completed' || state === 'failed' ? 'gone' : 'there';
  }
}

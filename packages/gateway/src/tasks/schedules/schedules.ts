/**
 * Schedules (PROTOCOL.md §33.2): a cron pattern or an interval that creates an ordinary task of its principal at each
 * firing. The timing is BullMQ's: one job scheduler per schedule on the `firings` queue (`upsertJobScheduler`), which
 * keeps exactly one delayed job for the next firing. Every gateway runs one BullMQ worker on that queue, so a firing
 * is taken by one gateway and creates one task (its idempotency key is the firing's, so a gateway killed mid-firing
 * and the one that takes the job over create the same task). The queue's global concurrency is 1: firings are handled
 * one at a time across the fleet, which makes the overlap check and the task's creation one step.
 */
import { DelayedError, Queue, Worker, type Job } from 'bullmq';
import {
  TaskrelayError,
  createRedis,
  isTerminal,
  type Keys,
  type Logger,
  type RedisClient,
  type TaskRecords,
} from '@taskrelay/shared';
import type { TaskService } from '../task-service.js';
import type { WebhookIntake } from '../webhooks/intake.js';
import {
  MAX_SCHEDULES_PER_PRINCIPAL,
  scheduleSpecSchema,
  type ScheduleSpec,
  type ScheduleView,
} from './schedule-model.js';

/** The data of a firing's job: which schedule, and for a waiting firing (`queue`) which firing it holds. */
interface FiringData {
  scheduleId: string;
  /** A `queue` firing waiting for the previous run: the id of the firing it stands for. */
  waitingFor?: string;
}

/** How often a firing that waits (overlap `queue`) looks again at the previous run. */
const QUEUED_RECHECK_MS = 1_000;
/**
 * How long a gateway holds a firing it handles: a gateway killed mid-firing holds every schedule (global concurrency
 * 1) until its lock runs out, so it is short; handling a firing takes milliseconds.
 */
const FIRING_LOCK_MS = 10_000;

/** Tries of one firing whose handling failed on Redis (each keyed the same, so one task at most), and the wait. */
const FIRING_ATTEMPTS = 3;
const FIRING_RETRY_MS = 2_000;

/** Fields of a schedule's hash (`P:schedule:<id>`): the definition as JSON, then its state field by field. */
const S = {
  spec: 'spec',
  principal: 'principal',
  paused: 'paused',
  source: 'source',
  createdAt: 'createdAt',
  lastTaskId: 'lastTaskId',
  lastFiredAt: 'lastFiredAt',
  runs: 'runs',
  skipped: 'skipped',
  lastError: 'lastError',
  waiting: 'waiting',
} as const;

export interface SchedulesOptions {
  /** Where Redis is: the firings worker opens a connection of its own (BullMQ blocks on it). */
  redisUrl: string;
  /** The creation-time webhook checks (PROTOCOL.md §27.1); undefined: schedules with a webhook are refused. */
  webhooks?: Pick<WebhookIntake, 'accept'>;
}

/** Who asks: the principal the schedule must belong to (undefined: an operator, any schedule). */
export interface ScheduleScope {
  principal?: string;
}

export class Schedules {
  private readonly queue: Queue<FiringData>;
  private worker: Worker<FiringData> | undefined;
  private workerConnection: RedisClient | undefined;

  constructor(
    private readonly redis: RedisClient,
    queueConnection: RedisClient,
    private readonly keys: Keys,
    private readonly store: Pick<TaskRecords, 'get'>,
    private readonly service: Pick<TaskService, 'start' | 'resolveCall' | 'cancel'>,
    private readonly log: Logger,
    private readonly options: SchedulesOptions,
  ) {
    this.queue = new Queue<FiringData>(keys.firingsQueue, { connection: queueConnection, prefix: keys.bullPrefix });
    this.queue.on('error', (error) => log.warn({ err: error }, 'firings queue error'));
  }

  /** Starts handling firings on this gateway (every gateway does; each firing is taken by one). */
  async start(): Promise<void> {
    await this.queue.setGlobalConcurrency(1);
    this.workerConnection = createRedis(this.options.redisUrl);
    this.worker = new Worker<FiringData>(this.keys.firingsQueue, (job, token) => this.fire(job, token), {
      connection: this.workerConnection,
      prefix: this.keys.bullPrefix,
      concurrency: 1,
      lockDuration: FIRING_LOCK_MS,
      stalledInterval: FIRING_LOCK_MS / 2,
    });
    this.worker.on('error', (error) => this.log.warn({ err: error }, 'firings worker error'));
    this.worker.on('failed', (job, error) =>
      this.log.warn({ err: error, scheduleId: job?.data.scheduleId }, 'schedule firing failed'),
    );
  }

  /** Takes no more firings (a draining gateway leaves them to the others); one being handled ends first. */
  async stopFiring(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    await worker?.close();
  }

  async close(): Promise<void> {
    await this.stopFiring();
    await this.queue.close();
    this.workerConnection?.disconnect();
  }

  /**
   * Creates a schedule of `principal`, or replaces its definition (the same id, the same principal): checked (the
   * schema read its pattern as BullMQ does), then BullMQ's job scheduler is set, then it is stored. A paused schedule
   * stays paused.
   */
  async upsert(spec: ScheduleSpec, principal: string, source: 'api' | 'file'): Promise<ScheduleView> {
    const key = this.keys.schedule(spec.id);
    const owner = await this.redis.hget(key, S.principal);
    if (owner !== null && owner !== principal) {
      throw refused(`schedule id ${spec.id} is taken; choose another`);
    }
    if (owner === null && (await this.countOf(principal)) >= MAX_SCHEDULES_PER_PRINCIPAL) {
      throw refused(`a principal may own at most ${MAX_SCHEDULES_PER_PRINCIPAL} schedules`);
    }
    if (spec.webhook !== undefined) await this.checkWebhook(spec.webhook, principal);
    if (source === 'api') await this.checkTool(spec);
    // Stored before its job scheduler exists: an `every` schedule fires at once, and its firing reads the record.
    const now = new Date();
    await this.redis
      .multi()
      .hset(key, S.spec, JSON.stringify(spec), S.principal, principal, S.source, source)
      .hsetnx(key, S.createdAt, now.toISOString())
      .hsetnx(key, S.paused, '0')
      .zadd(this.keys.scheduleIndex, 'NX', now.getTime(), spec.id)
      .exec();
    const paused = (await this.redis.hget(key, S.paused)) === '1';
    let first: number | undefined;
    try {
      if (!paused) first = await this.setScheduler(spec);
    } catch (error) {
      // A new schedule whose timing could not be set is not left behind half made.
      if (owner === null) await this.redis.multi().del(key).zrem(this.keys.scheduleIndex, spec.id).exec();
      throw error;
    }
    this.log.info({ scheduleId: spec.id, principal, source, tool: spec.tool }, 'schedule set');
    return withFirstFiring(await this.get(spec.id, { principal }), first);
  }

  /** The schedules the scope may see, oldest first. */
  async list(scope: ScheduleScope): Promise<ScheduleView[]> {
    const ids = await this.redis.zrange(this.keys.scheduleIndex, 0, -1);
    const views = await Promise.all(ids.map((id) => this.read(id)));
    return views.filter((v): v is ScheduleView => v !== undefined && visible(v, scope));
  }

  /** One schedule the scope may see; another principal's is "not found", as another's task is. */
  async get(id: string, scope: ScheduleScope): Promise<ScheduleView> {
    const view = await this.read(id);
    if (!view || !visible(view, scope)) throw notFound(id);
    return view;
  }

  /** Pauses (its job scheduler is removed: nothing fires) or resumes it (set again from its definition). */
  async setPaused(id: string, scope: ScheduleScope, paused: boolean): Promise<ScheduleView> {
    const view = await this.get(id, scope);
    // The mark first: a firing handled meanwhile sees it (paused: nothing; resumed: an `every` schedule's firing at
    // once is not dropped as paused).
    await this.redis.hset(this.keys.schedule(id), S.paused, paused ? '1' : '0');
    let first: number | undefined;
    if (paused) await this.queue.removeJobScheduler(id);
    else first = await this.setScheduler(view);
    this.log.info({ scheduleId: id, principal: view.principal }, paused ? 'schedule paused' : 'schedule resumed');
    return withFirstFiring(await this.get(id, scope), first);
  }

  /** Removes it: it fires no more; the tasks it created stay. */
  async remove(id: string, scope: ScheduleScope): Promise<void> {
    const view = await this.get(id, scope);
    await this.queue.removeJobScheduler(id);
    await this.redis.multi().del(this.keys.schedule(id)).zrem(this.keys.scheduleIndex, id).exec();
    this.log.info({ scheduleId: id, principal: view.principal }, 'schedule removed');
  }

  /**
   * BullMQ's job scheduler for the schedule: one delayed job for its next firing (the pattern was checked, §33.2).
   * Returns when that job is due (ms): an `every` schedule's first firing is now.
   */
  private async setScheduler(spec: ScheduleSpec): Promise<number | undefined> {
    const repeat =
      spec.every !== undefined ? { every: spec.every } : { pattern: spec.cron ?? '', tz: spec.tz ?? 'UTC' };
    const job = await this.queue.upsertJobScheduler(spec.id, repeat, {
      name: 'fire',
      data: { scheduleId: spec.id },
      opts: {
        removeOnComplete: true,
        removeOnFail: { count: 100 },
        attempts: FIRING_ATTEMPTS,
        backoff: { type: 'fixed', delay: FIRING_RETRY_MS },
      },
    });
    return job === undefined ? undefined : job.timestamp + (job.delay ?? 0);
  }

  private async checkWebhook(url: string, principal: string): Promise<void> {
    if (!this.options.webhooks) {
      throw new TaskrelayError(
        'WEBHOOK_REFUSED',
        'webhooks are off on this gateway (TASKRELAY_WEBHOOK_SECRET is not set)',
      );
    }
    await this.options.webhooks.accept({ url }, 'task', principal);
  }

  /** The tool exists and takes the arguments now (a file's schedules are checked at each firing only). */
  private async checkTool(spec: ScheduleSpec): Promise<void> {
    const { invalid } = await this.service.resolveCall(spec.tool, spec.arguments).catch((error: unknown) => {
      if (error instanceof TaskrelayError && error.code === 'TOOL_NOT_FOUND') {
        throw refused(`unknown tool ${spec.tool}: no live worker or retained pool serves it`);
      }
      throw error;
    });
    if (invalid !== undefined) throw refused(`arguments do not fit tool ${spec.tool}: ${invalid}`);
  }

  private async countOf(principal: string): Promise<number> {
    return (await this.list({ principal })).length;
  }

  private async read(id: string): Promise<ScheduleView | undefined> {
    const h = await this.redis.hgetall(this.keys.schedule(id));
    const specJson = h[S.spec];
    const principal = h[S.principal];
    if (specJson === undefined || principal === undefined) return undefined;
    const spec = scheduleSpecSchema.parse(JSON.parse(specJson));
    const paused = h[S.paused] === '1';
    const next = paused ? undefined : (await this.queue.getJobScheduler(id))?.next;
    const view: ScheduleView = {
      ...spec,
      principal,
      paused,
      source: h[S.source] === 'file' ? 'file' : 'api',
      createdAt: h[S.createdAt] ?? '',
      runs: Number(h[S.runs] ?? 0),
      skipped: Number(h[S.skipped] ?? 0),
    };
    if (next !== undefined) view.next = new Date(next).toISOString();
    if (h[S.lastTaskId] !== undefined) view.lastTaskId = h[S.lastTaskId];
    if (h[S.lastFiredAt] !== undefined) view.lastFiredAt = h[S.lastFiredAt];
    if (h[S.lastError] !== undefined) view.lastError = h[S.lastError];
    return view;
  }

  /**
   * One firing (the firings worker's processor). The overlap policy looks at the schedule's previous run; then the
   * task is created as a call of the schedule's principal would be, keyed by the firing.
   */
  private async fire(job: Job<FiringData>, token: string | undefined): Promise<string> {
    const { scheduleId } = job.data;
    const firing = job.data.waitingFor ?? job.id ?? `${scheduleId}:${job.timestamp}`;
    const view = await this.read(scheduleId);
    const key = this.keys.schedule(scheduleId);
    if (!view) return 'gone';
    // A firing already queued when the schedule was paused.
    if (view.paused) return 'paused';
    const previous = view.lastTaskId === undefined ? undefined : await this.store.get(view.lastTaskId);
    if (previous && !isTerminal(previous.status)) {
      const decision = await this.overlap(view, previous.taskId, job, token, firing);
      if (decision !== 'start') return decision;
    }
    try {
      const task = await this.createTask(view, firing);
      await this.redis
        .multi()
        .hset(key, S.lastTaskId, task, S.lastFiredAt, new Date().toISOString())
        .hincrby(key, S.runs, 1)
        .hdel(key, S.lastError, ...(job.data.waitingFor === undefined ? [] : [S.waiting]))
        .exec();
      this.log.info({ scheduleId, principal: view.principal, taskId: task, firing }, 'schedule fired');
      return task;
    } catch (error) {
      // Redis away: the firing's job is tried again (its task keyed by the firing, so never twice).
      if (!(error instanceof TaskrelayError) || error.code === 'REDIS_UNAVAILABLE') throw error;
      // The firing's own fault (the tool went, the arguments no longer fit, a cap): counted and shown, not retried.
      await this.redis.multi().hset(key, S.lastError, error.message).hincrby(key, S.skipped, 1).exec();
      if (job.data.waitingFor !== undefined) await this.redis.hdel(key, S.waiting);
      this.log.warn({ scheduleId, principal: view.principal, err: error }, 'schedule firing created no task');
      return 'refused';
    }
  }

  /** What a firing does while the previous run is unfinished (`ScheduleSpec.overlap`): skip, wait, or cancel it. */
  private async overlap(
    view: ScheduleView,
    previousId: string,
    job: Job<FiringData>,
    token: string | undefined,
    firing: string,
  ): Promise<'start' | 'skipped' | 'waiting'> {
    const key = this.keys.schedule(view.id);
    const skip = async () => {
      await this.redis.hincrby(key, S.skipped, 1);
      this.log.info({ scheduleId: view.id, previous: previousId, firing }, 'schedule firing skipped: previous run on');
      return 'skipped' as const;
    };
    if (view.overlap === 'skip') return skip();
    if (view.overlap === 'cancel') {
      await this.service.cancel(previousId, view.principal).catch((error: unknown) => {
        // Ended meanwhile: nothing to cancel.
        if (!(error instanceof TaskrelayError && error.code === 'TASK_TERMINAL')) throw error;
      });
      this.log.info({ scheduleId: view.id, cancelled: previousId, firing }, 'schedule cancelled its previous run');
      return 'start';
    }
    if (job.data.waitingFor !== undefined) {
      // Still on: look again shortly (BullMQ's delayed set, no slot held meanwhile).
      await job.moveToDelayed(Date.now() + QUEUED_RECHECK_MS, token);
      throw new DelayedError();
    }
    // At most one firing waits (`queue`); a firing while one waits is skipped. A mark whose waiting job is gone (it
    // failed, or ended while the schedule was paused) holds nothing: this firing takes its place.
    const waitJobId = `wait-${view.id}`;
    if ((await this.redis.hsetnx(key, S.waiting, firing)) === 0) {
      if (await this.queue.getJob(waitJobId)) return skip();
      await this.redis.hset(key, S.waiting, firing);
    }
    await this.queue.add(
      'wait',
      { scheduleId: view.id, waitingFor: firing },
      // Removed however it ends, so its id is free for the next firing that waits.
      { jobId: waitJobId, delay: QUEUED_RECHECK_MS, removeOnComplete: true, removeOnFail: true },
    );
    this.log.info({ scheduleId: view.id, previous: previousId, firing }, 'schedule firing waits for the previous run');
    return 'waiting';
  }

  /** The firing's task, through the one way tasks are created (as a replay does), keyed by the firing. */
  private async createTask(view: ScheduleView, firing: string): Promise<string> {
    const { tool, invalid } = await this.service.resolveCall(view.tool, view.arguments);
    if (invalid !== undefined) throw refused(`arguments do not fit tool ${tool.name}: ${invalid}`);
    const record = await this.service.start({
      tool,
      args: view.arguments,
      mode: 'task',
      principal: view.principal,
      sessionId: undefined,
      progressToken: undefined,
      requestedTtlMs: undefined,
      tags: [`schedule:${view.id}`],
      idempotencyKey: `schedule:${view.id}:${firing}`.slice(0, 200),
      webhook: view.webhook === undefined ? undefined : { url: view.webhook },
    });
    return record.taskId;
  }
}

function visible(view: ScheduleView, scope: ScheduleScope): boolean {
  return scope.principal === undefined || view.principal === scope.principal;
}

function refused(message: string): TaskrelayError {
  return new TaskrelayError('SCHEDULE_REFUSED', message);
}

function notFound(id: string): TaskrelayError {
  return new TaskrelayError('SCHEDULE_NOT_FOUND', `schedule ${id} not found`);
}

/**
 * The view just after its timing was set shows the firing that was just made due as its `next`: by the time the view
 * is read, the firings worker may have taken an `every` schedule's first firing (due at once), and BullMQ's scheduler
 * then names the second one, which is not what comes next from where the caller stands.
 */
function withFirstFiring(view: ScheduleView, first: number | undefined): ScheduleView {
  if (first === undefined || view.paused) return view;
  return { ...view, next: new Date(first).toISOString() };
}

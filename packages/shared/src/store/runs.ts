import type { SerializedError } from '../protocol/errors.js';
import type { Keys } from '../protocol/keys.js';
import { publishCommand } from '../pubsub.js';
import { ResultCode, type ScriptReply } from '../protocol/script-results.js';
import { SCRIPTS, type ScriptInput } from '../protocol/scripts.js';
import { TASK_FIELDS as F } from '../protocol/task-fields.js';
import {
  MAX_TAGS,
  isTerminal,
  type CancelReason,
  type InputRequest,
  type LogLevel,
  type TaskRecord,
  type TaskStatus,
  type ToolResult,
} from '../protocol/task-model.js';
import type { StoreRunner } from './store-runner.js';
import { asStatus, fromFlat, parseJson, parseRecord, writeOutcome } from './task-codec.js';

/** A worker's proof that it holds the job's BullMQ lock (PROTOCOL.md §10.4). */
export interface JobLock {
  queue: string;
  token: string;
  /**
   * The shard code of the job's queue in the sharded layout, when its id names another shard (a batch child's, whose
   * id names its parent's, PROTOCOL.md §26.10): its lock key is on this shard.
   */
  shard?: string;
}

export interface TransitionOptions {
  /** Refuse the write unless this lock is held (a worker's write). */
  lock?: JobLock;
  /** The gateway answering a cancel for a task owned by another gateway: the owner acks on its channel (§10.9). */
  ackTo?: string;
  /** Move the task's deadline (ms since epoch). */
  deadlineAt?: number;
  /** On a terminal write, free the task's idempotency key at once (the task never ran: a retry starts anew). */
  dropIdempotency?: boolean;
}

export interface ReapedTask {
  taskId: string;
  code: string;
  message: string;
}

export interface ReapOutcome {
  /** false when another process holds the reaper lease. */
  ran: boolean;
  looked: number;
  reaped: ReapedTask[];
}

export interface TransitionFields {
  statusMessage?: string;
  result?: ToolResult;
  error?: SerializedError;
  cancelReason?: CancelReason;
}

export type TransitionOutcome =
  | { ok: true; status: TaskStatus }
  /**
   * `status` is what the task already was (the write that won), or undefined when the task does not exist;
   * `lockLost` when the write was a worker's and another run holds the job now.
   */
  | { ok: false; status: TaskStatus | undefined; lockLost?: true };

export type ProgressOutcome = 'accepted' | 'stale' | 'missing' | 'terminal' | 'lock_lost';

/** How `recordLog` ended: `unrouted` when no gateway holds the caller's session (nobody to tell). */
/** `dropped`: not published, the gateway's backlog was full (PROTOCOL.md §22.4). */
export type LogOutcome = 'published' | 'unrouted' | 'dropped' | 'missing' | 'terminal' | 'lock_lost';

/** One tool log message (PROTOCOL.md §15): MCP's `notifications/message` params. */
export interface LogMessage {
  level: LogLevel;
  /** Any JSON value. */
  data: unknown;
  logger?: string;
}

/** What `startRun` finds: the task (undefined when missing), or that the lock is no longer this run's. */
export type StartOutcome =
  | {
      lockLost: false;
      record: TaskRecord | undefined;
      /** The task records this other tool version (§12.11). */ versionOther?: string;
      /** A brief start (`RunStart.brief`) of a task that started: its record was not read (`record` undefined). */
      started?: true;
    }
  | { lockLost: true };

/** What a run's start records (PROTOCOL.md §10.2, §21.2.1). */
export interface RunStart {
  taskId: string;
  lock: JobLock;
  attempt: number;
  deadlineAt: number;
  /** The principal whose waiting share of the pool the job leaves (§25). */
  sharePrincipal?: string | undefined;
  version?: { toolVersion?: string; deferIfOther?: boolean; reset?: boolean };
  /** When the run began: its `startedAt` when the task has none (default: now). */
  startedAt?: Date;
  /**
   * Answer a task that starts without its record (`started`), a task already ended with it as ever: a first run's
   * start (§21.2.1), whose context reads the record only when a member needs it (issue 46: one HGETALL fewer).
   */
  brief?: boolean;
}

export interface ProgressUpdate {
  progress: number;
  total?: number;
  message?: string;
}

/** How `suspend` ended (PROTOCOL.md §12.2). */
export type SuspendOutcome =
  /**
   * `answers` holds the requests that were already answered (by number): the run goes on when every request it
   * asked is in there, and is suspended otherwise (the others are pending now).
   */
  | { outcome: 'suspended'; answers: Record<string, unknown> }
  | { outcome: 'lock_lost' }
  /** The task is missing or terminal (`status` undefined when missing). */
  | { outcome: 'gone'; status: TaskStatus | undefined };

export interface SuspendInput {
  /** The input requests to ask (asked at once), each as request number `n`; empty or omitted for a timed suspension. */
  requests?: Array<{ n: number } & InputRequest>;
  /** The task's deadline while it is suspended (ms since epoch). */
  deadlineAt: number;
  /** A timed suspension's status message (a back-off says why and until when, PROTOCOL.md §3.4). */
  statusMessage?: string;
}

/**
 * How `answerInput` ended: `queue` is the task's job queue; `resumed` when that was the last pending request, so the
 * task is `working` again and the caller promotes its delayed job (§12.3).
 */
export type AnswerOutcome =
  { ok: true; queue: string; resumed: boolean } | { ok: false; status: TaskStatus | undefined };

/** The largest serialised `ctx.state` (and `ctx.step` results together) a task may keep: 64 KiB. */
export const MAX_STATE_BYTES = 65_536;

/** Largest outcome (result + error JSON, in UTF-16 units) a terminal status event carries; a bigger one is read. */
export const MAX_EVENT_OUTCOME_CHARS = 64 * 1024;

/**
 * A task's runs (PROTOCOL.md §10, §12): every status change goes through `transition`, which checks the state machine
 * atomically (Lua), so a terminal task never changes; a worker's writes are lock-checked (§10.4). Also the reaper's
 * pass, which ends the runs that outlived their deadline or their job.
 */
export class Runs {
  constructor(
    private readonly runner: StoreRunner,
    /** How soon after creation, and how often after that, the reaper looks at a live task (ms). */
    private readonly reaperIntervalMs = 5_000,
  ) {}

  /** Atomically moves a task to `to` if the state machine allows it from its current status. */
  async transition(
    taskId: string,
    to: TaskStatus,
    fields: TransitionFields = {},
    options: TransitionOptions = {},
    now = new Date(),
  ): Promise<TransitionOutcome> {
    const reply = await this.runner.call(SCRIPTS.transition, this.transitionInput(taskId, to, fields, options, now));
    return transitionOutcome(reply, to);
  }

  private transitionInput(
    taskId: string,
    to: TaskStatus,
    fields: TransitionFields,
    options: TransitionOptions,
    now: Date,
  ): ScriptInput<typeof SCRIPTS.transition> {
    const extra: Record<string, string> = {};
    if (fields.statusMessage !== undefined) extra[F.statusMessage] = fields.statusMessage;
    if (fields.result !== undefined) extra[F.result] = JSON.stringify(fields.result);
    if (fields.error !== undefined) extra[F.error] = JSON.stringify(fields.error);
    if (fields.cancelReason !== undefined) extra[F.cancelReason] = fields.cancelReason;
    const taskKey = this.runner.forTask(taskId).task(taskId);
    const outcomeChars = (extra[F.result]?.length ?? 0) + (extra[F.error]?.length ?? 0);
    const flat = Object.entries(extra).flat();
    return {
      keys: {
        task: taskKey,
        live: this.runner.forTask(taskId).live,
        lock: options.lock ? this.runner.forTask(taskId).bullJobLock(options.lock.queue, taskId) : taskKey,
        webhookDue: this.runner.forTask(taskId).webhooks.due,
        webhookPending: this.runner.forTask(taskId).webhooks.pending,
        webhookDead: this.runner.forTask(taskId).webhooks.dead,
        retention: this.runner.forTask(taskId).retention,
      },
      args: {
        to,
        now: now.toISOString(),
        fieldCount: flat.length,
        lockToken: options.lock?.token ?? '',
        channelPrefix: this.runner.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.runner.forTask(taskId).gatewayChannelSuffix,
        ackTo: options.ackTo ?? '',
        deadlineAt: options.deadlineAt === undefined ? '' : String(options.deadlineAt),
        dropIdempotency: options.dropIdempotency === true ? '1' : '0',
        // A terminal event carries the outcome when it is small (§6.7): the routing gateway then needs no read.
        eventOutcome: isTerminal(to) && outcomeChars <= MAX_EVENT_OUTCOME_CHARS ? '1' : '0',
        webhookPrefix: this.runner.forTask(taskId).webhooks.eventPrefix,
        publish: publishCommand(this.runner.keys),
        fields: flat,
      },
    };
  }

  /**
   * A run starts (PROTOCOL.md §10.2); with `sharePrincipal`, its job leaves that principal's waiting share of the
   * pool in the same step unless the lock is another run's (§25). With `version` (§12.11) the run records the tool
   * version it runs; `deferIfOther` makes it not start a task recorded under another version (`versionOther`), and
   * `reset` clears the task's state, steps, questions and answers as it starts.
   */
  async startRun(start: RunStart): Promise<StartOutcome> {
    const reply = await this.runner.call(SCRIPTS.startRun, this.startRunInput(start));
    if (reply.code === ResultCode.LOCK_LOST) return { lockLost: true };
    if (reply.code === ResultCode.VERSION_OTHER) {
      const recorded = reply.values[0];
      return { lockLost: false, record: undefined, versionOther: typeof recorded === 'string' ? recorded : '' };
    }
    if (reply.code === ResultCode.TASK_MISSING) return { lockLost: false, record: undefined };
    if (reply.values.length === 0) return { lockLost: false, record: undefined, started: true };
    return { lockLost: false, record: parseRecord(fromFlat(reply.values[0] as string[])) };
  }

  private startRunInput(start: RunStart): ScriptInput<typeof SCRIPTS.startRun> {
    const { taskId, lock, sharePrincipal, version = {} } = start;
    const taskKey = this.runner.forTask(taskId).task(taskId);
    return {
      keys: {
        task: taskKey,
        lock: this.runner.forTask(taskId).bullJobLock(lock.queue, taskId),
        share:
          sharePrincipal === undefined ? taskKey : this.runner.forTask(taskId).fairShare(lock.queue, sharePrincipal),
      },
      args: {
        lockToken: lock.token,
        deadlineAt: start.deadlineAt,
        now: (start.startedAt ?? new Date()).toISOString(),
        attempt: start.attempt,
        jobId: taskId,
        toolVersion: version.toolVersion ?? '',
        deferIfOther: version.deferIfOther === true ? '1' : '0',
        reset: version.reset === true ? '1' : '0',
        brief: start.brief === true ? '1' : '0',
      },
    };
  }

  /** Records progress on the task and wakes the gateway that holds its session (PROTOCOL.md §6). */
  async recordProgress(
    taskId: string,
    update: ProgressUpdate,
    lock?: JobLock,
    now = new Date(),
  ): Promise<ProgressOutcome> {
    const taskKey = this.runner.forTask(taskId).task(taskId);
    const reply = await this.runner.call(SCRIPTS.progress, {
      keys: { task: taskKey, lock: lock ? this.runner.forTask(taskId).bullJobLock(lock.queue, taskId) : taskKey },
      args: {
        progress: update.progress,
        total: update.total === undefined ? '' : String(update.total),
        message: update.message === undefined ? '' : JSON.stringify(update.message),
        now: now.toISOString(),
        channelPrefix: this.runner.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.runner.forTask(taskId).gatewayChannelSuffix,
        lockToken: lock?.token ?? '',
        backlogPrefix: this.runner.forTask(taskId).gatewayBacklogPrefix,
        backlogSuffix: this.runner.forTask(taskId).gatewayBacklogSuffix,
        publish: publishCommand(this.runner.keys),
      },
    });
    return writeOutcome<'accepted' | 'stale'>(reply.code, 'accepted', { [ResultCode.PROGRESS_STALE]: 'stale' });
  }

  /**
   * Publishes a tool's log message to the gateway holding the caller's session (PROTOCOL.md §15); nothing is stored.
   * Refused once the task is terminal, and for a run that no longer holds `lock`.
   */
  async recordLog(taskId: string, message: LogMessage, lock?: JobLock): Promise<LogOutcome> {
    const taskKey = this.runner.forTask(taskId).task(taskId);
    const reply = await this.runner.call(SCRIPTS.log, {
      keys: { task: taskKey, lock: lock ? this.runner.forTask(taskId).bullJobLock(lock.queue, taskId) : taskKey },
      args: {
        level: message.level,
        data: JSON.stringify(message.data ?? null),
        logger: message.logger === undefined ? '' : JSON.stringify(message.logger),
        channelPrefix: this.runner.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.runner.forTask(taskId).gatewayChannelSuffix,
        lockToken: lock?.token ?? '',
        backlogPrefix: this.runner.forTask(taskId).gatewayBacklogPrefix,
        backlogSuffix: this.runner.forTask(taskId).gatewayBacklogSuffix,
        publish: publishCommand(this.runner.keys),
      },
    });
    return writeOutcome<'published' | 'unrouted' | 'dropped'>(reply.code, 'published', {
      [ResultCode.UNROUTED]: 'unrouted',
      [ResultCode.CHANNEL_FULL]: 'dropped',
    });
  }

  /**
   * A run suspends (PROTOCOL.md §12.2, §12.6): lock-checked. With `request`, stores it as pending and moves the task to
   * `input_required`, unless the request is already answered.
   */
  async suspend(taskId: string, lock: JobLock, input: SuspendInput, now = new Date()): Promise<SuspendOutcome> {
    const requests = input.requests ?? [];
    const reply = await this.runner.call(SCRIPTS.suspend, {
      keys: {
        task: this.runner.forTask(taskId).task(taskId),
        lock: this.runner.forTask(taskId).bullJobLock(lock.queue, taskId),
        webhookDue: this.runner.forTask(taskId).webhooks.due,
        webhookPending: this.runner.forTask(taskId).webhooks.pending,
        webhookDead: this.runner.forTask(taskId).webhooks.dead,
      },
      args: {
        lockToken: lock.token,
        requests:
          requests.length === 0
            ? ''
            : JSON.stringify(
                requests.map((r) => [
                  r.n,
                  JSON.stringify({
                    method: r.method,
                    params: r.params,
                    ...(r.key === undefined ? {} : { key: r.key }),
                    ...(r.position === undefined ? {} : { position: r.position }),
                  }),
                ]),
              ),
        now: now.toISOString(),
        deadlineAt: input.deadlineAt,
        channelPrefix: this.runner.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.runner.forTask(taskId).gatewayChannelSuffix,
        webhookPrefix: this.runner.forTask(taskId).webhooks.eventPrefix,
        statusMessage: input.statusMessage ?? '',
        publish: publishCommand(this.runner.keys),
      },
    });
    if (reply.code === ResultCode.OK) {
      const flat = Array.isArray(reply.values[0]) ? (reply.values[0] as string[]) : [];
      const answers: Record<string, unknown> = {};
      for (let i = 0; i + 1 < flat.length; i += 2) answers[flat[i] ?? ''] = parseJson<unknown>(flat[i + 1]);
      return { outcome: 'suspended', answers };
    }
    if (reply.code === ResultCode.LOCK_LOST) return { outcome: 'lock_lost' };
    return { outcome: 'gone', status: asStatus(reply.values[0]) };
  }

  /**
   * Stores the answer to input request `n` while it is pending and moves the task back to `working` with `deadlineAt`
   * (PROTOCOL.md §12.3). A second answer, an unknown request or a task that moved on is refused, unchanged.
   */
  async answerInput(
    taskId: string,
    n: number | string,
    answer: unknown,
    deadlineAt: number,
    now = new Date(),
  ): Promise<AnswerOutcome> {
    const reply = await this.runner.call(SCRIPTS.answer, {
      keys: { task: this.runner.forTask(taskId).task(taskId) },
      args: {
        n: String(n),
        answer: JSON.stringify(answer ?? null),
        now: now.toISOString(),
        deadlineAt,
        channelPrefix: this.runner.forTask(taskId).gatewayChannelPrefix,
        channelSuffix: this.runner.forTask(taskId).gatewayChannelSuffix,
        publish: publishCommand(this.runner.keys),
      },
    });
    const [value, resumed] = reply.values as [string | undefined, number | undefined];
    if (reply.code === ResultCode.OK) return { ok: true, queue: value ?? '', resumed: resumed === 1 };
    return { ok: false, status: asStatus(value) };
  }

  /**
   * A run's durable state write (PROTOCOL.md §12.1): `field` is `state` (the tool's value) or `steps` (`ctx.step`
   * results). Lock-checked; refused once the task is terminal.
   * @throws RangeError when the value serialises to more than `MAX_STATE_BYTES`.
   */
  async setState(
    taskId: string,
    lock: JobLock,
    field: 'state' | 'steps',
    value: unknown,
  ): Promise<'written' | 'gone' | 'lock_lost'> {
    const json = JSON.stringify(value ?? null);
    if (Buffer.byteLength(json) > MAX_STATE_BYTES) {
      throw new RangeError(
        `ctx.${field === 'state' ? 'state' : 'step'} value is over ${MAX_STATE_BYTES} bytes as JSON`,
      );
    }
    const reply = await this.runner.call(SCRIPTS.setState, {
      keys: {
        task: this.runner.forTask(taskId).task(taskId),
        lock: this.runner.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, field: field === 'state' ? F.state : F.steps, json },
    });
    if (reply.code === ResultCode.OK) return 'written';
    return reply.code === ResultCode.LOCK_LOST ? 'lock_lost' : 'gone';
  }

  /**
   * Adds `tags` (checked: `tagsProblem`) to a running task's (PROTOCOL.md §30.2), lock-checked. `full`: the task would
   * carry more than `MAX_TAGS`, and nothing was written.
   */
  async addTags(
    taskId: string,
    lock: JobLock,
    tags: readonly string[],
  ): Promise<'written' | 'full' | 'gone' | 'lock_lost'> {
    const reply = await this.runner.call(SCRIPTS.tag, {
      keys: {
        task: this.runner.forTask(taskId).task(taskId),
        lock: this.runner.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, tags: tags.join(','), max: MAX_TAGS },
    });
    if (reply.code === ResultCode.OK) return 'written';
    if (reply.code === ResultCode.LIMIT_FULL) return 'full';
    return reply.code === ResultCode.LOCK_LOST ? 'lock_lost' : 'gone';
  }

  /**
   * One reaper pass (PROTOCOL.md §10.3), when `holder` gets (or already has) the lease: fails the due tasks whose
   * deadline passed or whose job is gone or failed, and schedules the others' next look.
   */
  async reap(
    holder: string,
    options: { batch?: number; leaseMs?: number } = {},
    now = new Date(),
  ): Promise<ReapOutcome> {
    if (this.runner.placement === undefined) return this.reapShard(this.runner.keys, holder, options, now);
    // Sharded: each shard has its live set and its lease (PROTOCOL.md §1.1); one pass looks at every shard.
    const outcome: ReapOutcome = { ran: false, looked: 0, reaped: [] };
    for (const keys of await this.runner.everyShard()) {
      const one = await this.reapShard(keys, holder, options, now);
      outcome.ran ||= one.ran;
      outcome.looked += one.looked;
      outcome.reaped.push(...one.reaped);
    }
    return outcome;
  }

  private async reapShard(
    keys: Keys,
    holder: string,
    options: { batch?: number; leaseMs?: number },
    now: Date,
  ): Promise<ReapOutcome> {
    const reply = await this.runner.call(SCRIPTS.reap, {
      keys: {
        live: keys.live,
        lease: keys.reaperLease,
        webhookDue: keys.webhooks.due,
        webhookPending: keys.webhooks.pending,
        webhookDead: keys.webhooks.dead,
        retention: keys.retention,
      },
      args: {
        nowMs: now.getTime(),
        now: now.toISOString(),
        batch: options.batch ?? 500,
        lookAgainMs: this.reaperIntervalMs,
        taskKeyPrefix: keys.taskKeyPrefix,
        queueKeyPrefix: keys.bullQueueKeyPrefix,
        channelPrefix: keys.gatewayChannelPrefix,
        channelSuffix: keys.gatewayChannelSuffix,
        holder,
        leaseMs: Math.max(100, options.leaseMs ?? this.reaperIntervalMs * 2),
        webhookPrefix: keys.webhooks.eventPrefix,
        publish: publishCommand(keys),
      },
    });
    if (reply.code === ResultCode.LEASE_HELD) return { ran: false, looked: 0, reaped: [] };
    const [looked, flat] = reply.values as [number, string[] | undefined];
    const reaped: ReapedTask[] = [];
    for (let i = 0; flat && i + 2 < flat.length; i += 3) {
      reaped.push({ taskId: flat[i] ?? '', code: flat[i + 1] ?? '', message: flat[i + 2] ?? '' });
    }
    return { ran: true, looked, reaped };
  }
}

function transitionOutcome(reply: ScriptReply, to: TaskStatus): TransitionOutcome {
  if (reply.code === ResultCode.OK) return { ok: true, status: to };
  const status = asStatus(reply.values[0]);
  if (reply.code === ResultCode.LOCK_LOST) return { ok: false, status, lockLost: true };
  return { ok: false, status };
}

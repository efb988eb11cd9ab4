import { TaskrelayError } from '../protocol/errors.js';
import type { JobAddScript } from '../protocol/scripts.js';
import type { ProgressToken, TaskMode, TaskRecord } from '../protocol/task-model.js';

export interface CreateTaskInput {
  /** Defaults to a fresh 128-bit random id. */
  taskId?: string;
  tool: string;
  queue: string;
  principal: string;
  mode: TaskMode;
  ttl: number;
  pollInterval: number;
  sessionId?: string;
  gatewayId?: string;
  progressToken?: ProgressToken;
  /** When the reaper fails the task if it is still not terminal (ms since epoch). Default: no deadline. */
  deadlineAt?: number;
  /** The principal's idempotency key (task mode): a second create with it returns the first task. */
  idempotencyKey?: string;
  /**
   * A dedupe digest (§25.2), when there is no idempotency key: a create with the same principal, mode, tool and digest
   * while the task it named is unfinished returns that task; the mapping lives `ttlMs` at most, and goes when the
   * task ends.
   */
  dedupe?: { digest: string; ttlMs: number };
  /** What the caller's client can answer (`elicitation`, `sampling`): `ctx.elicit` refuses what it cannot (§12). */
  clientCapabilities?: readonly string[];
  /** The call's tags (`_meta["dev.taskrelay/tags"]`, already checked: §30.2). */
  tags?: readonly string[];
  /** The call's arguments as JSON: a task-mode task keeps them for a replay (§30.2). */
  argumentsJson?: string;
  /** The task this one replays (§30.3): linked both ways as it is created. */
  replayOf?: string;
  /**
   * A `statusMessage` that says why the task waits before its first run (a delayed start, PROTOCOL.md §33.1): stored
   * with the back-off mark, so the run's start clears it as it clears a back-off's message (§3.4).
   */
  waitingMessage?: string;
  /** Completed `ctx.step` results the task starts with (a redrive, §30.3), JSON. */
  steps?: string;
  /**
   * The completion webhook the caller named, already checked by the gateway (PROTOCOL.md §27.1), and the most events
   * of this principal that may wait for delivery at once (`cap`).
   */
  webhook?: { url: string; cap: number };
  /**
   * Enter the task's job in its principal's fair share of `queue` in the same step (PROTOCOL.md §25), the share
   * outliving it by `ttlMs`; the outcome's `priority` is what to add the job with.
   */
  fairShare?: { ttlMs: number; /** The job's priority level's base (§25.1); 0 (level 1) when absent. */ base?: number };
  /**
   * The principal's open-work cap (PROTOCOL.md §25), checked and counted in the same step: the task joins the
   * principal's open-work set unless it holds `max` or more members already (then nothing is created). The set
   * outlives its newest member by `ttlMs`.
   */
  openTasks?: { max: number; ttlMs: number };
  /**
   * The task's job, added in the same round trip once the task is created (with the fair-share priority, so
   * `fairShare` must be given too). A create that creates nothing adds no job.
   */
  job?: JobAddScript;
}

export interface CreateOutcome {
  record: TaskRecord;
  /** false when the idempotency key named a live task, which `record` is. */
  created: boolean;
  /** The job's fair-share priority, when created with `fairShare`. */
  priority?: number;
  /** true when `job` was added with the task; false when it was given and its add refused (no job exists). */
  jobAdded?: boolean;
}

/** A create refused at the principal's open-work cap (`CreateTaskInput.openTasks`): nothing was created. */
export class OpenCapReached extends TaskrelayError {
  constructor(
    /** How many members the principal's open-work set holds. */
    readonly open: number,
  ) {
    super('TOO_MANY_OPEN_TASKS', `Open-work cap reached (${open} open)`);
    this.name = 'OpenCapReached';
  }
}

export interface PreparedCreate {
  taskId: string;
  now: Date;
  fields: Record<string, string>;
  idemKey: string | undefined;
  record: TaskRecord;
}

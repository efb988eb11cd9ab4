/**
 * What the stages of a task's run share (PROTOCOL.md §21.2): the runner's options, the run's scope (its job, lock,
 * task and log, and a first run's pending start), and what carrying out its end works with.
 */
import type { Job } from 'bullmq';
import {
  type JobDataSchema,
  type FairShare,
  type TaskOutputStore,
  TaskrelayError,
  isRedisUnavailableError,
  type JobLock,
  type Logger,
  type TaskStore,
} from '@taskrelay/shared';
import type { ChildRunner } from '../batch-child.js';
import type { BatchParent } from '../batch-parent.js';
import type { FirstRunStart } from '../first-run-start.js';
import type { RunEnvelope } from '../run-envelope.js';
import type { RunningJobs } from '../running-jobs.js';
import type { ToolLimits } from '../tool-limits.js';
import type { ToolVersions } from '../tool-versions.js';
import type { TaskContext } from '../../context.js';
import type { WaitpointHost } from '../../context-types.js';
import type { ToolDefinition } from '../../define-tool.js';
import type { WorkerMetrics } from '../../metrics.js';
import type { RunOutcome } from './settle.js';

/** How long a job may wait in the queue when its data does not say (the gateway's default). */
export const DEFAULT_QUEUE_TIMEOUT_MS = 3_600_000;

export interface JobRunnerOptions {
  workerId: string;
  tools: ReadonlyMap<string, ToolDefinition>;
  store: TaskStore;
  /** Where a job leaves its principal's waiting share of the pool when a run takes it (PROTOCOL.md §25). */
  fairShare: Pick<FairShare, 'leave'>;
  running: RunningJobs;
  metrics: WorkerMetrics;
  log: Logger;
  lockDurationMs: number;
  progressIntervalMs: number;
  /** True once the worker no longer takes jobs: a job fetched anyway is handed back. */
  isClosing: () => boolean;
  /** What surrounds every run, and the one hand-back (run-envelope.ts). */
  envelope: RunEnvelope;
  /** Batches (PROTOCOL.md §26): the parent's `ctx.fanOut`, and the runs of child jobs. */
  batches?: { parent: BatchParent; children: ChildRunner };
  /** Who else serves a tool version, and for how long a run leaves a task to them (PROTOCOL.md §12.11). */
  versions?: ToolVersions;
  /** The limits runs are admitted by here, per key or shared by name (PROTOCOL.md §3.5). */
  limits?: ToolLimits;
  /** Opens waitpoints for `ctx.waitpoint` (PROTOCOL.md §32). */
  waitpoints?: WaitpointHost;
  /** Where `ctx.output`, `ctx.artifact` and results by reference are stored (PROTOCOL.md §34). */
  output?: TaskOutputStore;
}

/** What every step of a run names: its job and lock token, its task, its log. */
export interface RunScope {
  job: Job<unknown, void>;
  token: string | undefined;
  taskId: string;
  lock: JobLock;
  log: Logger;
  /** A first run's start, sent as the run began and not awaited before its tool (PROTOCOL.md §21.2.1). */
  start?: FirstRunStart;
}

/** The job's data as the run read it: checked once, before the run's start is recorded. */
export type ParsedJobData = ReturnType<typeof JobDataSchema.safeParse>;

/** A run's timeout: the message the task fails with, and that failure's write once the timeout fired. */
export interface RunTimeout {
  message: string;
  failed?: Promise<void>;
}

/** What carrying out a run's end works with: the run, its context and tool, what the tool did, and its bounds. */
export interface RunEnd extends RunScope {
  ctx: TaskContext;
  tool: ToolDefinition;
  /** The arguments as the tool's schema parsed them. */
  args: Record<string, unknown>;
  outcome: RunOutcome;
  retry: { attemptsMade: number; attempts: number };
  queueTimeoutMs: number;
  timeout: RunTimeout;
  /** Whose keyed limits the run counts in (§3.5). */
  principal: string;
}

/** Runs started for the job, this one included (BullMQ counts every move to active). */
export function attemptOf(job: Job<unknown, void>): number {
  return Math.max(1, job.attemptsStarted || job.attemptsMade + 1);
}

/** Marks a failure of the worker's own Redis bookkeeping (as opposed to the tool's) as REDIS_UNAVAILABLE. */
export async function bookkeeping<T>(write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (error) {
    if (isRedisUnavailableError(error)) {
      throw new TaskrelayError('REDIS_UNAVAILABLE', 'Redis is unreachable', { cause: error });
    }
    throw error;
  }
}

export function minDefined(a: number | undefined, b: number | undefined): number | undefined {
  if (a === undefined) return b;
  return b === undefined ? a : Math.min(a, b);
}

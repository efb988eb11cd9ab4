/**
 * What the stages of a batch child's run share (PROTOCOL.md §26.3): its job's data, the child as its record names it,
 * the runner's options, and what carrying out its end works with.
 */
import type { Job } from 'bullmq';
import { z } from 'zod';
import type { BatchOutcome, BatchStore, FairShare, Logger, Runs, TaskOutputStore } from '@taskrelay/shared';
import type { TaskContext } from '../../context.js';
import type { ToolDefinition } from '../../define-tool.js';
import type { WorkerMetrics } from '../../metrics.js';
import type { BatchQueues } from '../batch-queues.js';
import type { RunEnvelope } from '../run-envelope.js';
import type { ToolLimits } from '../tool-limits.js';

/** A child job's data (written by the parent, engine/batch-parent.ts). */
export const ChildJobDataSchema = z.object({
  taskId: z.string().min(1),
  child: z.number().int().nonnegative(),
  tool: z.string(),
  arguments: z.record(z.string(), z.unknown()),
  principal: z.string().optional(),
  timeoutMs: z.number().int().positive().optional(),
  maxOpen: z.number().int().positive().optional(),
});

export type ChildJobData = z.infer<typeof ChildJobDataSchema>;

/** A child as its record names it: its parent and index, who owns it, and how its parent's next window is released. */
export interface BatchChild {
  parentId: string;
  index: number;
  owner: string;
  parentPool: string;
  tool: string;
  maxOpen: number | undefined;
  level: number;
  /**
   * The sharded layout (§26.10): the outcome a run of this child claimed on its shard before its worker died (the
   * first record step): it is counted, the tool not run again.
   */
  claimed?: BatchOutcome;
}

/** What carrying out a child's end works with: its job, its tool and parsed arguments, and its record. */
export interface ChildEnd {
  job: Job<unknown, void>;
  token: string | undefined;
  parentId: string;
  tool: ToolDefinition;
  args: Record<string, unknown>;
  timeoutMs: number | undefined;
  record: (outcome: BatchOutcome) => Promise<void>;
  log: Logger;
  ctx: TaskContext;
  /** The batch's principal: whose keyed limits the child counts in (§3.5). */
  principal: string;
}

export interface ChildRunnerOptions {
  tools: ReadonlyMap<string, ToolDefinition>;
  batches: BatchStore;
  /** The parent's progress writes (unlocked: the parent's lock is not this worker's). */
  store: Pick<Runs, 'recordProgress'>;
  /** Where a child's output, artifacts and large result go (PROTOCOL.md §34): its parent task's. */
  output?: TaskOutputStore;
  queues: BatchQueues;
  fairShare: Pick<FairShare, 'leave'>;
  metrics: WorkerMetrics;
  log: Logger;
  progressIntervalMs: number;
  isClosing: () => boolean;
  /** What surrounds every run, and the one hand-back (run-envelope.ts): the same as a task's. */
  envelope: RunEnvelope;
  /** The limits runs are admitted by here (PROTOCOL.md §3.5): a child counts like any other run. */
  limits?: ToolLimits;
  /**
   * Releases the next window when the parent this child's record should wake is not waiting (its run live, or lost
   * until a takeover, §26.3 step 4): `BatchParent.releaseFromChild`.
   */
  releaseNext?: (parentId: string, maxOpen: number | undefined, level: number, log: Logger) => Promise<number>;
  /** How long a child's outcome write that finds Redis unreachable is tried again (PROTOCOL.md §10.10); 0: not at all. */
  outageWindowMs?: number;
}

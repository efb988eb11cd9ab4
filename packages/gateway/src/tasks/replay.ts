/**
 * Replay (PROTOCOL.md §30.3): an ended task runs again as a new task, never as a changed one (a terminal task never
 * changes, §2). The new task has the original's tool, arguments, owner, ttl, tags and webhook, and the two are linked
 * both ways by the create itself. A redrive starts it with the original's completed `ctx.step` results, so the steps
 * that succeeded do not run again.
 */
import {
  TaskrelayError,
  isTerminal,
  type Logger,
  type TaskStore,
  type TaskFilter,
  type TaskRecord,
  type TaskSearch,
} from '@taskrelay/shared';
import type { TaskService } from './task-service.js';

export interface ReplayOptions {
  /** Start with the original's completed steps (a redrive). */
  redrive?: boolean;
  /** Who asked (the operator's principal), for the audit line. */
  by: string;
}

export interface BulkReplayOutcome {
  matched: number;
  /** Stopped at `BULK_REPLAY_MAX`: more ended tasks match. */
  truncated: boolean;
  /** Matched, but replayed already (their `replayedBy` is set): left alone unless `again`. */
  skipped: number;
  replayed: Array<{ from: string; to: string }>;
  failed: Array<{ from: string; error: string }>;
}

/** The most tasks one bulk replay (or its dry run) takes. */
export const BULK_REPLAY_MAX = 1_000;

function refused(message: string): TaskrelayError {
  return new TaskrelayError('REPLAY_REFUSED', message);
}

export class TaskReplay {
  constructor(
    private readonly store: TaskStore,
    private readonly search: TaskSearch,
    private readonly service: Pick<TaskService, 'start' | 'resolveCall'>,
    private readonly log: Logger,
  ) {}

  /** Replays one ended task: resolves with the new task. */
  async replay(taskId: string, options: ReplayOptions): Promise<TaskRecord> {
    const original = await this.store.records.get(taskId);
    if (!original) throw new TaskrelayError('TASK_NOT_FOUND', `Task ${taskId} not found (unknown, or expired)`);
    if (!isTerminal(original.status)) {
      throw refused(`Task ${taskId} is ${original.status}: only an ended task is replayed (cancel it first)`);
    }
    const json = await this.store.records.getArguments(taskId);
    if (json === undefined) {
      throw refused(
        `Task ${taskId} kept no arguments (a plain call, or created before replays), so it cannot be replayed`,
      );
    }
    const args = JSON.parse(json) as Record<string, unknown>;
    const { tool, invalid } = await this.service.resolveCall(original.tool, args).catch((error: unknown) => {
      throw error instanceof TaskrelayError && error.code === 'TOOL_NOT_FOUND'
        ? refused(`Tool ${original.tool} is served by no live worker or retained pool: task ${taskId} cannot run again`)
        : error;
    });
    if (invalid !== undefined) throw refused(`Task ${taskId}'s arguments no longer fit tool ${tool.name}: ${invalid}`);
    const steps = options.redrive && original.steps ? JSON.stringify(original.steps) : undefined;
    const record = await this.service.start({
      tool,
      args,
      mode: 'task',
      principal: original.principal,
      sessionId: undefined,
      progressToken: undefined,
      requestedTtlMs: original.ttl,
      tags: original.tags,
      // As a call's `_meta["dev.taskrelay/webhook"]` names it: checked again, as at the original's creation.
      webhook: original.webhookUrl === undefined ? undefined : { url: original.webhookUrl },
      replay: { of: taskId, ...(steps === undefined ? {} : { steps }) },
    });
    this.log.info(
      { by: options.by, taskId, replayTaskId: record.taskId, tool: tool.name, redrive: options.redrive === true },
      'task replayed',
    );
    return record;
  }

  /**
   * Replays every ended task `filter` selects, up to `BULK_REPLAY_MAX`; a dry run only counts them. A task replayed
   * already is skipped unless `again`: running the same bulk replay twice does not run the work twice.
   */
  async replayMany(
    filter: TaskFilter,
    options: ReplayOptions & { dryRun?: boolean; again?: boolean },
  ): Promise<BulkReplayOutcome> {
    const found = await this.search.ended(filter, BULK_REPLAY_MAX);
    const tasks = options.again ? found.tasks : found.tasks.filter((t) => t.replayedBy === undefined);
    const outcome: BulkReplayOutcome = {
      matched: tasks.length,
      truncated: found.truncated,
      skipped: found.tasks.length - tasks.length,
      replayed: [],
      failed: [],
    };
    if (options.dryRun) return outcome;
    for (const t of tasks) {
      try {
        const record = await this.replay(t.taskId, options);
        outcome.replayed.push({ from: t.taskId, to: record.taskId });
      } catch (error) {
        outcome.failed.push({ from: t.taskId, error: error instanceof Error ? error.message : String(error) });
      }
    }
    return outcome;
  }
}

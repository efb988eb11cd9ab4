/**
 * The admit stage of a run (PROTOCOL.md §3.5, §10.6, §26.3): the checks before its tool runs (the job's data, the tool
 * served here, the stall count, the arguments), then the tool's own per-key or shared limits. A failed check fails the
 * task (`TaskAdmission`), or is the child's failed outcome (`ChildAdmission`); a limit that says wait sends the run
 * back to wait, holding no slot.
 */
import type { Job } from 'bullmq';
import { type BatchOutcome, type JobData, isRedisUnavailableError, queueOfBullName } from '@taskrelay/shared';
import { describeIssues, type ToolDefinition } from '../../define-tool.js';
import { UNREADABLE_JOB_DATA } from '../slot-gate.js';
import type { LimitWait } from '../tool-limits.js';
import type { RunningJob } from '../running-jobs.js';
import type { ChildJobData, ChildRunnerOptions } from './child-scope.js';
import { failed } from './record-child.js';
import type { TaskRecorder } from './record.js';
import type { JobRunnerOptions, ParsedJobData, RunScope } from './run-scope.js';

export class TaskAdmission {
  constructor(
    private readonly o: JobRunnerOptions,
    private readonly recorder: TaskRecorder,
  ) {}

  /**
   * The checks before the tool runs: the job's data names its task, its tool is served here, it has not stalled too
   * often, and its arguments fit the tool's schema. A failed check fails the task; the job ends unrecoverably.
   */
  async check(
    run: RunScope,
    parsed: ParsedJobData,
  ): Promise<{ data: JobData; tool: ToolDefinition; input: Record<string, unknown> }> {
    const { job, taskId } = run;
    if (!parsed.success || parsed.data.taskId !== taskId) {
      const unreadable = (job.data as Record<string, unknown> | null | undefined)?.[UNREADABLE_JOB_DATA];
      const message = parsed.success
        ? `Invalid job data: taskId ${parsed.data.taskId} does not match job id ${taskId}`
        : `Invalid job data: ${typeof unreadable === 'string' ? unreadable : describeIssues(parsed.error)}`;
      return this.recorder.failJob(run, 'INTERNAL', message);
    }
    const { tool: toolName, arguments: args } = parsed.data;

    const tool = this.o.tools.get(toolName);
    if (!tool) {
      const message = `Tool ${toolName} is not served by worker ${this.o.workerId} (queue ${queueOfBullName(job.queueName)})`;
      return this.recorder.failJob(run, 'TOOL_NOT_FOUND', message);
    }

    // A crash is not the tool's fault, but a job that keeps killing its workers must stop somewhere (§10.6).
    if (job.stalledCounter > tool.maxStalls) {
      const message =
        `The worker running this task stopped responding ${job.stalledCounter} times (crashed or lost its lock); ` +
        `giving up (maxStalls ${tool.maxStalls})`;
      return this.recorder.failJob(run, 'JOB_LOST', message);
    }

    const input = tool.inputSchema.safeParse(args);
    if (!input.success) {
      const message = `Invalid arguments for tool ${tool.name}: ${describeIssues(input.error)}`;
      return this.recorder.failJob(run, 'INVALID_ARGUMENTS', message);
    }
    return { data: parsed.data, tool, input: input.data };
  }

  /**
   * Asks the tool's own limits (§3.5) whether the run may start. A key function that throws fails the task (the
   * tool's definition is at fault, and no retry would change it); Redis lost is the envelope's (a hand-back).
   */
  async admit(
    run: RunScope,
    tool: ToolDefinition,
    args: Record<string, unknown>,
    entry: RunningJob,
  ): Promise<LimitWait | undefined> {
    if (!this.o.limits) return undefined;
    try {
      return await this.o.limits.admit(tool, args, run.job, entry);
    } catch (error) {
      if (isRedisUnavailableError(error)) throw error;
      return this.recorder.failJob(run, 'INTERNAL', error instanceof Error ? error.message : String(error));
    }
  }
}

/** The admit stage of a batch child's run: the same checks and limits as a task's, refusing with the child's outcome. */
export class ChildAdmission {
  constructor(private readonly o: Pick<ChildRunnerOptions, 'tools' | 'limits'>) {}

  check(
    job: Job<unknown, void>,
    data: ChildJobData,
  ): { tool: ToolDefinition; args: Record<string, unknown> } | { refused: BatchOutcome } {
    return checkChild(this.o.tools, job, data);
  }

  /**
   * Asks the tool's own limits (§3.5) whether the child may start: a wait sends it back holding no slot; a key function
   * that throws is the child's failed outcome; Redis lost is the envelope's (a hand-back).
   */
  async admit(
    tool: ToolDefinition,
    args: Record<string, unknown>,
    job: Job<unknown, void>,
    entry: RunningJob,
  ): Promise<{ wait?: LimitWait } | { refused: BatchOutcome }> {
    if (!this.o.limits) return {};
    try {
      const wait = await this.o.limits.admit(tool, args, job, entry);
      return wait ? { wait } : {};
    } catch (error) {
      if (isRedisUnavailableError(error)) throw error;
      return { refused: failed('INTERNAL', error instanceof Error ? error.message : String(error)) };
    }
  }
}

/**
 * The checks before the child's tool runs: the tool is served here, the child has not stalled too often, and its
 * arguments fit the tool's schema. A failed check is the child's failed outcome (`refused`).
 */
export function checkChild(
  tools: ReadonlyMap<string, ToolDefinition>,
  job: Job<unknown, void>,
  data: ChildJobData,
): { tool: ToolDefinition; args: Record<string, unknown> } | { refused: BatchOutcome } {
  const tool = tools.get(data.tool);
  if (!tool) {
    return {
      refused: failed(
        'TOOL_NOT_FOUND',
        `Tool ${data.tool} is not served by this worker (queue ${queueOfBullName(job.queueName)})`,
      ),
    };
  }
  if (job.stalledCounter > tool.maxStalls) {
    return {
      refused: failed(
        'JOB_LOST',
        `The worker running this child stopped responding ${job.stalledCounter} times; giving up`,
      ),
    };
  }
  const input = tool.inputSchema.safeParse(data.arguments);
  if (!input.success) {
    return {
      refused: failed('INVALID_ARGUMENTS', `Invalid arguments for tool ${tool.name}: ${describeIssues(input.error)}`),
    };
  }
  return { tool, args: input.data };
}

/**
 * The task service's configuration and the policy it applies to every call: the ttl granted, the run's time bounds,
 * the priority level a caller may ask for. Pure functions of the tool, the config and the request.
 */
import { DEFAULT_PRIORITY, PRIORITY_LEVELS, TaskrelayError, type InputRequest } from '@taskrelay/shared';
import type { CatalogTool } from './catalog.js';
import type { WebhookIntake } from './webhooks/intake.js';

export interface TaskServiceConfig {
  gatewayId: string;
  defaultTtlMs: number;
  maxTtlMs: number;
  pollIntervalMs: number;
  maxToolTimeoutMs: number;
  /** How long a job may wait for a worker before the reaper fails its task (PROTOCOL.md §10.2). */
  queueTimeoutMs: number;
  /** The per-principal cap on unfinished tasks and plain calls. Default: none. */
  openTasks?: OpenTaskCap;
  /**
   * Checks a client's answer against its input request (PROTOCOL.md §12.5). The answer's shapes are the wire's, so
   * the check is given here rather than written in this layer.
   */
  checkAnswer: AnswerChecker;
  /** The creation-time webhook checks (PROTOCOL.md §27.1). Default: none, so every webhook is refused. */
  webhooks?: Pick<WebhookIntake, 'accept'>;
}

/**
 * The per-principal cap on unfinished work, tasks and plain calls (PROTOCOL.md §25). The task's create script checks
 * it and counts the task in the same step; at the cap, `prune` drops what has ended from the principal's set and the
 * create is tried once more, and `refusal` is the error when it is still at the cap.
 */
export interface OpenTaskCap {
  /** The cap (0: none); a job carries it, so a batch's children are held to it too (PROTOCOL.md §26.6). */
  readonly max: number;
  /** How long the principal's set outlives its newest member. */
  readonly ttlMs: number;
  /** Removes ended work (and stale reservations) from the principal's set; resolves with how many members remain. */
  prune(principal: string, taskId?: string): Promise<number>;
  /** The error for a principal with `open` unfinished tasks and calls, at the cap. */
  refusal(open: number): Error;
}

export type AnswerCheck = { ok: true; answer: Record<string, unknown> } | { ok: false; message: string };
export type AnswerChecker = (request: InputRequest, raw: unknown) => AnswerCheck;

/** A plain call's task is read once, by the waiter, right after it ends: it need not stay long (bounded Redis). */
export const CALL_TTL_MS = 10_000;
/** How long a cancel answered here waits for the owning gateway's ack (PROTOCOL.md §10.9). */
export const CANCEL_ACK_TIMEOUT_MS = 500;

/** A tool's run-time bound: its own `timeoutMs`, never above the gateway's maximum. */
export function toolTimeoutMs(
  tool: Pick<CatalogTool, 'timeoutMs'> | undefined,
  config: Pick<TaskServiceConfig, 'maxToolTimeoutMs'>,
): number {
  return Math.min(tool?.timeoutMs ?? config.maxToolTimeoutMs, config.maxToolTimeoutMs);
}

/**
 * When the reaper may fail a task that has not finished (PROTOCOL.md §10): its wait in the queue, then its run. The
 * one place it is computed, for a new task and for a resumed one (both answer routes, §12.3).
 */
export function runDeadlineAt(
  tool: Pick<CatalogTool, 'timeoutMs'> | undefined,
  config: Pick<TaskServiceConfig, 'maxToolTimeoutMs' | 'queueTimeoutMs'>,
  now = Date.now(),
): number {
  return now + config.queueTimeoutMs + toolTimeoutMs(tool, config);
}

/** The smallest ttl granted: a terminal task stays readable at least this long. */
export const MIN_TTL_MS = 1_000;

/** The ttl actually granted (the spec lets the receiver choose): whole ms, between MIN_TTL_MS and the maximum. */
export function grantTtl(
  requested: number | undefined,
  config: Pick<TaskServiceConfig, 'defaultTtlMs' | 'maxTtlMs'>,
): number {
  const wanted = requested !== undefined && Number.isFinite(requested) ? requested : config.defaultTtlMs;
  return Math.min(config.maxTtlMs, Math.max(MIN_TTL_MS, Math.round(wanted)));
}

/**
 * A call's priority level (PROTOCOL.md §25.1): what it asks for (`_meta["dev.taskrelay/priority"]`), else its tool's
 * (`defineTool({ priority })`), else 3. A principal may ask for its tool's level or a later one (4, 5); only an
 * operator may ask for an earlier one, so priority never lets a principal take more than its share from others.
 */
export function priorityLevel(
  tool: Pick<CatalogTool, 'name' | 'priority'>,
  input: { priority?: number | undefined; operator?: boolean | undefined },
): number {
  const own = tool.priority ?? DEFAULT_PRIORITY;
  const asked = input.priority;
  if (asked === undefined) return own;
  if (asked < own && !input.operator) {
    throw new TaskrelayError(
      'INVALID_ARGUMENTS',
      `_meta["dev.taskrelay/priority"] ${asked} is ahead of what tool ${tool.name} allows (${own}); ` +
        `ask for ${own} to ${PRIORITY_LEVELS}, or be an operator`,
    );
  }
  return asked;
}

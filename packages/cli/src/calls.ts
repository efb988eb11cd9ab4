/**
 * Running one tool call (as a task or a plain blocking call) or following one existing task, each cancellable.
 * A task call's progress arrives on the session's stream with the call's own progress token (the SDK keeps the
 * handler past the CreateTaskResult), so every call feeds only its own view.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  type CallToolResult,
  type Task,
} from '@modelcontextprotocol/sdk/types.js';
import type { CallView, Outcome, Progress } from './output.js';
import { httpRefusal } from './errors.js';

/** `tasks/result` and plain calls block for as long as the tool runs: far past the SDK's 60 s default. */
const LONG_WAIT_MS = 7 * 24 * 3600_000;
/** Plain calls: the SDK's idle timeout, reset by every progress notification. */
const PLAIN_IDLE_MS = 10 * 60_000;

export interface Run {
  readonly done: Promise<Outcome>;
  /** Cancels: `tasks/cancel` for a task (once its id is known), `notifications/cancelled` for a plain call. */
  cancel(): Promise<void>;
}

export interface CallSpec {
  tool: string;
  args: Record<string, unknown>;
  /** Call as a task (`params.task`), with this ttl when given. */
  task: boolean;
  ttlMs: number | undefined;
  /** `_meta["dev.taskrelay/start-at"]`: an ISO time the task starts at (PROTOCOL.md §33.1). */
  startAt?: string | undefined;
}

export function startCall(client: Client, spec: CallSpec, view: CallView): Run {
  return spec.task ? startTaskCall(client, spec, view) : startPlainCall(client, spec, view);
}

function startPlainCall(client: Client, spec: CallSpec, view: CallView): Run {
  const abort = new AbortController();
  const done = (async (): Promise<Outcome> => {
    try {
      const result = await client.callTool({ name: spec.tool, arguments: spec.args }, CallToolResultSchema, {
        signal: abort.signal,
        onprogress: (p) => view.progress(p),
        timeout: PLAIN_IDLE_MS,
        resetTimeoutOnProgress: true,
        maxTotalTimeout: LONG_WAIT_MS,
      });
      return finish(view, { status: result.isError ? 'failed' : 'completed', result: result as CallToolResult });
    } catch (error) {
      if (abort.signal.aborted) return finish(view, { status: 'cancelled' });
      return finish(view, { status: 'failed', error: messageOf(error) });
    }
  })();
  return {
    done,
    cancel: async () => {
      // The SDK sends notifications/cancelled for the aborted request; Connection.close() waits for it to go out.
      abort.abort('Cancelled by the user (Ctrl-C)');
      await done;
    },
  };
}

function startTaskCall(client: Client, spec: CallSpec, view: CallView): Run {
  let created: (taskId: string | undefined) => void = () => undefined;
  const taskIdKnown = new Promise<string | undefined>((resolve) => (created = resolve));
  // Progress comes on the session's stream and may beat the CreateTaskResult: hold it until the task is shown.
  let early: Progress[] | undefined = [];
  const onProgress = (p: Progress) => (early ? early.push(p) : view.progress(p));
  const done = (async (): Promise<Outcome> => {
    let taskId: string | undefined;
    try {
      const { task } = await client.request(
        {
          method: 'tools/call',
          params: {
            name: spec.tool,
            arguments: spec.args,
            task: spec.ttlMs === undefined ? {} : { ttl: spec.ttlMs },
            ...(spec.startAt === undefined ? {} : { _meta: { 'dev.taskrelay/start-at': spec.startAt } }),
          },
        },
        CreateTaskResultSchema,
        { onprogress: onProgress },
      );
      taskId = task.taskId;
      created(taskId);
      view.task(task);
      for (const p of early ?? []) view.progress(p);
      early = undefined;
      return await followTask(client, taskId, view);
    } catch (error) {
      created(undefined);
      return finish(view, { status: 'failed', taskId, error: messageOf(error) });
    }
  })();
  return {
    done,
    cancel: async () => {
      const taskId = await taskIdKnown;
      if (taskId !== undefined) await client.experimental.tasks.cancelTask(taskId).catch(() => undefined);
      await done;
    },
  };
}

/**
 * Blocks on `tasks/result` until the task is terminal, then reads its final status: the result alone cannot tell a
 * cancelled task from a failed one.
 */
async function followTask(client: Client, taskId: string, view: CallView): Promise<Outcome> {
  const result: CallToolResult = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema, {
    timeout: LONG_WAIT_MS,
  });
  const task = await client.experimental.tasks.getTask(taskId);
  view.task(task);
  return finish(view, { status: outcomeStatus(task, result), taskId, result });
}

/** `watch ID`: polls `tasks/get` at the task's `pollInterval`, showing status and message, until it is terminal. */
export function watchTask(client: Client, taskId: string, view: CallView): Run {
  let stopped = false;
  let wake: () => void = () => undefined;
  let last: Task | undefined;
  const done = (async (): Promise<Outcome> => {
    try {
      for (;;) {
        const task = await client.experimental.tasks.getTask(taskId);
        last = task;
        view.task(task);
        const shown = progressOfMessage(task.statusMessage);
        if (shown) view.progress(shown);
        if (['completed', 'failed', 'cancelled'].includes(task.status)) {
          const result: CallToolResult = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
          return finish(view, { status: outcomeStatus(task, result), taskId, result });
        }
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, task.pollInterval ?? 1000);
        });
        // Not "cancelled": nothing was cancelled, the task is someone's call and goes on.
        if (stopped) {
          return finish(view, {
            status: 'stopped',
            taskId,
            error: `stopped watching; task ${taskId} goes on (${last?.status ?? 'unknown'})`,
          });
        }
      }
    } catch (error) {
      return finish(view, { status: 'failed', taskId, error: messageOf(error) });
    }
  })();
  return {
    done,
    // Ctrl-C stops watching; the task is someone's call and goes on (`taskrelay cancel ID` cancels it).
    cancel: async () => {
      stopped = true;
      wake();
      await done;
    },
  };
}

/**
 * The 2025-11-25 task rendering carries no progress numbers, only `statusMessage` (the latest progress message):
 * `watch` shows a fraction when the message holds one ("Processed 3 of 10 items", "3/10").
 */
export function progressOfMessage(
  message: string | undefined,
): { progress: number; total: number; message: string } | undefined {
  const match = message === undefined ? null : /(\d+)\s*(?:of|\/)\s*(\d+)/.exec(message);
  if (!match || message === undefined) return undefined;
  return { progress: Number(match[1]), total: Number(match[2]), message };
}

function outcomeStatus(task: Task, result: CallToolResult): Outcome['status'] {
  if (task.status === 'cancelled') return 'cancelled';
  if (task.status === 'failed' || result.isError) return 'failed';
  return 'completed';
}

function finish(view: CallView, outcome: Outcome): Outcome {
  view.end(outcome);
  return outcome;
}

function messageOf(error: unknown): string {
  return httpRefusal(error) ?? (error instanceof Error ? error.message : String(error));
}

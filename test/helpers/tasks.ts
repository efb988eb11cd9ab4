/**
 * Starting and reading tasks the way a 2025-11-25 client does, for every cross-process suite: one `tools/call` with
 * `params.task` in place of the copies each suite used to write for itself.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  GetTaskResultSchema,
  type CallToolResult,
  type GetTaskResult,
} from '@modelcontextprotocol/sdk/types.js';
import { scaled } from './load.js';

export interface StartTaskOptions {
  /** Sent as `_meta.progressToken`, so the gateway forwards the task's progress to this client. */
  progressToken?: string | number;
  /** More `_meta` (an idempotency key, the tasks extension's capabilities…). */
  meta?: Record<string, unknown>;
  /** The requested ttl. Default 120 000 ms. */
  ttl?: number;
  /** How long the call may take to answer `CreateTaskResult`. Default 15 000 ms. */
  timeoutMs?: number;
}

/** A task-augmented `tools/call`; resolves with the task id once the gateway has stored the task. */
export async function startTask(
  client: Client,
  name: string,
  args: Record<string, unknown>,
  options: StartTaskOptions = {},
): Promise<string> {
  const meta: Record<string, unknown> = { ...options.meta };
  if (options.progressToken !== undefined) meta['progressToken'] = options.progressToken;
  const created = await client.request(
    {
      method: 'tools/call',
      params: {
        name,
        arguments: args,
        task: { ttl: options.ttl ?? 120_000 },
        ...(Object.keys(meta).length > 0 ? { _meta: meta } : {}),
      },
    },
    CreateTaskResultSchema,
    { timeout: scaled(options.timeoutMs ?? 15_000) },
  );
  return created.task.taskId;
}

/** `tasks/get`. */
export function getTask(client: Client, taskId: string): Promise<GetTaskResult> {
  return client.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema);
}

/** `tasks/result`, bounded: a hung request fails the test instead of the test timeout. */
export function taskResult(client: Client, taskId: string, timeoutMs = 20_000): Promise<CallToolResult> {
  return client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema, { timeout: scaled(timeoutMs) });
}

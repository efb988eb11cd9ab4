/**
 * The 2025-11-25 rendering of a stored task. The `io.modelcontextprotocol/tasks` extension will be a second
 * rendering of the same `TaskRecord`, beside this one.
 */
import { RELATED_TASK_META_KEY, type CallToolResult, type Task } from '@modelcontextprotocol/sdk/types.js';
import type { TaskRecord } from '@taskrelay/shared';

export function renderTask(record: TaskRecord): Task {
  const task: Task = {
    taskId: record.taskId,
    status: record.status,
    createdAt: record.createdAt,
    lastUpdatedAt: record.lastUpdatedAt,
    ttl: record.ttl,
    pollInterval: record.pollInterval,
  };
  if (record.statusMessage !== undefined) task.statusMessage = record.statusMessage;
  return task;
}

/** The tool's CallToolResult for a terminal task: completed and failed store one; a cancelled task gets an error one. */
export function renderResult(record: TaskRecord): CallToolResult {
  if (record.result && (record.status === 'completed' || record.status === 'failed')) {
    return record.result as CallToolResult;
  }
  if (record.status === 'cancelled') {
    return { content: [{ type: 'text', text: 'Task was cancelled' }], isError: true };
  }
  const message = record.error?.message ?? `Task ended ${record.status} without a result`;
  return { content: [{ type: 'text', text: message }], isError: true };
}

export function relatedTaskMeta(taskId: string): Record<string, unknown> {
  return { [RELATED_TASK_META_KEY]: { taskId } };
}

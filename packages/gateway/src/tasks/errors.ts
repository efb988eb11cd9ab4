/**
 * The task layer's own errors: domain errors, never JSON-RPC ones. The wire (`wire/errors.ts`, `toMcpError`) gives
 * each its JSON-RPC code.
 */
import { TaskrelayError } from '@taskrelay/shared';

/**
 * A call's task augmentation does not fit the tool's `taskSupport` (a `params.task` for a `forbidden` tool, none for
 * a `required` one): the spec answers it -32601.
 */
export class TaskSupportMismatchError extends TaskrelayError {
  constructor(message: string) {
    super('TASK_SUPPORT_MISMATCH', message);
    this.name = 'TaskSupportMismatchError';
  }
}

export function taskNotFound(taskId: string): TaskrelayError {
  return new TaskrelayError('TASK_NOT_FOUND', `Task not found: ${taskId}`);
}

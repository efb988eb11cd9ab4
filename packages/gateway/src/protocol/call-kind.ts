/**
 * What a `tools/call` is, decided once (PROTOCOL.md §16, §17): a task, a plain call (one that may become a task once
 * its questions are answered, §17.4), the retry of an input round (§17.3), or a call the era refuses. A pure function of
 * the era's rules, the request's rendering and fields, and the tool's `taskSupport` and `inputFirst`, so the whole
 * matrix is one table in its test (packages/gateway/test/call-kind.test.ts).
 */
import type { ToolDescriptor } from '@taskrelay/shared';

export type CallKind =
  | { kind: 'task' }
  | { kind: 'call'; becomesTask: boolean }
  | { kind: 'round-retry' }
  /** The spec's -32601: a 2025-11-25 call whose `params.task` does not fit the tool's `taskSupport`. */
  | { kind: 'task-support-mismatch'; message: string }
  /** 2026-07-28's -32021: a task-required tool called by a client without the tasks extension (SEP-2575). */
  | { kind: 'task-required' };

export interface CallShape {
  /** The request renders tasks as the `io.modelcontextprotocol/tasks` extension: the server chooses task or not. */
  extension: boolean;
  /** The era has input rounds (2026-07-28, MRTR). */
  inputRounds: boolean;
  /** The request carries `params.task`. */
  taskRequested: boolean;
  /** The request carries a `requestState` (an input round's retry). */
  requestState: boolean;
  tool: Pick<ToolDescriptor, 'name' | 'taskSupport' | 'inputFirst'>;
}

export function callKind(call: CallShape): CallKind {
  const { extension, inputRounds, taskRequested, tool } = call;
  // The extension and the 2026-07-28 era leave the choice to the server: task support is never a mismatch there.
  if (!extension && !inputRounds) {
    if (taskRequested && tool.taskSupport === 'forbidden') {
      return {
        kind: 'task-support-mismatch',
        message: `Tool ${tool.name} does not support task-augmented calls (taskSupport: forbidden)`,
      };
    }
    if (!taskRequested && tool.taskSupport === 'required') {
      return {
        kind: 'task-support-mismatch',
        message: `Tool ${tool.name} requires task augmentation: send params.task (taskSupport: required)`,
      };
    }
  }
  if (tool.taskSupport === 'required' && !extension && inputRounds) return { kind: 'task-required' };
  // Answers without a state belong to no round: a new call, which asks again (SEP-2322: ignore what is not known).
  if (inputRounds && call.requestState) return { kind: 'round-retry' };
  // An inputFirst tool asks as a plain call first and becomes a task once answered (§17.4).
  const inputFirst = inputRounds && extension && tool.inputFirst === true && tool.taskSupport !== 'forbidden';
  const asTask = extension ? tool.taskSupport !== 'forbidden' && !inputFirst : taskRequested;
  return asTask ? { kind: 'task' } : { kind: 'call', becomesTask: inputFirst };
}

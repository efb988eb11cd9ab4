/**
 * The 2026-07-28 input rounds of a plain call (MRTR, SEP-2322; PROTOCOL.md §17): the `InputRequiredResult` a round
 * ends with. The requests are keyed on the wire by the tool's name for them (`ctx.elicit(params, { key })`) or else by their number (§17.6); a retry's
 * answers are matched back the same way (`TaskService.answerCall`).
 */
import { inputKeyOf, type TaskRecord } from '@taskrelay/shared';
import type { RequestStateSigner } from './request-state.js';

/** An `InputRequiredResult`: every pending request of the call, and the state its retry echoes. */
export function inputRequiredResult(
  record: TaskRecord,
  signer: RequestStateSigner,
  options: { becomesTask: boolean; argumentsDigest: string; inputTimeoutFallbackMs?: number },
): Record<string, unknown> {
  const inputRequests: Record<string, { method: string; params: Record<string, unknown> }> = {};
  for (const n of record.pendingInputs ?? []) {
    const request = record.inputRequests?.[n];
    if (request) inputRequests[inputKeyOf(n, request)] = { method: request.method, params: request.params };
  }
  const requestState = signer.sign({
    taskId: record.taskId,
    principal: record.principal,
    tool: record.tool,
    // The round lives as long as the task waits for its answers (the tool's input timeout).
    expiresAt: record.deadlineAt ?? Date.now() + (options.inputTimeoutFallbackMs ?? 86_400_000),
    becomesTask: options.becomesTask,
    argumentsDigest: options.argumentsDigest,
  });
  return { resultType: 'input_required', inputRequests, requestState };
}

/**
 * What a result may weigh on the wire: a tool result over the gateway's limit is delivered as an error result saying
 * so, and the size every request check counts in (`http/limits.ts`).
 */
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';

/**
 * A tool result no bigger than `maxBytes` as JSON, or an error result saying it was too big: the worker stored it,
 * but the gateway does not push it through a client's stream (nor its session's replay buffer).
 */
export function capResult(result: CallToolResult, maxBytes: number): CallToolResult {
  const size = jsonBytes(result);
  if (size <= maxBytes) return result;
  return {
    content: [
      { type: 'text', text: `The result (${size} bytes) is larger than this gateway delivers (${maxBytes} bytes)` },
    ],
    isError: true,
  };
}

/** The JSON size of a value; a value too deep to serialise (stack overflow) counts as over every limit. */
export function jsonBytes(value: unknown): number {
  try {
    return Buffer.byteLength(JSON.stringify(value) ?? '');
  } catch {
    return Infinity;
  }
}

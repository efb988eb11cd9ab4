/**
 * Errors that reveal nothing: every JSON-RPC error leaving a session passes here. An internal error (-32603) the
 * gateway did not word itself (no `data.code`) carries whatever the code below threw — a Redis reply, an ioredis or
 * zod message, a stack-shaped string — so the client gets a stable message and the log gets the details. The SDK
 * validates request params with zod before any handler runs and answers a mismatch as -32603 with the raw issue
 * list: those become -32602 naming the first field.
 */
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC, type Logger } from '@taskrelay/shared';

export function sanitizeOutgoing(message: JSONRPCMessage, log: Logger, sessionId: string | undefined): JSONRPCMessage {
  if (!('error' in message)) return message;
  const { error } = message;
  if (error.code !== (JSON_RPC.INTERNAL_ERROR as number) || error.data !== undefined) return message;
  const issue = firstZodIssue(error.message);
  if (issue !== undefined) {
    return { ...message, error: { code: JSON_RPC.INVALID_PARAMS, message: `Invalid params: ${issue}` } };
  }
  log.warn({ sessionId, requestId: message.id, detail: error.message }, 'internal error answered to a client');
  return { ...message, error: { code: JSON_RPC.INTERNAL_ERROR, message: 'Internal error' } };
}

/** `path: message` of the first issue when `text` is a zod issue list (ZodError's message), else undefined. */
function firstZodIssue(text: string): string | undefined {
  if (!text.startsWith('[')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!Array.isArray(parsed) || parsed.length === 0) return undefined;
  const first = parsed[0] as { path?: unknown; message?: unknown };
  if (!Array.isArray(first.path) || typeof first.message !== 'string') return undefined;
  const path = (first.path[0] === 'params' ? first.path.slice(1) : first.path).map(String).join('.');
  // The issue's message is zod's wording about the client's own input ("expected string, received number").
  const detail = first.message.replace(/^Invalid input: /, '').slice(0, 200);
  return `${path === '' ? 'params' : path}: ${detail}`;
}

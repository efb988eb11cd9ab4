/**
 * What a POST to a session must be before its messages reach the SDK's `Server` (PROTOCOL.md §9): the checks of the
 * SDK 1.32.2 `StreamableHTTPServerTransport`, in its order and with its status codes and messages (both media types
 * accepted, at most 100 messages, each a JSON-RPC message, one `initialize` and only once), and ours after them (no id
 * already in flight). Pure: the transport answers a refusal and keeps the session's state.
 */
import {
  InitializeRequestSchema,
  JSONRPCMessageSchema,
  type InitializeRequest,
  type JSONRPCMessage,
  type JSONRPCRequest,
  type RequestId,
} from '@modelcontextprotocol/sdk/types.js';
import { JSON_RPC } from '@taskrelay/shared';

/** The SDK's limit on messages in one POST. */
const MAX_BATCH_SIZE = 100;

/** A POST refused before any of its messages is handled: its HTTP status and the JSON-RPC error it answers. */
export interface PostRefusal {
  refused: { status: number; code: number; message: string };
}

/** A POST's messages, and its `initialize` when it is the session's first. */
export interface PostMessages {
  messages: JSONRPCMessage[];
  initialize: InitializeRequest | undefined;
}

/** Reads a POST's body as the SDK's transport does; `initialized`: the session has had its `initialize`. */
export function readPost(accept: string | undefined, body: unknown, initialized: boolean): PostMessages | PostRefusal {
  if (!accept?.includes('application/json') || !accept.includes('text/event-stream')) {
    return refuse(
      406,
      JSON_RPC.SERVER_ERROR,
      'Not Acceptable: Client must accept both application/json and text/event-stream',
    );
  }
  // Content-Type and the body itself are checked before the body is read (http-guards.ts).
  if (Array.isArray(body) && body.length > MAX_BATCH_SIZE) {
    return refuse(400, JSON_RPC.INVALID_REQUEST, `Invalid Request: Batch must not exceed ${MAX_BATCH_SIZE} messages`);
  }
  let messages: JSONRPCMessage[];
  try {
    messages = Array.isArray(body)
      ? body.map((m) => JSONRPCMessageSchema.parse(m))
      : [JSONRPCMessageSchema.parse(body)];
  } catch {
    return refuse(400, JSON_RPC.PARSE_ERROR, 'Parse error: Invalid JSON-RPC message');
  }
  const first = messages.find((m) => isRequest(m) && m.method === 'initialize');
  if (!first) return { messages, initialize: undefined };
  const parsed = InitializeRequestSchema.safeParse(first);
  if (!parsed.success) return refuse(400, JSON_RPC.PARSE_ERROR, 'Parse error: Invalid JSON-RPC message');
  if (initialized) return refuse(400, JSON_RPC.INVALID_REQUEST, 'Invalid Request: Server already initialized');
  if (messages.length > 1) {
    return refuse(400, JSON_RPC.INVALID_REQUEST, 'Invalid Request: Only one initialization request is allowed');
  }
  return { messages, initialize: parsed.data };
}

/**
 * The first request whose id is in flight on the session, or repeated in this POST. A JSON-RPC id names one request in
 * flight: a second with the same id would take over the first one's stream, and the first would never be answered.
 */
export function duplicateRequest(
  requests: readonly JSONRPCRequest[],
  inFlight: ReadonlyMap<RequestId, unknown>,
): JSONRPCRequest | undefined {
  const ids = new Set<RequestId>();
  for (const request of requests) {
    if (inFlight.has(request.id) || ids.has(request.id)) return request;
    ids.add(request.id);
  }
  return undefined;
}

/** The answer to a duplicate id: refused with its own id, so its client knows which call to send again. */
export function duplicateAnswer(id: RequestId): string {
  return JSON.stringify({
    jsonrpc: '2.0',
    id,
    error: {
      code: JSON_RPC.INVALID_REQUEST,
      message: `Invalid Request: a request with id ${JSON.stringify(id).slice(0, 100)} is already in flight on this session; use another id`,
    },
  });
}

/**
 * A request, told apart by shape: the message already passed `JSONRPCMessageSchema` (the SDK's `isJSONRPCRequest` is
 * a second zod parse of the whole message, for each check).
 */
export function isRequest(message: JSONRPCMessage): message is JSONRPCRequest {
  return 'method' in message && 'id' in message;
}

function refuse(status: number, code: number, message: string): PostRefusal {
  return { refused: { status, code, message } };
}

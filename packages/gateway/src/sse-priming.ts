/**
 * The SDK's SSE priming event (`id: N` with an empty `data:` line, sent first on every stream so a client can resume
 * it with `Last-Event-ID` before any message arrived) is parsed as a message by clients that JSON-parse every `data`
 * line: `@ai-sdk/mcp` logs "Failed to parse message" on every request. Named `event: priming`, it is skipped by them
 * (only `message` events carry JSON-RPC) while the SDK client still records its id (it reads `id` from every event),
 * so resumption is unchanged. This wraps the SDK 1.32.2 transport's own method; on an SDK whose transport has another
 * shape, it changes nothing.
 */
import type { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';

interface PrimingInternals {
  _eventStore?: { storeEvent(streamId: string, message: unknown): Promise<string> };
  _retryInterval?: number;
  _resumableStreams?: Set<string>;
  writePrimingEvent?: (
    controller: ReadableStreamDefaultController<Uint8Array>,
    encoder: { encode(text: string): Uint8Array },
    streamId: string,
    protocolVersion: string,
  ) => Promise<void>;
}

/** Makes the transport's priming events named (`event: priming`); returns false when the SDK has no such hook. */
export function namePrimingEvents(transport: StreamableHTTPServerTransport): boolean {
  const inner = (transport as unknown as { _webStandardTransport?: PrimingInternals })._webStandardTransport;
  if (!inner || typeof inner.writePrimingEvent !== 'function') return false;
  inner.writePrimingEvent = async function (controller, encoder, streamId, protocolVersion) {
    const store = inner._eventStore;
    if (!store || protocolVersion < '2025-11-25') return;
    const id = await store.storeEvent(streamId, {});
    const retry = inner._retryInterval === undefined ? '' : `retry: ${inner._retryInterval}\n`;
    controller.enqueue(encoder.encode(`id: ${id}\n${retry}event: priming\ndata: \n\n`));
    inner._resumableStreams?.add(streamId);
  };
  return true;
}

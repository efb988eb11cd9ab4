/**
 * A Redis-backed EventStore for the SDK transport (PROTOCOL.md §9): a client whose SSE stream drops and reconnects
 * with `Last-Event-ID` is replayed every later event, even when it reconnects to a stream the gateway kept writing to.
 * One store per session, because the SDK names every session's GET stream `_GET_stream`.
 */
import type { EventId, EventStore, StreamId } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import type { Redis } from 'ioredis';
import type { Keys } from '@taskrelay/shared';

const SEPARATOR = '|';
const MAX_EVENTS_PER_STREAM = 10_000;

export class RedisEventStore implements EventStore {
  private fallbackSeq = 0;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly sessionId: string,
    private readonly ttlMs: number,
  ) {}

  async storeEvent(streamId: StreamId, message: JSONRPCMessage): Promise<EventId> {
    const key = this.key(streamId);
    try {
      const [[error, entryId] = []] =
        (await this.redis
          .multi()
          .xadd(key, 'MAXLEN', '~', MAX_EVENTS_PER_STREAM, '*', 'm', JSON.stringify(message))
          .pexpire(key, this.ttlMs)
          .exec()) ?? [];
      if (error || typeof entryId !== 'string') throw error ?? new Error('XADD returned no id');
      return `${streamId}${SEPARATOR}${entryId}`;
    } catch {
      // Redis is away: the live stream goes on without resumability for this event (an id shaped like a stream
      // entry id, so a replay after it still works), rather than failing the request.
      return `${streamId}${SEPARATOR}${Date.now()}-${this.fallbackSeq++}`;
    }
  }

  getStreamIdForEventId(eventId: EventId): Promise<StreamId | undefined> {
    return Promise.resolve(parse(eventId)?.streamId);
  }

  async replayEventsAfter(
    lastEventId: EventId,
    { send }: { send: (eventId: EventId, message: JSONRPCMessage) => Promise<void> },
  ): Promise<StreamId> {
    const parsed = parse(lastEventId);
    if (!parsed) throw new Error(`Invalid event id: ${lastEventId}`);
    const entries = await this.redis.xrange(this.key(parsed.streamId), `(${parsed.entryId}`, '+');
    for (const [entryId, fields] of entries) {
      const raw = fields[1];
      if (raw === undefined) continue;
      await send(`${parsed.streamId}${SEPARATOR}${entryId}`, JSON.parse(raw) as JSONRPCMessage);
    }
    return parsed.streamId;
  }

  private key(streamId: string): string {
    return this.keys.eventStream(`${this.sessionId}:${streamId}`);
  }
}

function parse(eventId: string): { streamId: string; entryId: string } | undefined {
  const at = eventId.lastIndexOf(SEPARATOR);
  if (at <= 0) return undefined;
  const entryId = eventId.slice(at + 1);
  if (!/^\d+-\d+$/.test(entryId)) return undefined;
  return { streamId: eventId.slice(0, at), entryId };
}

import { describe, expect, it } from 'vitest';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { SessionEventStore } from '../src/transports/session/event-store.js';

const GET = '_GET_stream';

/** A notification whose stored size (JSON + stream id) is exactly `bytes` on stream `streamId`. */
function sized(n: number, bytes: number, streamId = GET): JSONRPCMessage {
  const bare = { jsonrpc: '2.0' as const, method: 'notifications/message', params: { n, pad: '' } };
  const overhead = Buffer.byteLength(JSON.stringify(bare)) + Buffer.byteLength(streamId);
  return { ...bare, params: { n, pad: 'x'.repeat(bytes - overhead) } };
}

async function replay(store: SessionEventStore, after: string): Promise<Array<{ id: string; n: unknown }>> {
  const out: Array<{ id: string; n: unknown }> = [];
  await store.replayEventsAfter(after, {
    send: async (id, message) => {
      out.push({ id, n: (message as { params?: { n?: unknown } }).params?.n });
    },
  });
  return out;
}

function clock(start = 1_000_000) {
  let t = start;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

describe('§9 session event store', () => {
  it('replays, in order, only the events of the same stream stored after the given id', async () => {
    const store = new SessionEventStore({ ttlMs: 60_000 });
    const ids: string[] = [];
    for (let n = 1; n <= 3; n++) ids.push(await store.storeEvent(GET, sized(n, 200)));
    await store.storeEvent('post-1', sized(99, 200, 'post-1'));
    ids.push(await store.storeEvent(GET, sized(4, 200)));

    expect(await store.getStreamIdForEventId(ids[0]!)).toBe(GET);
    const replayed = await replay(store, ids[0]!);
    expect(replayed.map((e) => e.n)).toEqual([2, 3, 4]);
    // The ids replayed are the ones the events were first sent with, so a second resume continues from them.
    expect(replayed.map((e) => e.id)).toEqual(ids.slice(1));
    expect((await replay(store, ids[3]!)).map((e) => e.n)).toEqual([]);
  });

  it('refuses ids it never issued: malformed, from another session, or not issued yet', async () => {
    const store = new SessionEventStore({ ttlMs: 60_000 });
    const other = new SessionEventStore({ ttlMs: 60_000 });
    const id = await store.storeEvent(GET, sized(1, 100));
    const foreign = await other.storeEvent(GET, sized(1, 100));
    const [prefix] = id.split('.');
    for (const unknown of ['', 'garbage', `${GET}|`, foreign, `${prefix}.2`, `${prefix}.0`, `${prefix}.x`]) {
      expect(await store.getStreamIdForEventId(unknown)).toBeUndefined();
      await expect(replay(store, unknown)).rejects.toThrow(/Unknown event id/);
    }
  });

  it('keeps at most maxBytes, evicting the oldest events first', async () => {
    let gauge = 0;
    const store = new SessionEventStore({ ttlMs: 60_000, maxBytes: 1000, onResize: (delta) => (gauge += delta) });
    const first = await store.storeEvent(GET, sized(0, 100));
    for (let n = 1; n <= 12; n++) await store.storeEvent(GET, sized(n, 100));
    expect(gauge).toBe(1000);
    // Ten of 100 bytes fit: the three oldest are gone, the newest ten replay in order.
    expect((await replay(store, first)).map((e) => e.n)).toEqual([3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    // A big event evicts as many old ones as it needs, whatever their stream.
    await store.storeEvent('post-1', sized(13, 450, 'post-1'));
    expect((await replay(store, first)).map((e) => e.n)).toEqual([8, 9, 10, 11, 12]);
  });

  it('does not keep an event bigger than the cap, and keeps the older ones', async () => {
    const store = new SessionEventStore({ ttlMs: 60_000, maxBytes: 1000 });
    const first = await store.storeEvent(GET, sized(0, 100));
    await store.storeEvent(GET, sized(1, 100));
    const huge = await store.storeEvent(GET, sized(2, 1001));
    await store.storeEvent(GET, sized(3, 100));
    expect((await replay(store, first)).map((e) => e.n)).toEqual([1, 3]);
    // Its id still works as a resume point.
    expect((await replay(store, huge)).map((e) => e.n)).toEqual([3]);
  });

  it('drops events older than the ttl', async () => {
    const time = clock();
    const store = new SessionEventStore({ ttlMs: 10_000, now: time.now });
    const first = await store.storeEvent(GET, sized(0, 100));
    await store.storeEvent(GET, sized(1, 100));
    time.advance(6_000);
    await store.storeEvent(GET, sized(2, 100));
    time.advance(4_000);
    // Exactly the ttl old: still kept.
    expect((await replay(store, first)).map((e) => e.n)).toEqual([1, 2]);
    time.advance(1);
    expect((await replay(store, first)).map((e) => e.n)).toEqual([2]);
    time.advance(6_000);
    store.prune();
    expect(store.bytes).toBe(0);
    expect((await replay(store, first)).map((e) => e.n)).toEqual([]);
  });

  it('replays an event stored while the replay is under way', async () => {
    const store = new SessionEventStore({ ttlMs: 60_000 });
    const first = await store.storeEvent(GET, sized(0, 100));
    await store.storeEvent(GET, sized(1, 100));
    const seen: unknown[] = [];
    await store.replayEventsAfter(first, {
      send: async (_id, message) => {
        const n = (message as { params?: { n?: number } }).params?.n;
        seen.push(n);
        if (n === 1) await store.storeEvent(GET, sized(2, 100));
      },
    });
    expect(seen).toEqual([1, 2]);
  });

  it('releases everything when the session closes and keeps nothing after', async () => {
    let gauge = 0;
    const store = new SessionEventStore({ ttlMs: 60_000, onResize: (delta) => (gauge += delta) });
    const first = await store.storeEvent(GET, sized(0, 100));
    await store.storeEvent(GET, sized(1, 100));
    expect(gauge).toBe(200);
    store.release();
    await store.storeEvent(GET, sized(2, 100));
    expect(gauge).toBe(0);
    expect(await replay(store, first)).toEqual([]);
  });

  it('stays bounded over many more events than it can hold', async () => {
    const store = new SessionEventStore({ ttlMs: 60_000, maxBytes: 10_000 });
    let last = '';
    for (let n = 0; n < 20_000; n++) last = await store.storeEvent(`post-${n}`, sized(n, 100, `post-${n}`));
    expect(store.bytes).toBeLessThanOrEqual(10_000);
    expect(await store.getStreamIdForEventId(last)).toBe('post-19999');
  });
});

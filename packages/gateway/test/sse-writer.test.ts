/**
 * The bounded SSE writer (PROTOCOL.md §22.1) as a `subscriptions/listen` stream uses it (§18.3): over a real socket
 * whose client does not read, a task's newer frame replaces its unsent older one, the waiting frames count against
 * the bound, and passing it ends the stream with its last words rather than a bare close.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { SseWriter } from '../src/http/sse-writer.js';
import { StreamBuffers } from '../src/http/stream-buffers.js';

let server: Server | undefined;
let socket: Socket | undefined;

afterEach(async () => {
  socket?.destroy();
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  server = undefined;
});

/** A response to a client that connects and then does not read until `read()`, which returns all it got. */
async function stalledResponse(): Promise<{ res: ServerResponse; read: () => Promise<string> }> {
  let resolveRes!: (res: ServerResponse) => void;
  const gotRes = new Promise<ServerResponse>((resolve) => (resolveRes = resolve));
  server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    resolveRes(res);
  });
  await new Promise<void>((resolve) => server?.listen(0, '127.0.0.1', resolve));
  const client = connect((server.address() as AddressInfo).port, '127.0.0.1');
  socket = client;
  client.write('GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
  const res = await gotRes;
  client.pause();
  const read = async () => {
    const chunks: Buffer[] = [];
    client.on('data', (chunk: Buffer) => chunks.push(chunk));
    const closed = new Promise((resolve) => client.once('close', resolve));
    client.resume();
    await closed;
    return Buffer.concat(chunks).toString('utf8');
  };
  return { res, read };
}

/** Writes filler until the client is behind (node's buffer holds what the socket would not take). */
function fillUntilBehind(writer: SseWriter): void {
  const filler = `data: ${'f'.repeat(64 * 1024)}\n\n`;
  for (let i = 0; i < 10_000 && !writer.behind; i++) writer.write(filler);
  expect(writer.behind).toBe(true);
}

describe('SseWriter for a listen stream', () => {
  it('replaces a task’s unsent frame with its newer one, in the older one’s place', async () => {
    const { res, read } = await stalledResponse();
    const writer = new SseWriter(res, { maxBufferedBytes: 64 * 1024 * 1024, boundPending: true });
    fillUntilBehind(writer);
    writer.writeLatest('task-a', 'data: a-working\n\n');
    writer.writeLatest('task-b', 'data: b-working\n\n');
    writer.writeLatest('task-a', 'data: a-completed\n\n');
    writer.end('data: end\n\n');
    const text = await read();
    expect(text).not.toContain('a-working');
    expect(text.indexOf('a-completed')).toBeGreaterThan(-1);
    expect(text.indexOf('a-completed')).toBeLessThan(text.indexOf('b-working'));
    expect(text.indexOf('b-working')).toBeLessThan(text.indexOf('data: end'));
  });

  it('counts waiting frames against the bound, and past it says its last words and ends', async () => {
    const { res, read } = await stalledResponse();
    let overflows = 0;
    const writer = new SseWriter(res, {
      maxBufferedBytes: 1024 * 1024,
      boundPending: true,
      lastWords: () => 'data: cancelled\n\n',
      onOverflow: () => overflows++,
    });
    fillUntilBehind(writer);
    const big = `data: ${'b'.repeat(100 * 1024)}\n\n`;
    // 100 tasks of 100 KB each wait: far past 1 MiB.
    for (let i = 0; i < 100 && writer.open; i++) writer.writeLatest(`task-${i}`, big);
    expect(overflows).toBe(1);
    expect(writer.open).toBe(false);
    expect(res.writableLength).toBeLessThan(2 * 1024 * 1024);
    const text = await read();
    expect(
      text
        .split('\n')
        .filter((line) => line.startsWith('data: '))
        .at(-1),
    ).toBe('data: cancelled');
    expect(text).not.toContain('bbbb');
  });
});

describe("StreamBuffers: the streams' buffers in the memory budget (PROTOCOL.md §22.2)", () => {
  it("counts what a stalled stream holds, forgets it on close, and sheds the heaviest principal's largest first", async () => {
    let grew = 0;
    const buffers = new StreamBuffers(() => (grew += 1));
    const { res } = await stalledResponse();
    const writer = new SseWriter(res, { buffers, principal: 'alice', maxBufferedBytes: 64 * 1024 * 1024 });
    fillUntilBehind(writer);
    expect(buffers.bytes).toBe(writer.bufferedBytes);
    expect(buffers.bytes).toBeGreaterThan(0);
    expect(grew).toBeGreaterThan(0);
    // Two small streams of bob: alice holds the most, so her stream goes first, whatever bob's count.
    const bobA = { shed: () => undefined };
    const bobB = { shed: () => undefined };
    buffers.resized(bobA, 'bob', 1_000);
    buffers.resized(bobB, 'bob', 2_000);
    expect(buffers.largest()).toMatchObject({ stream: writer, principal: 'alice' });
    const closed = new Promise((resolve) => res.once('close', resolve));
    writer.shed();
    await closed;
    expect(writer.open).toBe(false);
    expect(buffers.bytes).toBe(3_000);
    expect(buffers.largest()).toMatchObject({ stream: bobB, principal: 'bob', bytes: 2_000 });
    buffers.resized(bobB, 'bob', 0);
    buffers.closed(bobA);
    expect(buffers.bytes).toBe(0);
    expect(buffers.largest()).toBeUndefined();
  });
});

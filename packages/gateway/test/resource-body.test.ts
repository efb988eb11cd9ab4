/**
 * PROTOCOL.md §34.3: a stored value's `resources/read` answer is written as it is read, chunk by chunk. The body is one
 * valid JSON-RPC response whatever falls on a chunk boundary (a split UTF-8 character, a quote, a newline), binary
 * values come back as base64 of the exact bytes, and a client that goes away stops the reading.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { READ_CHUNK_BYTES, writeStreamedRead } from '../src/http/resource-body.js';

let server: Server | undefined;
afterEach(() => server?.close());

/** Serves `value` once through writeStreamedRead; counts the ranges read. */
async function serve(value: Buffer, text: boolean, extra: Record<string, unknown> = {}) {
  const ranges: Array<[number, number]> = [];
  server = createServer((_req, res) => {
    void writeStreamedRead(
      res,
      7,
      {
        uri: 'taskrelay://tasks/t/blobs/b',
        meta: { mimeType: text ? 'text/plain' : 'application/octet-stream', text, size: value.length },
        readRange: (start, end) => {
          ranges.push([start, end]);
          return Promise.resolve(value.subarray(start, end));
        },
      },
      extra,
    );
  });
  await new Promise<void>((resolve) => server?.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server?.address() as AddressInfo).port}/`;
  return { url, ranges };
}

describe('the streamed resources/read answer', () => {
  it('is one JSON-RPC response with the exact text, multi-byte characters split across chunks included', async () => {
    // '€' is 3 bytes and '𝄞' 4: with a 1-byte lead the chunk boundaries fall inside them.
    const text = `x"\\\n${'€𝄞é'.repeat(Math.ceil((2 * READ_CHUNK_BYTES) / 9) + 5)}`;
    const { url, ranges } = await serve(Buffer.from(text), true, { resultType: 'complete' });
    const body = (await (await fetch(url)).json()) as Record<string, any>;
    expect(body).toEqual({
      jsonrpc: '2.0',
      id: 7,
      result: {
        resultType: 'complete',
        contents: [{ uri: 'taskrelay://tasks/t/blobs/b', mimeType: 'text/plain', text }],
      },
    });
    expect(ranges.length).toBeGreaterThan(2);
  });

  it('answers bytes as base64 of exactly those bytes', async () => {
    const bytes = Buffer.alloc(READ_CHUNK_BYTES * 2 + 5);
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7) % 256;
    const { url } = await serve(bytes, false);
    const body = (await (await fetch(url)).json()) as Record<string, any>;
    expect(Buffer.from(body['result']['contents'][0]['blob'] as string, 'base64').equals(bytes)).toBe(true);
  });

  it('answers an empty value', async () => {
    const { url } = await serve(Buffer.alloc(0), true);
    const body = (await (await fetch(url)).json()) as Record<string, any>;
    expect(body['result']['contents'][0]['text']).toBe('');
  });

  it('stops reading when the client goes away', async () => {
    const size = READ_CHUNK_BYTES * 200;
    const { url, ranges } = await serve(Buffer.alloc(size, 'a'), true);
    const controller = new AbortController();
    const res = await fetch(url, { signal: controller.signal });
    const reader = res.body?.getReader();
    await reader?.read();
    controller.abort();
    await new Promise((resolve) => setTimeout(resolve, 300));
    const after = ranges.length;
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(ranges.length).toBe(after);
    expect(after).toBeLessThan(200);
  });
});

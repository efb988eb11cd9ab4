/**
 * The answer to a `resources/read` of a stored value, written as it is read (PROTOCOL.md §34.3): the JSON-RPC
 * envelope, then the value in chunks read from Redis by range (base64 for bytes; JSON-escaped text after a UTF-8
 * decoder that keeps a split character for the next chunk), each written once the response has drained. One read holds
 * about one chunk, whatever the value's size.
 */
import { StringDecoder } from 'node:string_decoder';
import type { ServerResponse } from 'node:http';

/** Bytes read per range: a multiple of 3, so each chunk's base64 stands alone. */
export const READ_CHUNK_BYTES = 3 * 64 * 1024;

export interface StreamedValue {
  uri: string;
  meta: { mimeType: string; text: boolean; size: number };
  readRange: (start: number, end: number) => Promise<Buffer>;
}

/**
 * Writes `{"jsonrpc":"2.0","id":…,"result":{"contents":[{uri, mimeType, text|blob}], …extra}}` to `res`. Resolves
 * when the response ended, or when the client went away (nothing more is read then). A read that fails midway
 * destroys the response: the client sees a broken body, never a wrong value.
 */
export async function writeStreamedRead(
  res: ServerResponse,
  id: string | number,
  value: StreamedValue,
  extra: Record<string, unknown> = {},
  headers: Record<string, string> = {},
): Promise<void> {
  const { meta } = value;
  const field = meta.text ? 'text' : 'blob';
  res.writeHead(200, { ...headers, 'Content-Type': 'application/json' });
  const head = JSON.stringify({
    jsonrpc: '2.0',
    id,
    result: { ...extra, contents: [{ uri: value.uri, mimeType: meta.mimeType }] },
  });
  // The envelope up to the contents item's last field, which the value then fills.
  const open = `${head.slice(0, head.length - 4)},"${field}":"`;
  const close = `"}]${head.slice(head.length - '}}'.length)}`;
  const decoder = meta.text ? new StringDecoder('utf8') : undefined;
  const gone = () => res.destroyed || res.writableEnded;
  try {
    if (!(await write(res, open))) return;
    for (let at = 0; at < meta.size; at += READ_CHUNK_BYTES) {
      if (gone()) return;
      const bytes = await value.readRange(at, Math.min(meta.size, at + READ_CHUNK_BYTES));
      const piece = decoder ? escapeJsonText(decoder.write(bytes)) : bytes.toString('base64');
      if (!(await write(res, piece))) return;
    }
    if (decoder) await write(res, escapeJsonText(decoder.end()));
    if (!gone()) res.end(close);
  } catch (error) {
    res.destroy(error instanceof Error ? error : new Error(String(error)));
  }
}

/** The text as it goes between the quotes of a JSON string. */
function escapeJsonText(text: string): string {
  return text === '' ? '' : JSON.stringify(text).slice(1, -1);
}

/** Writes and waits for 'drain' when the buffer is full; false when the response closed meanwhile. */
function write(res: ServerResponse, text: string): Promise<boolean> {
  if (res.destroyed || res.writableEnded) return Promise.resolve(false);
  if (res.write(text)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      res.off('drain', onDrain);
      res.off('close', onClose);
      resolve(ok);
    };
    const onDrain = () => done(true);
    const onClose = () => done(false);
    res.on('drain', onDrain);
    res.on('close', onClose);
  });
}

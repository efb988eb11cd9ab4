/**
 * `jsonBody` reads an uncompressed POST body itself instead of through body-parser (issue 46). It must answer every
 * body exactly as express.json did: the same status, the same error, the same parsed value. Two servers, one with
 * each, get the same bytes with the same headers, and their answers are compared whole.
 */
import { request, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import express, { type RequestHandler } from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JsonTooDeepError, httpErrorHandler, jsonBody, jsonDepthExceeds } from '../src/http/http-guards.js';

const LIMIT = 1000;
const DEPTH = 8;

/** An app that parses with `parser` and answers what it parsed; the gateway's error handler answers the rest. */
async function serve(parser: RequestHandler): Promise<{ port: number; close: () => void }> {
  const app = express();
  app.post('/', parser, (req, res) => {
    res.json({ parsed: req.body as unknown, typeof: typeof req.body });
  });
  app.use(httpErrorHandler(() => undefined, { maxBodyBytes: LIMIT }));
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  return { port: (server.address() as AddressInfo).port, close: () => server.close() };
}

interface Answer {
  status: number | undefined;
  body: string;
}

/** POSTs `parts` (one write each: several without a Content-Length are sent chunked). */
function post(port: number, parts: Buffer[], headers: IncomingHttpHeaders): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method: 'POST', path: '/', headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    for (const part of parts) req.write(part);
    req.end();
  });
}

const text = (s: string) => Buffer.from(s, 'utf8');
const json = { 'content-type': 'application/json' };
const sized = (body: Buffer, headers: IncomingHttpHeaders = json) => ({
  parts: [body],
  headers: { ...headers, 'content-length': String(body.length) },
});
const chunked = (parts: Buffer[], headers: IncomingHttpHeaders = json) => ({
  parts,
  headers: { ...headers, 'transfer-encoding': 'chunked' },
});

const CASES: Record<string, { parts: Buffer[]; headers: IncomingHttpHeaders }> = {
  'an object': sized(text('{"jsonrpc":"2.0","id":1,"method":"ping"}')),
  'an array (a batch)': sized(text('[{"a":1},{"b":[1,2]}]')),
  'an empty body': sized(Buffer.alloc(0)),
  'only whitespace': sized(text(' \r\n\t ')),
  'whitespace, then an object': sized(text('\n\t {"a":1}')),
  'a string at the top': sized(text('"str"')),
  'a number at the top': sized(text('1')),
  'null at the top': sized(text('null')),
  'whitespace, then a bare word': sized(text('  nope')),
  'truncated JSON': sized(text('{"a":')),
  'trailing garbage': sized(text('{"a":1}x')),
  'a UTF-8 byte order mark': sized(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), text('{"a":"b"}')])),
  'two byte order marks': sized(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf, 0xef, 0xbb, 0xbf]), text('{}')])),
  'invalid UTF-8 inside a string': sized(Buffer.concat([text('{"a":"'), Buffer.from([0xff, 0xc3]), text('"}')])),
  'non-ASCII text': sized(text('{"名前":"Grüße ∀ 🚀"}')),
  'nested one level too deep': sized(text(`${'['.repeat(DEPTH + 1)}${']'.repeat(DEPTH + 1)}`)),
  'nested to the limit': sized(text(`${'['.repeat(DEPTH)}${']'.repeat(DEPTH)}`)),
  'deep nesting inside a string': sized(text(`{"a":"${'['.repeat(50)}"}`)),
  'deep and invalid': sized(text(`${'{'.repeat(DEPTH + 5)}`)),
  'exactly the limit': sized(text(`{"a":"${'x'.repeat(LIMIT - 8)}"}`)),
  'one byte over the limit': sized(text(`{"a":"${'x'.repeat(LIMIT - 7)}"}`)),
  'far over the limit': sized(text(`{"a":"${'x'.repeat(LIMIT * 50)}"}`)),
  'chunked, small': chunked([text('{"a":'), text('[1,'), text('2]}')]),
  'chunked, over the limit': chunked([text('{"a":"'), text('x'.repeat(LIMIT)), text('"}')]),
  'chunked, invalid': chunked([text('{"a"'), text(':}')]),
  'identity encoding, said': sized(text('{"a":1}'), { ...json, 'content-encoding': 'IDENTITY' }),
  'gzip encoded': sized(gzipSync(text('{"z":true}')), { ...json, 'content-encoding': 'gzip' }),
  'gzip encoded, over the limit inflated': sized(gzipSync(text(`{"a":"${'x'.repeat(LIMIT * 2)}"}`)), {
    ...json,
    'content-encoding': 'gzip',
  }),
  'an unknown encoding': sized(text('{"a":1}'), { ...json, 'content-encoding': 'zip' }),
  'charset utf-8 declared': sized(text('{"a":1}'), { 'content-type': 'application/json; charset=utf-8' }),
};

describe('jsonBody against express.json (issue 46)', () => {
  let ours: Awaited<ReturnType<typeof serve>>;
  let theirs: Awaited<ReturnType<typeof serve>>;

  beforeAll(async () => {
    ours = await serve(jsonBody({ maxBodyBytes: LIMIT, maxJsonDepth: DEPTH }));
    // What jsonBody was before: body-parser with the same limit and the depth check as its verify step.
    theirs = await serve(
      express.json({
        limit: LIMIT,
        type: 'application/json',
        verify: (_req, _res, buf) => {
          if (jsonDepthExceeds(buf, DEPTH)) throw new JsonTooDeepError(DEPTH);
        },
      }),
    );
  });
  afterAll(() => {
    ours.close();
    theirs.close();
  });

  for (const [name, { parts, headers }] of Object.entries(CASES)) {
    it(`answers ${name} as body-parser does`, async () => {
      const expected = await post(theirs.port, parts, headers);
      const actual = await post(ours.port, parts, headers);
      expect(actual).toEqual(expected);
    });
  }

  it('covers both outcomes: bodies parsed, and each error body-parser answers', async () => {
    const statuses = new Set<number | undefined>();
    for (const { parts, headers } of Object.values(CASES)) statuses.add((await post(ours.port, parts, headers)).status);
    expect([...statuses].sort()).toEqual([200, 400, 413, 415]);
  });
});

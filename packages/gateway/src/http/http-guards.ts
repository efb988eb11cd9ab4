/**
 * HTTP guards in front of /mcp, each answering with a JSON-RPC error body and the status the transport spec asks
 * for: `Host` (403, DNS rebinding), `Origin` (403), `Content-Type` (415), the body's size (413, chunked bodies too)
 * and nesting depth (400, checked on the raw bytes before they become objects). Probes (/healthz, /readyz) sit
 * outside them.
 */
import { MIMEType } from 'node:util';
import { JSON_RPC, TaskrelayError } from '@taskrelay/shared';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';

const LOOPBACK_ORIGIN = /^http:\/\/(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$/;
const LOOPBACK_HOSTNAMES = ['localhost', '127.0.0.1', '[::1]'];

/**
 * Verdicts on a header's value, kept: a client sends the same `Host` and `Content-Type` on every request, and parsing
 * them each time (a WHATWG URL, a MIME type, type-is) was about 3% of the gateway's busy time in an SDK task cycle
 * (issue 46). Bounded: a client that varies the header only fills the map, and a full map starts over. A `Map` and a
 * size check, not an LRU library: what is evicted does not matter here, only that the memory stays bounded.
 */
export class HeaderVerdicts<V> {
  private readonly verdicts = new Map<string, V>();

  constructor(private readonly max = 256) {}

  /** The verdict on `value`: `judge`'s, the first time. */
  of(value: string, judge: (value: string) => V): V {
    if (this.verdicts.has(value)) return this.verdicts.get(value) as V;
    const verdict = judge(value);
    if (this.verdicts.size >= this.max) this.verdicts.clear();
    this.verdicts.set(value, verdict);
    return verdict;
  }

  get size(): number {
    return this.verdicts.size;
  }
}

export function jsonRpcError(
  res: Response,
  httpStatus: number,
  code: number,
  message: string,
  id: string | number | null = null,
): void {
  res.status(httpStatus).json({ jsonrpc: '2.0', error: { code, message }, id });
}

/**
 * Several middlewares run as one express layer, in order (each may answer, call `next`, or pass an error on). The
 * `/mcp` guards run on every request: as one layer, express matches one path instead of one per guard.
 */
export function chain(handlers: RequestHandler[]): RequestHandler {
  return (req, res, next) => {
    let i = 0;
    const step = (error?: unknown): void => {
      // An error (or express's 'route') goes to express itself, as from any middleware.
      if (error !== undefined && error !== null) return next(error);
      const handler = handlers[i++];
      if (!handler) return next();
      try {
        const returned: unknown = handler(req, res, step);
        if (returned instanceof Promise) returned.catch(next);
      } catch (thrown) {
        next(thrown);
      }
    };
    step();
  };
}

export function originGuard(allowed: string[] | undefined) {
  const set = allowed ? new Set(allowed) : undefined;
  return (req: Request, res: Response, next: NextFunction): void => {
    const origin = req.header('origin');
    if (origin === undefined) return next();
    const ok = set ? set.has(origin) : LOOPBACK_ORIGIN.test(origin);
    if (ok) return next();
    jsonRpcError(res, 403, JSON_RPC.SERVER_ERROR, `Forbidden: origin ${origin} is not allowed`);
  };
}

/**
 * DNS-rebinding protection: the `Host` header must name this gateway. An entry without a port accepts that host on
 * any port, an entry with one only that `host:port`. Default: the loopback names and the address it binds.
 *
 * The SDK's `hostHeaderValidation` compares hostnames only; docs/CONFIGURATION.md also accepts `host:port` entries, so this
 * follows the SDK's parsing (the WHATWG URL parser) and adds the port rule.
 */
export function hostGuard(allowed: string[] | undefined, bindHost: string): RequestHandler {
  const entries = allowed ?? [...LOOPBACK_HOSTNAMES, bindHost.includes(':') ? `[${bindHost}]` : bindHost];
  const anyPort = new Set<string>();
  const exact = new Set<string>();
  for (const entry of entries) {
    const parsed = parseHost(entry);
    if (!parsed) continue;
    if (parsed.port === '') anyPort.add(parsed.hostname);
    else exact.add(`${parsed.hostname}:${parsed.port}`);
  }
  const allows = (header: string) => {
    const parsed = parseHost(header);
    return (
      parsed !== undefined && (anyPort.has(parsed.hostname) || exact.has(`${parsed.hostname}:${parsed.port || '80'}`))
    );
  };
  const verdicts = new HeaderVerdicts<boolean>();
  return (req, res, next) => {
    const header = req.headers.host;
    if (header !== undefined && verdicts.of(header, allows)) return next();
    jsonRpcError(
      res,
      403,
      JSON_RPC.SERVER_ERROR,
      header === undefined ? 'Forbidden: Host header required' : 'Forbidden: unknown Host',
    );
  };
}

function parseHost(value: string): { hostname: string; port: string } | undefined {
  // Only host[:port]: anything with a path, credentials or spaces is not a Host header.
  if (!/^[A-Za-z0-9.\-[\]:_]+$/.test(value)) return undefined;
  try {
    const url = new URL(`http://${value}`);
    return { hostname: url.hostname.toLowerCase(), port: url.port };
  } catch {
    return undefined;
  }
}

/**
 * POST bodies must be JSON in UTF-8: anything else gets 415 before the body is read (never a handler seeing no body).
 * Only UTF-8: the depth check reads the raw bytes (`jsonDepthExceeds`), and in another charset a byte that looks
 * like a quote hides every bracket after it (a UTF-16 `∀` is `00 22`), so deep JSON would reach the parser after all.
 * JSON is UTF-8 on the wire anyway (RFC 8259 §8.1).
 */
export function requireJsonContent(req: Request, res: Response, next: NextFunction): void {
  if (req.method !== 'POST') return next();
  const contentType = req.headers['content-type'];
  // A request without a body has no content type (type-is's rule, which `req.is` applies first).
  const refused =
    contentType === undefined || !hasBody(req)
      ? NOT_JSON
      : contentTypeVerdicts.of(contentType, () => contentTypeRefusal(req, contentType));
  if (refused === undefined) return next();
  jsonRpcError(res, 415, JSON_RPC.SERVER_ERROR, refused);
}

const NOT_JSON = 'Unsupported Media Type: Content-Type must be application/json';
const contentTypeVerdicts = new HeaderVerdicts<string | undefined>();

/** What a POST with a body of this `Content-Type` is refused with, or undefined for UTF-8 JSON. */
function contentTypeRefusal(req: Request, contentType: string): string | undefined {
  // `req.is` reads this same header: the verdict depends on its value alone once the request has a body.
  if (!req.is('application/json')) return NOT_JSON;
  const charset = charsetOf(contentType);
  if (charset === undefined || charset === 'utf-8') return undefined;
  return `Unsupported Media Type: charset ${JSON.stringify(charset).slice(0, 60)} is not accepted; send JSON as UTF-8`;
}

/** type-is's `hasBody`, which `req.is` checks before the type: a `Transfer-Encoding`, or a numeric `Content-Length`. */
function hasBody(req: Request): boolean {
  return req.headers['transfer-encoding'] !== undefined || !Number.isNaN(Number(req.headers['content-length']));
}

/** The declared charset, lower-cased; undefined when none is declared. A type node cannot parse counts as unknown. */
function charsetOf(contentType: string): string | undefined {
  try {
    return new MIMEType(contentType).params.get('charset')?.toLowerCase() ?? undefined;
  } catch {
    return 'unparsable';
  }
}

/** A body nested deeper than the limit; `status` and `type` are what express's body parser reads from its errors. */
export class JsonTooDeepError extends TaskrelayError {
  readonly status = 400;
  readonly type = 'json.too.deep';
  constructor(readonly maxDepth: number) {
    super('JSON_TOO_DEEP', `JSON nesting deeper than ${maxDepth}`);
    this.name = 'JsonTooDeepError';
  }
}

const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * True when `bytes` (JSON text) nests objects/arrays deeper than `maxDepth`: one pass over the bytes, no allocation,
 * strings skipped. Run before `JSON.parse`, so a 4 MB `[[[[…` costs a scan instead of millions of arrays.
 */
export function jsonDepthExceeds(bytes: Uint8Array, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (inString) {
      if (b === BACKSLASH) i++;
      else if (b === QUOTE) inString = false;
    } else if (b === QUOTE) inString = true;
    else if (b === OPEN_BRACE || b === OPEN_BRACKET) {
      if (++depth > maxDepth) return true;
    } else if (b === CLOSE_BRACE || b === CLOSE_BRACKET) depth--;
  }
  return false;
}

/**
 * The JSON body of a request, with the size limit (413: counted as the bytes arrive, chunked and decompressed bodies
 * included) and the depth check on the raw bytes before they are parsed.
 *
 * A POST whose body is not compressed (every SDK client's) is read here; anything else by express.json (body-parser),
 * which inflates gzip, deflate and brotli bodies. Hand-written for that one case because body-parser and what it pulls
 * in (raw-body, iconv-lite, type-is, on-finished, debug) were about 5% of the gateway's busy time in an SDK task cycle
 * (issue 46, docs/PERFORMANCE.md), around a `JSON.parse` that costs the same either way; `requireJsonContent` has
 * already refused every other type and charset. It answers exactly as body-parser does (the same statuses and error
 * `type`s, `{}` for an empty body, only an object or array at the top, a UTF-8 byte order mark skipped, and the whole
 * body read off before an error is answered): `json-body.differential.test.ts` holds the two side by side.
 */
export function jsonBody(options: { maxBodyBytes: number; maxJsonDepth: number }): RequestHandler {
  const { maxBodyBytes, maxJsonDepth } = options;
  const bodyParser = express.json({
    limit: maxBodyBytes,
    // The SDK reads JSON-RPC from the parsed body; only application/json bodies get here (requireJsonContent).
    type: 'application/json',
    verify: (_req, _res, buf) => {
      if (jsonDepthExceeds(buf, maxJsonDepth)) throw new JsonTooDeepError(maxJsonDepth);
    },
  });
  return (req, res, next) => {
    const encoding = req.headers['content-encoding'];
    const plain = encoding === undefined || encoding.toLowerCase() === 'identity';
    if (req.method !== 'POST' || !plain || (req as { _body?: boolean })._body === true || !hasBody(req)) {
      bodyParser(req, res, next);
      return;
    }
    readJson(req, maxBodyBytes, maxJsonDepth).then((body) => {
      (req as { _body?: boolean })._body = true;
      req.body = body;
      next();
    }, next);
  };
}

/** An error as body-parser makes it: its `status` and `type` are what `httpErrorHandler` answers by. */
function bodyError(status: number, type: string, message: string): Error {
  return Object.assign(new Error(message), { status, statusCode: status, expose: true, type });
}

/** Reads and parses an uncompressed UTF-8 JSON body (see `jsonBody`). */
function readJson(req: Request, maxBytes: number, maxDepth: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const header = req.headers['content-length'];
    const declared = header === undefined ? undefined : Number(header);
    const chunks: Buffer[] = [];
    let received = 0;
    let failure: Error | undefined =
      declared !== undefined && declared > maxBytes
        ? bodyError(413, 'entity.too.large', 'request entity too large')
        : undefined;
    const done = (error: Error | undefined, body?: unknown) => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('aborted', onAborted);
      if (error) reject(error);
      else resolve(body);
    };
    const onData = (chunk: Buffer) => {
      if (failure) return; // read off and dropped: the answer waits for the whole body, as body-parser's does
      received += chunk.length;
      if (received > maxBytes) {
        failure = bodyError(413, 'entity.too.large', 'request entity too large');
        chunks.length = 0;
      } else chunks.push(chunk);
    };
    const onEnd = () => {
      if (failure) return done(failure);
      if (declared !== undefined && received !== declared) {
        return done(bodyError(400, 'request.size.invalid', 'request size did not match content length'));
      }
      const [only] = chunks;
      const bytes = chunks.length === 1 && only ? only : Buffer.concat(chunks, received);
      if (jsonDepthExceeds(bytes, maxDepth)) return done(new JsonTooDeepError(maxDepth));
      try {
        done(undefined, parseJson(bytes));
      } catch (error) {
        done(bodyError(400, 'entity.parse.failed', (error as Error).message));
      }
    };
    const onError = (error: Error) => done(bodyError(400, 'request.aborted', error.message));
    const onAborted = () => done(bodyError(400, 'request.aborted', 'request aborted'));
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('aborted', onAborted);
  });
}

const UTF8_BOM = [0xef, 0xbb, 0xbf];
/** JSON's whitespace (RFC 8259 §2), as body-parser skips it before the first character. */
const LEADING_SPACE = /^[ \t\n\r]*/;

/** body-parser's JSON parse: `{}` for no bytes, only an object or array at the top (strict), a byte order mark skipped. */
function parseJson(bytes: Buffer): unknown {
  const bom = bytes.length >= 3 && bytes[0] === UTF8_BOM[0] && bytes[1] === UTF8_BOM[1] && bytes[2] === UTF8_BOM[2];
  const text = bytes.toString('utf8', bom ? 3 : 0);
  if (text.length === 0) return {};
  const first = text[LEADING_SPACE.exec(text)?.[0].length ?? 0];
  if (first !== '{' && first !== '[') throw new SyntaxError(`Unexpected token ${first ?? 'end'} in JSON`);
  return JSON.parse(text) as unknown;
}

/**
 * The error handler at the end of the chain: malformed JSON, oversized or too-deep bodies get JSON-RPC errors with
 * stable messages (never body-parser's or a stack's text), anything else a bare 500 with the details in the log.
 */
export function httpErrorHandler(
  onUnexpected: (error: unknown) => void,
  limits: { maxBodyBytes: number },
): (error: unknown, req: Request, res: Response, next: NextFunction) => void {
  return (error, _req, res, next) => {
    if (res.headersSent) return next(error);
    const { status, type } = error as { status?: number; type?: string };
    if (type === 'entity.parse.failed') {
      return jsonRpcError(res, 400, JSON_RPC.PARSE_ERROR, 'Parse error: request body is not valid JSON');
    }
    if (type === 'entity.too.large') {
      return jsonRpcError(res, 413, JSON_RPC.INVALID_REQUEST, `Request body larger than ${limits.maxBodyBytes} bytes`);
    }
    if (error instanceof JsonTooDeepError) {
      return jsonRpcError(
        res,
        400,
        JSON_RPC.INVALID_REQUEST,
        `Invalid Request: JSON nested deeper than ${error.maxDepth} levels`,
      );
    }
    if (type === 'encoding.unsupported' || type === 'charset.unsupported') {
      return jsonRpcError(
        res,
        415,
        JSON_RPC.SERVER_ERROR,
        'Unsupported Media Type: body encoding or charset not supported',
      );
    }
    if (status !== undefined && status >= 400 && status < 500) {
      return jsonRpcError(res, status, JSON_RPC.INVALID_REQUEST, 'Invalid Request: the request body could not be read');
    }
    onUnexpected(error);
    jsonRpcError(res, 500, JSON_RPC.INTERNAL_ERROR, 'Internal error');
  };
}

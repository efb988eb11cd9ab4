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
 * express.json with the size limit (body-parser counts bytes as they arrive, chunked and decompressed bodies
 * included, and stops reading at the limit: 413) and the depth check on the raw buffer before it is parsed.
 */
export function jsonBody(options: { maxBodyBytes: number; maxJsonDepth: number }): RequestHandler {
  return express.json({
    limit: options.maxBodyBytes,
    // The SDK reads JSON-RPC from the parsed body; only application/json bodies get here (requireJsonContent).
    type: 'application/json',
    verify: (_req, _res, buf) => {
      if (jsonDepthExceeds(buf, options.maxJsonDepth)) throw new JsonTooDeepError(options.maxJsonDepth);
    },
  });
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

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
  return (req, res, next) => {
    const header = req.headers.host;
    const parsed = header === undefined ? undefined : parseHost(header);
    if (parsed && (anyPort.has(parsed.hostname) || exact.has(`${parsed.hostname}:${parsed.port || '80'}`))) {
      return next();
    }
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
  if (!req.is('application/json')) {
    return jsonRpcError(
      res,
      415,
      JSON_RPC.SERVER_ERROR,
      'Unsupported Media Type: Content-Type must be application/json',
    );
  }
  const charset = charsetOf(req.headers['content-type'] ?? '');
  if (charset === undefined || charset === 'utf-8') return next();
  jsonRpcError(
    res,
    415,
    JSON_RPC.SERVER_ERROR,
    `Unsupported Media Type: charset ${JSON.stringify(charset).slice(0, 60)} is not accepted; send JSON as UTF-8`,
  );
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

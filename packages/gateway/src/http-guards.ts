/**
 * HTTP guards in front of /mcp: Origin validation (403, as the transport spec requires) and bearer-token
 * authentication (401). Probes (/healthz, /readyz) and /metrics sit outside them.
 */
import type { NextFunction, Request, Response } from 'express';

const LOOPBACK_ORIGIN = /^http:\/\/(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$/;

export function jsonRpcError(res: Response, httpStatus: number, code: number, message: string): void {
  res.status(httpStatus).json({ jsonrpc: '2.0', error: { code, message }, id: null });
}

export function originGuard(allowed: string[] | undefined) {
  const set = allowed ? new Set(allowed) : undefined;
  return (req: Request, res: Response, next: NextFunction): void => {
    const origin = req.header('origin');
    if (origin === undefined) return next();
    const ok = set ? set.has(origin) : LOOPBACK_ORIGIN.test(origin);
    if (ok) return next();
    jsonRpcError(res, 403, -32000, `Forbidden: origin ${origin} is not allowed`);
  };
}

export interface AuthInfoLike {
  token: string;
  clientId: string;
  scopes: string[];
}

/** Sets `req.auth`, which the SDK transport hands to handlers as `extra.authInfo`. */
export function bearerAuth(tokens: Map<string, string> | undefined) {
  return (req: Request & { auth?: AuthInfoLike }, res: Response, next: NextFunction): void => {
    if (!tokens) return next();
    const header = req.header('authorization') ?? '';
    const match = /^Bearer\s+(\S+)$/i.exec(header);
    const principal = match?.[1] ? tokens.get(match[1]) : undefined;
    if (!match?.[1] || principal === undefined) {
      res.setHeader('WWW-Authenticate', 'Bearer realm="taskrelay"');
      jsonRpcError(
        res,
        401,
        -32001,
        match ? 'Unauthorized: invalid bearer token' : 'Unauthorized: bearer token required',
      );
      return;
    }
    req.auth = { token: match[1], clientId: principal, scopes: [] };
    next();
  };
}

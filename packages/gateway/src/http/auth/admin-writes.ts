/**
 * What a state-changing request to the operator API (`/admin/...`, `/api/schedules`) must show, so that no page of
 * another site can make an operator's browser act (docs/HTTP.md, docs/OPERATIONS.md):
 *
 * - an `Origin`, when sent, of this gateway (a browser names the page a request comes from);
 * - made with the dashboard's session cookie: the session's CSRF token in `X-CSRF-Token`;
 * - otherwise (a bearer header, or authentication off on loopback): a POST has `Content-Type: application/json`,
 *   which a page of another site can only send after a CORS preflight the gateway never grants. A form's
 *   `text/plain` or `x-www-form-urlencoded` POST, with or without an `Origin`, is refused before any handler runs.
 *
 * GET and HEAD change nothing and pass. DELETE and PUT cannot come from a form, and a cross-site script needs the
 * same preflight for them.
 */
import { MIMEType } from 'node:util';
import type { Request, RequestHandler, Response } from 'express';
import { CSRF_HEADER, csrfMatches, type SessionRequest } from './admin-sessions.js';

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/** True (and answered 403) when a browser sends this request from another origin. */
export function crossOriginRefused(req: Request, res: Response, action: string): boolean {
  const origin = req.get('origin');
  if (origin === undefined) return false;
  let host: string | undefined;
  try {
    host = new URL(origin).host;
  } catch {
    host = undefined;
  }
  if (host === req.get('host')) return false;
  res.status(403).json({ error: `cross-origin ${action} refused (Origin ${origin})` });
  return true;
}

/** The guard in front of every operator route; after authentication (which tells a session from a bearer). */
export const adminWriteGuard: RequestHandler = (req: SessionRequest, res, next) => {
  if (SAFE_METHODS.has(req.method)) return next();
  if (crossOriginRefused(req, res, req.method)) return;
  if (req.adminSession) {
    if (csrfMatches(req.adminSession, req.get(CSRF_HEADER))) return next();
    res.status(403).json({
      error: `this action needs the dashboard's CSRF token in ${CSRF_HEADER} (reload the page if it has been open since before a new login)`,
    });
    return;
  }
  if (req.method === 'POST' && !isJson(req.get('content-type'))) {
    res.status(415).json({
      error:
        'operator POSTs need Content-Type: application/json (send {} when there is nothing to say); the dashboard sends its CSRF token instead',
    });
    return;
  }
  next();
};

function isJson(contentType: string | undefined): boolean {
  if (contentType === undefined) return false;
  try {
    return new MIMEType(contentType).essence === 'application/json';
  } catch {
    return false;
  }
}

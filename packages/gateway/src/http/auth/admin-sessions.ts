/**
 * Dashboard logins (docs/OPERATIONS.md, "The dashboard in a browser"): an operator who signed in at `/admin/login`
 * holds a cookie that names a session kept in Redis, so every gateway of the fleet knows it, a logout ends it on all of
 * them at once, and it expires on the server whatever the browser keeps. Server-side rather than a signed token: a
 * signed cookie outlives its logout unless every gateway shares a denylist, which is a session store anyway.
 *
 * Redis holds the SHA-256 of the cookie, never the cookie: a read of Redis does not open the dashboard. Each session
 * carries its own CSRF token, which the pages send back with every state-changing request.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Request, RequestHandler, Response } from 'express';
import { z } from 'zod';
import type { Keys, Logger, RedisClient } from '@taskrelay/shared';

/** The cookie's name. Not `__Host-`: that prefix needs `Secure`, and the dashboard is also opened over plain HTTP on loopback. */
export const ADMIN_SESSION_COOKIE = 'taskrelay_admin';
/** The header that carries a session's CSRF token on a state-changing request. */
export const CSRF_HEADER = 'x-csrf-token';

/** One login, as stored (JSON, with the key's own expiry). */
const storedSession = z.object({
  principal: z.string().min(1),
  csrf: z.string().min(16),
  createdAt: z.number().int(),
  expiresAt: z.number().int(),
  via: z.enum(['token', 'oauth']),
});
export type AdminSession = z.infer<typeof storedSession>;

/** A cookie value we issued: 32 random bytes, base64url. Anything else is not looked up. */
const COOKIE_VALUE = /^[A-Za-z0-9_-]{43}$/;

/** A session an operator's request came with, on the request (set by `sessionOrBearer`). */
export interface SessionRequest extends Request {
  adminSession?: AdminSession;
  auth?: { token: string; clientId: string; scopes: string[]; expiresAt?: number };
}

export class AdminSessions {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
    private readonly ttlMs: number,
  ) {}

  /** Starts a session of `principal`; it ends at `notAfter` (ms) if that comes before the configured lifetime. */
  async create(
    principal: string,
    via: AdminSession['via'],
    notAfter?: number,
  ): Promise<{ cookie: string; session: AdminSession }> {
    const now = Date.now();
    const expiresAt = Math.min(now + this.ttlMs, notAfter ?? Number.POSITIVE_INFINITY);
    const cookie = randomBytes(32).toString('base64url');
    const session: AdminSession = {
      principal,
      csrf: randomBytes(24).toString('base64url'),
      createdAt: now,
      expiresAt,
      via,
    };
    await this.redis.set(
      this.keys.adminSession(digest(cookie).toString('hex')),
      JSON.stringify(session),
      'PX',
      expiresAt - now,
    );
    return { cookie, session };
  }

  /** The live session a cookie names; undefined when unknown, ended or expired. */
  async read(cookie: string): Promise<AdminSession | undefined> {
    if (!COOKIE_VALUE.test(cookie)) return undefined;
    const raw = await this.redis.get(this.keys.adminSession(digest(cookie).toString('hex')));
    if (raw === null) return undefined;
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch {
      return undefined;
    }
    const session = storedSession.safeParse(parsed);
    // Redis expires the key too; the stored end is checked as well, so a clock between the two never extends it.
    if (!session.success || session.data.expiresAt <= Date.now()) return undefined;
    return session.data;
  }

  /** Ends the session a cookie names, on every gateway. */
  async end(cookie: string): Promise<void> {
    if (!COOKIE_VALUE.test(cookie)) return;
    await this.redis.del(this.keys.adminSession(digest(cookie).toString('hex')));
  }

  /** Sets the cookie of a new session: `HttpOnly`, `SameSite=Strict`, `Secure` when the login came over HTTPS. */
  setCookie(req: Request, res: Response, cookie: string, session: AdminSession): void {
    res.cookie(ADMIN_SESSION_COOKIE, cookie, {
      httpOnly: true,
      sameSite: 'strict',
      secure: cameOverHttps(req),
      // `/`, not `/admin`: the dashboard links to `/metrics`, which takes the session too.
      path: '/',
      maxAge: session.expiresAt - Date.now(),
    });
  }

  clearCookie(req: Request, res: Response): void {
    res.clearCookie(ADMIN_SESSION_COOKIE, {
      httpOnly: true,
      sameSite: 'strict',
      secure: cameOverHttps(req),
      path: '/',
    });
  }
}

/**
 * The session cookie's value, if the request carries one. Read by hand: express sets cookies (`res.cookie`) but parses
 * none, and one cookie whose value is base64url needs no decoding (a cookie library would be a dependency for a split).
 */
export function sessionCookieOf(req: Request): string | undefined {
  const header = req.headers.cookie;
  if (header === undefined) return undefined;
  for (const part of header.split(';')) {
    const at = part.indexOf('=');
    if (at > 0 && part.slice(0, at).trim() === ADMIN_SESSION_COOKIE) return part.slice(at + 1).trim();
  }
  return undefined;
}

/** True when `given` is the session's CSRF token (compared in constant time). */
export function csrfMatches(session: AdminSession, given: unknown): boolean {
  if (typeof given !== 'string' || given.length === 0) return false;
  const a = digest(given);
  const b = digest(session.csrf);
  return timingSafeEqual(a, b);
}

/**
 * Authentication for the operator routes: a bearer header as on `/mcp` (scripts), else the dashboard's session
 * cookie. A browser opening a page with neither is sent to the login form; an API call gets the bearer 401.
 */
export function sessionOrBearer(o: {
  sessions: AdminSessions;
  requireAuth: RequestHandler;
  loginPath: string;
  log: Logger;
}): RequestHandler {
  return (req: SessionRequest, res, next): void => {
    if (req.headers.authorization !== undefined) {
      void o.requireAuth(req, res, next);
      return;
    }
    const cookie = sessionCookieOf(req);
    const toLogin = req.method === 'GET' && req.accepts(['json', 'html']) === 'html';
    if (cookie === undefined) {
      if (toLogin) res.redirect(303, o.loginPath);
      else void o.requireAuth(req, res, next);
      return;
    }
    o.sessions.read(cookie).then(
      (session) => {
        if (!session) {
          o.sessions.clearCookie(req, res);
          if (toLogin) res.redirect(303, o.loginPath);
          else {
            res
              .status(401)
              .json({ error: 'your dashboard login ended (logged out or expired): sign in again at /admin/login' });
          }
          return;
        }
        req.adminSession = session;
        req.auth = {
          token: '',
          clientId: session.principal,
          scopes: [],
          expiresAt: Math.floor(session.expiresAt / 1000),
        };
        next();
      },
      (error: unknown) => {
        o.log.warn({ err: error }, 'dashboard session store unavailable');
        res.status(503).json({ error: 'the session store (Redis) is unavailable; try again' });
      },
    );
  };
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}

/**
 * Over TLS here, or the browser said its page was `https://` (the login form's `Origin`, when a TLS proxy in front
 * speaks plain HTTP to the gateway).
 */
function cameOverHttps(req: Request): boolean {
  return req.secure || (req.get('origin') ?? '').startsWith('https://');
}

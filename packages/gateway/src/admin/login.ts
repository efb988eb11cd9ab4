/**
 * The dashboard's login (docs/OPERATIONS.md, "The dashboard in a browser"; docs/HTTP.md):
 *
 *   GET  /admin/login    the form: one field, `token`
 *   POST /admin/login    `token` = an operator's static token, or an access token of the OAuth issuer the gateway
 *                        trusts (pasted: the gateway is a resource server, not an OAuth client, so it runs no redirect
 *                        flow) → a session cookie (`HttpOnly`, `SameSite=Strict`) and 303 to `/admin`
 *   POST /admin/logout   ends the session on every gateway (the form sends its CSRF token) → 303 to the form
 *
 * Mounted ahead of the operators-only routes: the form is what an operator without a session is sent to.
 */
import express, { type Request, type Response, type Router } from 'express';
import { z } from 'zod';
import { InsufficientScopeError, InvalidTokenError } from '@modelcontextprotocol/sdk/server/auth/errors.js';
import type { AuditLog, Logger } from '@taskrelay/shared';
import type { Authenticator } from '../http/auth/authenticate.js';
import {
  type AdminSessions,
  CSRF_HEADER,
  csrfMatches,
  sessionCookieOf,
  type AdminSession,
} from '../http/auth/admin-sessions.js';
import { crossOriginRefused } from '../http/auth/admin-writes.js';

/** A static token or a JWT; anything longer is not a token this gateway issued or trusts. */
const loginForm = z.object({ token: z.string().trim().min(1, 'paste a token').max(16_384, 'too long for a token') });
const logoutForm = z.object({ csrf: z.string().max(200).optional() });

const LOGIN_CSP =
  "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

export interface LoginRouterOptions {
  auth: Pick<Authenticator, 'enabled' | 'verify'>;
  sessions: AdminSessions;
  operators: ReadonlySet<string>;
  audit?: AuditLog;
  log: Logger;
}

export function createLoginRouter(o: LoginRouterOptions): Router {
  const router = express.Router();
  const form = express.urlencoded({ extended: false, limit: '32kb', parameterLimit: 10 });

  router.get('/login', (req, res) => {
    if (!o.auth.enabled) return res.redirect(303, '/admin');
    sendForm(res, 200);
  });

  router.post('/login', form, (req: Request, res: Response, next) => {
    if (!o.auth.enabled || o.auth.verify === undefined) return res.redirect(303, '/admin');
    if (crossOriginRefused(req, res, 'login')) return;
    const parsed = loginForm.safeParse(req.body ?? {});
    if (!parsed.success) return sendForm(res, 400, `Not signed in: ${parsed.error.issues[0]?.message ?? 'no token'}.`);
    const verify = o.auth.verify;
    const signIn = async () => {
      let principal: string;
      let via: AdminSession['via'];
      let notAfter: number | undefined;
      try {
        const info = await verify(parsed.data.token);
        principal = info.clientId;
        via = info.extra?.['via'] === 'oauth' ? 'oauth' : 'token';
        // An OAuth login ends with its access token; a static token has no end of its own.
        notAfter = via === 'oauth' && info.expiresAt !== undefined ? info.expiresAt * 1000 : undefined;
      } catch (error) {
        if (error instanceof InsufficientScopeError) {
          return sendForm(res, 403, `Not signed in: ${error.message}.`);
        }
        if (error instanceof InvalidTokenError) {
          return sendForm(res, 401, `Not signed in: the gateway does not accept that token (${error.message}).`);
        }
        o.log.warn({ err: error }, 'dashboard login: the token could not be checked');
        return sendForm(
          res,
          503,
          'Not signed in: the token could not be checked now (the issuer’s keys are unavailable); try again.',
        );
      }
      if (!o.operators.has(principal)) {
        o.log.info({ principal }, 'dashboard login refused: not an operator');
        return sendForm(res, 403, `Not signed in: ${principal} is not an operator (TASKRELAY_OPERATORS).`);
      }
      const { cookie, session } = await o.sessions.create(principal, via, notAfter);
      o.sessions.setCookie(req, res, cookie, session);
      o.log.info({ by: principal, via, expiresAt: new Date(session.expiresAt).toISOString() }, 'dashboard login');
      await o.audit?.record({
        by: principal,
        action: 'login',
        target: 'dashboard',
        outcome: `until ${new Date(session.expiresAt).toISOString()}`,
      });
      res.redirect(303, '/admin');
    };
    signIn().catch(next);
  });

  router.post('/logout', form, (req: Request, res: Response, next) => {
    if (crossOriginRefused(req, res, 'logout')) return;
    const cookie = sessionCookieOf(req);
    const parsed = logoutForm.safeParse(req.body ?? {});
    const given = (parsed.success ? parsed.data.csrf : undefined) ?? req.get(CSRF_HEADER);
    const logout = async () => {
      const session = cookie === undefined ? undefined : await o.sessions.read(cookie);
      if (session && cookie !== undefined) {
        // Another site cannot end an operator's session either.
        if (!csrfMatches(session, given)) {
          res.status(403).json({ error: 'logout needs the dashboard’s CSRF token (use its Log out button)' });
          return;
        }
        await o.sessions.end(cookie);
        o.log.info({ by: session.principal }, 'dashboard logout');
        await o.audit?.record({
          by: session.principal,
          action: 'logout',
          target: 'dashboard',
          outcome: 'session ended',
        });
      }
      o.sessions.clearCookie(req, res);
      res.redirect(303, '/admin/login');
    };
    logout().catch(next);
  });

  return router;
}

/** The form, with what went wrong above it. Text only (no markup from the request reaches the page). */
function sendForm(res: Response, status: number, problem?: string): void {
  res.setHeader('Content-Security-Policy', LOGIN_CSP);
  res.setHeader('Cache-Control', 'no-store');
  res.status(status).type('html').send(loginPage(problem));
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginPage(problem: string | undefined): string {
  const error = problem === undefined ? '' : `<p id="login-error" role="alert">${escapeHtml(problem)}</p>`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>taskrelay · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background:#0f1419; color:#d8dee6; }
  main { max-width:420px; margin:12vh auto; background:#182028; border:1px solid #263240; border-radius:6px; padding:20px 24px; }
  h1 { font-size:18px; margin:0 0 12px; }
  label { display:block; color:#8a97a6; margin-bottom:4px; }
  input { width:100%; box-sizing:border-box; background:#0f1419; color:#d8dee6; border:1px solid #263240; border-radius:4px; padding:6px 8px; font:inherit; }
  button { margin-top:12px; background:#263240; color:#d8dee6; border:1px solid #8a97a6; border-radius:4px; padding:4px 14px; font:inherit; cursor:pointer; }
  p { color:#8a97a6; font-size:12px; }
  #login-error { color:#f85149; font-size:14px; }
</style>
</head>
<body>
<main>
<h1>taskrelay dashboard</h1>
${error}
<form method="post" action="/admin/login">
  <label for="token">Operator token, or an access token from the gateway's OAuth issuer</label>
  <input id="token" name="token" type="password" autocomplete="off" required autofocus>
  <button type="submit" id="sign-in">Sign in</button>
</form>
<p>The token is checked once and not kept: the browser gets a session cookie instead. Scripts keep sending
<code>Authorization: Bearer …</code>.</p>
</main>
</body>
</html>
`;
}

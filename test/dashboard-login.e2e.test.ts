/**
 * Issue 49 item 3 and issue 48 F7 (docs/OPERATIONS.md, "The dashboard in a browser"; docs/HTTP.md): an operator
 * signs in to the dashboard with a token (a static one, or an access token of the OAuth issuer the gateway trusts),
 * gets a session cookie (`HttpOnly`, `SameSite=Strict`) kept in Redis (every gateway knows it; a logout or its expiry
 * ends it on all of them), acts with the page's CSRF token, and logs out. Scripts keep their bearer header; a write
 * without a session needs a JSON content type, so no form of another site can act, with or without an `Origin`.
 * In headless Chromium: log in, replay a task, a log line's fields, log out, and a cross-site POST refused.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import getPort from 'get-port';
import type { Redis } from 'ioredis';
import { SignJWT, exportJWK, generateKeyPair, type CryptoKey } from 'jose';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';

const CHROMIUM = process.env['CHROMIUM_PATH'] ?? '/usr/bin/chromium';
const SCOPE = 'taskrelay:tools';

let stack: TestStack;
let r: Redis;
let prefix: string;
/** Auth on: static tokens and OAuth; `ops` and the issuer's `operator-1` are operators. */
let gateway: GatewayProcess;
/** The same deployment, its logins lasting 3 s. */
let shortLived: GatewayProcess;
/** Auth off, on loopback. */
let open: GatewayProcess;
let alice: Client;
let browser: Browser;
let jwksServer: Server;
let issuer: string;
let signingKey: { privateKey: CryptoKey; kid: string };
/** What every authenticated gateway of the deployment gets, besides the stack's Redis and prefix. */
let authEnv: Record<string, string>;

const admin = (g: GatewayProcess) => g.url.replace(/\/mcp$/, '/admin');

/** An access token of the test issuer. */
async function accessToken(sub: string, o: { exp?: number; scope?: string } = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ scope: o.scope ?? SCOPE })
    .setProtectedHeader({ alg: 'RS256', kid: signingKey.kid })
    .setIssuer(issuer)
    .setAudience(gateway.url)
    .setSubject(sub)
    .setIssuedAt(now)
    .setExpirationTime(o.exp ?? now + 300)
    .sign(signingKey.privateKey);
}

/** `POST /admin/login` as the form sends it; the answer and the session cookie it set, if any. */
async function login(g: GatewayProcess, token: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${admin(g)}/login`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams({ token }).toString(),
  });
  const setCookie = res.headers.getSetCookie().find((c) => c.startsWith('taskrelay_admin='));
  const cookie = setCookie?.split(';')[0];
  return { res, setCookie, cookie, text: await res.text() };
}

/** The CSRF token of the page a session is served. */
async function csrfOf(g: GatewayProcess, cookie: string): Promise<string> {
  const page = await (await fetch(`${admin(g)}/tasks`, { headers: { cookie } })).text();
  return /<meta name="taskrelay-csrf" content="([^"]+)">/.exec(page)![1]!;
}

/** A task of alice's that completed, to replay. */
async function endedTask(report = 'q4'): Promise<string> {
  const taskId = await startTask(alice, 'nightly_report', { report });
  await taskResult(alice, taskId);
  return taskId;
}

beforeAll(async () => {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_PATH)`);
  const { privateKey, publicKey } = await generateKeyPair('RS256');
  signingKey = { privateKey, kid: 'login-key' };
  const jwk = { ...(await exportJWK(publicKey)), kid: 'login-key', alg: 'RS256', use: 'sig' };
  jwksServer = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((done) => jwksServer.listen(0, '127.0.0.1', done));
  issuer = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/`;

  const port = await getPort({ host: '127.0.0.1' });
  const url = `http://127.0.0.1:${port}/mcp`;
  authEnv = {
    TASKRELAY_AUTH_TOKENS: 'ops:0pstoken,alice:alicetoken',
    TASKRELAY_OAUTH_ISSUER: issuer,
    TASKRELAY_OAUTH_JWKS_URL: `${issuer}jwks`,
    TASKRELAY_OAUTH_SCOPES: SCOPE,
    // A login ends with its access token exactly: no grace for clock skew here.
    TASKRELAY_OAUTH_CLOCK_SKEW_MS: '0',
    TASKRELAY_OPERATORS: `ops,${issuer}#operator-1`,
    TASKRELAY_OAUTH_AUDIENCE: url,
  };
  // Started once the key server is, whose address the gateways take; the first on a port known beforehand, the
  // tokens' audience.
  stack = await startStack({
    name: 'login',
    gateways: [{ ...authEnv, PORT: String(port) }, { ...authEnv, TASKRELAY_ADMIN_SESSION_TTL_MS: '3000' }, {}],
    workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/operate-tools.mjs') }],
  });
  ({ r, prefix } = stack);
  [gateway, shortLived, open] = stack.gateways as [GatewayProcess, GatewayProcess, GatewayProcess];
  alice = await stack.client({ Authorization: 'Bearer alicetoken' });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
  });
});

afterAll(async () => {
  await browser?.close();
  await stack?.stop();
  await new Promise((done) => jwksServer?.close(done));
});

describe('the dashboard login over HTTP', () => {
  it('GET /admin/login is a form with one token field; a browser without a session is sent to it', async () => {
    const form = await fetch(`${admin(gateway)}/login`);
    expect(form.status).toBe(200);
    const html = await form.text();
    expect(html).toMatch(/<form method="post" action="\/admin\/login">/);
    expect(html).toMatch(/<input id="token" name="token" type="password"/);
    const page = await fetch(`${admin(gateway)}/tasks`, { redirect: 'manual', headers: { accept: 'text/html' } });
    expect([page.status, page.headers.get('location')]).toEqual([303, '/admin/login']);
    // A script without credentials still gets the bearer 401, not a form.
    expect((await fetch(`${admin(gateway)}/api/overview`)).status).toBe(401);
  });

  it("an operator's token gives an HttpOnly, SameSite=Strict session cookie and 303 to /admin; the session opens the pages, the API and /metrics", async () => {
    const { res, setCookie, cookie } = await login(gateway, '0pstoken');
    expect([res.status, res.headers.get('location')]).toEqual([303, '/admin']);
    expect(setCookie).toMatch(/; HttpOnly/);
    expect(setCookie).toMatch(/; SameSite=Strict/);
    expect(setCookie).toMatch(/; Path=\//);
    expect(setCookie).not.toMatch(/; Secure/); // plain HTTP on loopback
    for (const path of ['/admin/tasks', '/admin/api/overview', '/admin/queues', '/metrics']) {
      const ok = await fetch(gateway.url.replace(/\/mcp$/, path), { headers: { cookie: cookie! } });
      expect(ok.status, path).toBe(200);
    }
    // Redis holds the cookie's digest, never the cookie.
    const stored = await r.keys(`${prefix}:admin-session:*`);
    expect(stored.length).toBeGreaterThan(0);
    expect(stored.some((k) => k.includes(cookie!.split('=')[1]!))).toBe(false);
  });

  it('refuses a wrong token (401), a principal that is no operator (403), an empty form (400) and a login from another origin (403), each with a line saying why', async () => {
    const wrong = await login(gateway, 'nope');
    expect(wrong.res.status).toBe(401);
    expect(wrong.text).toMatch(/id="login-error"[^>]*>Not signed in: the gateway does not accept that token/);
    expect(wrong.cookie).toBeUndefined();
    const notOperator = await login(gateway, 'alicetoken');
    expect(notOperator.res.status).toBe(403);
    expect(notOperator.text).toMatch(/alice is not an operator \(TASKRELAY_OPERATORS\)/);
    expect(notOperator.cookie).toBeUndefined();
    const empty = await login(gateway, ' ');
    expect(empty.res.status).toBe(400);
    const cross = await login(gateway, '0pstoken', { origin: 'http://evil.example' });
    expect(cross.res.status).toBe(403);
    expect(cross.cookie).toBeUndefined();
  });

  it("signs in with the OAuth issuer's access token: an operator's, not another subject's nor one without the scope; the session ends when the token does", async () => {
    const other = await login(gateway, await accessToken('user-7'));
    expect(other.res.status).toBe(403);
    expect(other.text).toContain(`${issuer}#user-7 is not an operator`);
    const noScope = await login(gateway, await accessToken('operator-1', { scope: 'other' }));
    expect(noScope.res.status).toBe(403);
    const exp = Math.floor(Date.now() / 1000) + 3;
    const { res, cookie } = await login(gateway, await accessToken('operator-1', { exp }));
    expect(res.status).toBe(303);
    const overview = () => fetch(`${admin(gateway)}/api/overview`, { headers: { cookie: cookie! } });
    expect((await overview()).status).toBe(200);
    await waitFor(async () => (await overview()).status === 401, {
      timeoutMs: 15_000,
      message: 'the session outlived its access token',
    });
    expect(Date.now()).toBeGreaterThanOrEqual(exp * 1000);
  });

  it('a session works on every gateway of the deployment, and ends on all of them at its configured expiry', async () => {
    const { cookie } = await login(shortLived, '0pstoken');
    const on = (g: GatewayProcess) =>
      fetch(`${admin(g)}/api/overview`, { headers: { cookie: cookie! } }).then((res) => res.status);
    expect([await on(shortLived), await on(gateway)]).toEqual([200, 200]);
    await waitFor(async () => (await on(gateway)) === 401 && (await on(shortLived)) === 401, {
      timeoutMs: 15_000,
      message: 'the 3 s session did not end',
    });
  });

  it('a session does not outlive its operator: a gateway whose TASKRELAY_OPERATORS no longer lists ops refuses it (403)', async () => {
    const { cookie } = await login(gateway, '0pstoken');
    const demoted = await stack.addGateway({ ...authEnv, TASKRELAY_OPERATORS: 'olga' });
    try {
      const res = await fetch(`${admin(demoted)}/api/overview`, { headers: { cookie: cookie! } });
      expect(res.status).toBe(403);
      expect((await fetch(`${admin(gateway)}/api/overview`, { headers: { cookie: cookie! } })).status).toBe(200);
    } finally {
      await demoted.kill('SIGTERM');
    }
  });

  it("a write made with the session needs the page's CSRF token; with it, the replay is made", async () => {
    const taskId = await endedTask('csrf');
    const { cookie } = await login(gateway, '0pstoken');
    const replay = (headers: Record<string, string>) =>
      fetch(`${admin(gateway)}/api/tasks/${taskId}/replay`, {
        method: 'POST',
        headers: { cookie: cookie!, 'content-type': 'application/json', ...headers },
        body: '{}',
      });
    const without = await replay({});
    expect(without.status).toBe(403);
    expect(((await without.json()) as { error: string }).error).toMatch(/CSRF token/);
    expect((await replay({ 'x-csrf-token': 'not-the-token' })).status).toBe(403);
    // A DELETE too (a schedule's removal), and a logout.
    const del = await fetch(`${admin(gateway)}/api/schedules/anything`, {
      method: 'DELETE',
      headers: { cookie: cookie! },
    });
    expect(del.status).toBe(403);
    expect(await r.hget(`${prefix}:task:${taskId}`, 'replayedBy')).toBeNull();
    const made = await replay({ 'x-csrf-token': await csrfOf(gateway, cookie!) });
    expect(made.status).toBe(201);
    const newId = ((await made.json()) as { task: { taskId: string } }).task.taskId;
    expect(await r.hget(`${prefix}:task:${taskId}`, 'replayedBy')).toBe(newId);
  });

  it('a logout ends the session on every gateway, and needs its CSRF token', async () => {
    const { cookie } = await login(gateway, '0pstoken');
    const csrf = await csrfOf(gateway, cookie!);
    const logout = (body: Record<string, string>) =>
      fetch(`${admin(shortLived)}/logout`, {
        method: 'POST',
        redirect: 'manual',
        headers: { cookie: cookie!, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams(body).toString(),
      });
    expect((await logout({})).status).toBe(403);
    expect((await fetch(`${admin(gateway)}/api/overview`, { headers: { cookie: cookie! } })).status).toBe(200);
    const out = await logout({ csrf });
    expect([out.status, out.headers.get('location')]).toEqual([303, '/admin/login']);
    expect(out.headers.getSetCookie().join()).toMatch(/taskrelay_admin=;.*Expires=Thu, 01 Jan 1970/);
    // Ended on the server: the same cookie, replayed on another gateway, opens nothing.
    expect((await fetch(`${admin(gateway)}/api/overview`, { headers: { cookie: cookie! } })).status).toBe(401);
  });

  it('bearer access keeps working for scripts: a JSON POST needs no CSRF token', async () => {
    const taskId = await endedTask('bearer');
    const res = await fetch(`${admin(gateway)}/api/tasks/${taskId}/replay`, {
      method: 'POST',
      headers: { authorization: 'Bearer 0pstoken', 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(201);
  });

  it('F7: an operator POST that is not JSON is refused (415) with no Origin, with a bearer and with auth off, and nothing is done', async () => {
    const anonymous = await stack.client({}, open.url);
    for (const g of [gateway, open]) {
      const taskId = await startTask(g === open ? anonymous : alice, 'nightly_report', { report: 'f7' });
      await waitFor(async () => (await r.hget(`${prefix}:task:${taskId}`, 'status')) === 'completed', {
        message: 'the task to replay did not complete',
      });
      const auth: Record<string, string> = g === gateway ? { authorization: 'Bearer 0pstoken' } : {};
      for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
        const res = await fetch(`${admin(g)}/api/tasks/${taskId}/replay`, {
          method: 'POST',
          headers: { ...auth, 'content-type': type },
          body: '{}',
        });
        expect(res.status, `${type} on ${g === open ? 'the open gateway' : 'the authed gateway'}`).toBe(415);
        expect(((await res.json()) as { error: string }).error).toMatch(/Content-Type: application\/json/);
      }
      const bare = await fetch(`${admin(g)}/api/tools/nightly_report/pause`, { method: 'POST', headers: auth });
      expect(bare.status).toBe(415);
      const schedule = await fetch(g.url.replace(/\/mcp$/, '/api/schedules'), {
        method: 'POST',
        headers: { ...auth, 'content-type': 'text/plain' },
        body: JSON.stringify({ id: 'f7', tool: 'nightly_report', arguments: { report: 'x' }, every: 60_000 }),
      });
      expect(schedule.status).toBe(415);
      expect(await r.hget(`${prefix}:task:${taskId}`, 'replayedBy')).toBeNull();
      const paused = (await (await fetch(`${admin(g)}/api/tools`, { headers: auth })).json()) as {
        tools: Array<{ name: string; paused: boolean }>;
      };
      expect(paused.tools.find((t) => t.name === 'nightly_report')?.paused).toBe(false);
    }
    await anonymous.close();
  });
});

describe('the dashboard login in Chromium', () => {
  it('logs in, shows a log line with its fields, replays a task, and logs out; the old cookie then opens nothing', async () => {
    const taskId = await endedTask('browser');
    const context = await browser.newContext();
    const page = await context.newPage();
    try {
      await page.goto(`${admin(gateway)}/tasks/${taskId}`);
      await page.waitForURL('**/admin/login');
      await page.fill('#token', 'wrong');
      await page.click('#sign-in');
      await page.locator('#login-error').waitFor();
      expect(await page.locator('#login-error').innerText()).toMatch(/does not accept that token/);
      await page.fill('#token', '0pstoken');
      await page.click('#sign-in');
      await page.waitForURL('**/admin/tasks');
      const [session] = (await context.cookies()).filter((c) => c.name === 'taskrelay_admin');
      expect(session).toMatchObject({ httpOnly: true, sameSite: 'Strict', path: '/' });
      // Out of the page's scripts' reach.
      expect(await page.evaluate('document.cookie')).not.toContain('taskrelay_admin');
      await page.locator('#workers').waitFor({ timeout: 15_000 });

      // The task's page: its log line with the fields the tool gave it, then Replay.
      await page.goto(`${admin(gateway)}/tasks/${taskId}`);
      const line = page.locator('#logs tr:has(td:text-is("publishing browser"))');
      await line.waitFor({ timeout: 15_000 });
      expect(await line.locator('td.fields').innerText()).toBe('report=browser');
      await page.click('#replay');
      await page.waitForURL((url) => /\/admin\/tasks\/[0-9a-f]+$/.test(url.pathname) && !url.pathname.endsWith(taskId));
      const replayId = page.url().split('/').at(-1)!;
      await page.locator('#task .badge.s-completed').waitFor({ timeout: 20_000 });
      expect(await r.hget(`${prefix}:task:${taskId}`, 'replayedBy')).toBe(replayId);
      expect((await getTask(alice, taskId))._meta).toMatchObject({ 'dev.taskrelay/replayed-by': replayId });

      // bull-board opens with the session too (its pages and its API).
      await page.goto(`${admin(gateway)}/queues`);
      await page.getByText('default~nightly_report').first().waitFor({ timeout: 15_000 });

      // Log out: the form, then the login page; the session is gone on the server too.
      await page.goto(`${admin(gateway)}/tasks`);
      await page.locator('#workers').waitFor({ timeout: 15_000 });
      await page.click('#log-out');
      await page.waitForURL('**/admin/login');
      expect((await context.cookies()).some((c) => c.name === 'taskrelay_admin')).toBe(false);
      const replayed = await fetch(`${admin(gateway)}/api/overview`, {
        headers: { cookie: `taskrelay_admin=${session!.value}` },
      });
      expect(replayed.status).toBe(401);
      await page.goto(`${admin(gateway)}/tasks`);
      await page.waitForURL('**/admin/login');
    } finally {
      await context.close();
    }
  });

  it("refuses a cross-site form POST made from a logged-in operator's browser (text/plain, no CSRF token), same-site or not", async () => {
    const taskId = await endedTask('forged');
    const target = `${admin(gateway)}/api/tasks/${taskId}/replay`;
    // A page of another site: it posts a form at the gateway as soon as it loads (text/plain, so its body is JSON).
    const evil = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' }).end(`<!doctype html><form method="post" action="${target}"
        enctype="text/plain"><input name='{"redrive":false,"x":"' value='"}'></form>
        <script>document.forms[0].submit()</script>`);
    });
    await new Promise<void>((done) => evil.listen(0, '127.0.0.1', done));
    const evilPort = (evil.address() as AddressInfo).port;
    const context = await browser.newContext();
    const page = await context.newPage();
    try {
      await page.goto(`${admin(gateway)}/login`);
      await page.fill('#token', '0pstoken');
      await page.click('#sign-in');
      await page.waitForURL('**/admin/tasks');
      // `localhost` is another site than `127.0.0.1` (SameSite keeps the cookie home); another port of 127.0.0.1 is
      // the same site, another origin (the cookie goes, the Origin and the missing CSRF token refuse it).
      const statuses: Record<string, number> = {};
      for (const origin of [`http://localhost:${evilPort}`, `http://127.0.0.1:${evilPort}`]) {
        const answered = page.waitForResponse((res) => res.url() === target);
        await page.goto(`${origin}/`);
        const res = await answered;
        expect(res.request().method()).toBe('POST');
        statuses[origin] = res.status();
      }
      // Cross-site: no cookie went, so no one is signed in (401). Same site: the cookie went, and was not enough (403).
      expect(statuses).toEqual({ [`http://localhost:${evilPort}`]: 401, [`http://127.0.0.1:${evilPort}`]: 403 });
      expect(await r.hget(`${prefix}:task:${taskId}`, 'replayedBy')).toBeNull();
      // The operator's session is still good for the operator.
      await page.goto(`${admin(gateway)}/tasks`);
      await page.locator('#workers').waitFor({ timeout: 15_000 });
      expect(page.url()).toMatch(/\/admin\/tasks$/);
    } finally {
      await context.close();
      await new Promise((done) => evil.close(done));
    }
  });
});

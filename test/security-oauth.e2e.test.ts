/**
 * docs/CONFIGURATION.md, docs/HTTP.md: the gateway as an OAuth 2.1 resource server. A local JWKS server publishes keys made with `jose`;
 * tokens are signed here. Static tokens stay on beside OAuth.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import getPort from 'get-port';
import { SignJWT, exportJWK, generateKeyPair, type CryptoKey, type JWK } from 'jose';
import type { GatewayProcess, ManagedProcess } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';

let stack: TestStack;
let gateway: GatewayProcess;
let worker: ManagedProcess;
let jwksServer: Server;
let issuer: string;
let audience: string;
let published: JWK[] = [];
let jwksFetches = 0;
let keyA: { privateKey: CryptoKey; kid: string; jwk: JWK };

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
const SCOPE = 'taskrelay:tools';
const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'oauth', version: '0' } },
};

async function newKey(kid: string, alg: 'RS256' | 'ES256') {
  const { privateKey, publicKey } = await generateKeyPair(alg);
  const jwk = { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' };
  return { privateKey, kid, alg, jwk };
}

async function token(
  key: { privateKey: CryptoKey; kid: string },
  claims: Record<string, unknown> = {},
  options: { alg?: string; exp?: number; nbf?: number; iss?: string; aud?: string; sub?: string } = {},
): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ scope: SCOPE, ...claims })
    .setProtectedHeader({ alg: options.alg ?? 'RS256', kid: key.kid })
    .setIssuer(options.iss ?? issuer)
    .setAudience(options.aud ?? audience)
    .setSubject(options.sub ?? 'user-1')
    .setIssuedAt(now)
    .setNotBefore(options.nbf ?? now)
    .setExpirationTime(options.exp ?? now + 300)
    .sign(key.privateKey);
}

beforeAll(async () => {
  jwksServer = createServer((req, res) => {
    if (req.url !== '/jwks') {
      res.writeHead(404).end();
      return;
    }
    jwksFetches++;
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: published }));
  });
  await new Promise<void>((resolve) => jwksServer.listen(0, '127.0.0.1', resolve));
  const jwksPort = (jwksServer.address() as AddressInfo).port;
  const a = await newKey('key-a', 'RS256');
  keyA = a;
  published = [a.jwk];
  issuer = `http://127.0.0.1:${jwksPort}/`;
  const port = await getPort({ host: '127.0.0.1' });
  audience = `http://127.0.0.1:${port}/mcp`;
  stack = await startStack({
    name: 'oauth',
    gateways: [
      {
        PORT: String(port),
        TASKRELAY_OAUTH_ISSUER: issuer,
        TASKRELAY_OAUTH_AUDIENCE: audience,
        TASKRELAY_OAUTH_JWKS_URL: `http://127.0.0.1:${jwksPort}/jwks`,
        TASKRELAY_OAUTH_SCOPES: SCOPE,
        TASKRELAY_OAUTH_JWKS_COOLDOWN_MS: '0',
        TASKRELAY_AUTH_TOKENS: 'ops:static-ops-token',
        // An OAuth operator by issuer and subject; the issuer is only known once the JWKS server listens.
        TASKRELAY_OPERATORS: `ops,${issuer}#operator-1`,
        LOG_LEVEL: 'debug',
      },
    ],
    workers: [{ LOG_LEVEL: 'debug' }],
  });
  ({ gateway } = stack);
  [worker] = stack.workers as [ManagedProcess];
});

afterAll(async () => {
  await stack?.stop();
  await new Promise((resolve) => jwksServer?.close(resolve));
});

function post(bearer: string | undefined, body: unknown, extra: Record<string, string> = {}) {
  return fetch(gateway.url, {
    method: 'POST',
    headers: { ...JSON_HEADERS, ...(bearer ? { authorization: `Bearer ${bearer}` } : {}), ...extra },
    body: JSON.stringify(body),
  });
}

/** Opens a session with `bearer` and returns a function making one request in it (result or error). */
async function session(bearer: string) {
  const init = await post(bearer, INIT);
  expect(init.status).toBe(200);
  const sessionId = init.headers.get('mcp-session-id') ?? '';
  await init.text();
  const extra = { 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-11-25' };
  await (await post(bearer, { jsonrpc: '2.0', method: 'notifications/initialized' }, extra)).text();
  let id = 1;
  return async (method: string, params: unknown) => {
    const res = await post(bearer, { jsonrpc: '2.0', id: id++, method, params }, extra);
    const text = await res.text();
    const data = text.includes('data:')
      ? text
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).trim())
          .filter(Boolean)
          .pop()
      : text;
    return JSON.parse(data ?? 'null') as { result?: any; error?: { code: number; message: string } };
  };
}

const metadataUrl = () => new URL('/.well-known/oauth-protected-resource/mcp', audience).href;

describe('OAuth resource server (docs/CONFIGURATION.md, docs/HTTP.md)', () => {
  it('serves RFC 9728 metadata naming this resource and its authorization server', async () => {
    for (const path of ['/.well-known/oauth-protected-resource/mcp', '/.well-known/oauth-protected-resource']) {
      const res = await fetch(new URL(path, audience));
      expect(res.status).toBe(200);
      const body = (await res.json()) as Record<string, unknown>;
      expect(body['resource']).toBe(audience);
      expect(body['authorization_servers']).toEqual([issuer]);
      expect(body['scopes_supported']).toEqual([SCOPE]);
    }
  });

  it('answers 401 with WWW-Authenticate pointing at the metadata when the token is missing or bad', async () => {
    for (const bearer of [undefined, 'not-a-jwt', `${await token(keyA)}x`]) {
      const res = await post(bearer, INIT);
      expect(res.status, String(bearer)).toBe(401);
      const header = res.headers.get('www-authenticate') ?? '';
      expect(header).toMatch(/^Bearer /);
      expect(header).toContain(`resource_metadata="${metadataUrl()}"`);
      await res.body?.cancel();
    }
  });

  it('accepts a valid token, binds tasks to issuer + subject, and keeps them from another subject', async () => {
    const mine = await session(await token(keyA, {}, { sub: 'user-1' }));
    const created = await mine('tools/call', {
      name: 'build_report',
      arguments: { report: 'r', items: 1 },
      task: {},
    });
    const taskId: string = created.result.task.taskId;
    expect((await mine('tasks/get', { taskId })).result?.taskId).toBe(taskId);
    const theirs = await session(await token(keyA, {}, { sub: 'user-2' }));
    expect((await theirs('tasks/get', { taskId })).error?.code).toBe(-32602);
    expect((await theirs('tasks/list', {})).result?.tasks).toEqual([]);
  });

  it('rejects expired, not-yet-valid, foreign-issuer and foreign-audience tokens, within a small clock skew', async () => {
    const now = Math.floor(Date.now() / 1000);
    const rejected = [
      await token(keyA, {}, { exp: now - 120 }),
      await token(keyA, {}, { nbf: now + 120 }),
      await token(keyA, {}, { iss: 'http://127.0.0.1:1/other' }),
      await token(keyA, {}, { aud: 'http://127.0.0.1:1/elsewhere' }),
    ];
    for (const bearer of rejected) {
      const res = await post(bearer, INIT);
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toMatch(/error="invalid_token"/);
      await res.body?.cancel();
    }
    // Expired 5 s ago, or valid from 5 s on: within the 30 s skew.
    for (const bearer of [await token(keyA, {}, { exp: now - 5 }), await token(keyA, {}, { nbf: now + 5 })]) {
      const res = await post(bearer, INIT);
      expect(res.status).toBe(200);
      await res.text();
    }
  });

  it('answers 403 insufficient_scope to a valid token without the required scope', async () => {
    const res = await post(await token(keyA, { scope: 'other:scope' }), INIT);
    expect(res.status).toBe(403);
    expect(res.headers.get('www-authenticate')).toMatch(/error="insufficient_scope"/);
    expect(((await res.json()) as { error?: string }).error).toBe('insufficient_scope');
  });

  it('never accepts alg none, nor an HS256 token keyed with the published key', async () => {
    const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
    const now = Math.floor(Date.now() / 1000);
    const claims = { iss: issuer, aud: audience, sub: 'user-1', scope: SCOPE, exp: now + 300, iat: now };
    const unsigned = `${b64({ alg: 'none', typ: 'JWT', kid: 'key-a' })}.${b64(claims)}.`;
    const secret = new TextEncoder().encode(JSON.stringify(published[0]));
    const hs = await new SignJWT(claims).setProtectedHeader({ alg: 'HS256', kid: 'key-a' }).sign(secret);
    for (const bearer of [unsigned, hs]) {
      const res = await post(bearer, INIT);
      expect(res.status).toBe(401);
      await res.body?.cancel();
    }
  });

  it('follows a key rotation: a token signed with a new kid is accepted once the JWKS publishes it', async () => {
    const b = await newKey('key-b', 'ES256');
    const before = jwksFetches;
    published = [b.jwk];
    const res = await post(await token(b, {}, { alg: 'ES256', sub: 'user-3' }), INIT);
    expect(res.status).toBe(200);
    await res.text();
    expect(jwksFetches).toBeGreaterThan(before);
    // A kid the issuer never published stays out.
    const stranger = await newKey('key-c', 'ES256');
    const rejected = await post(await token(stranger, {}, { alg: 'ES256' }), INIT);
    expect(rejected.status).toBe(401);
    await rejected.body?.cancel();
    // The retired key is gone from the set the gateway now holds.
    const retired = await post(await token(keyA), INIT);
    expect(retired.status).toBe(401);
    await retired.body?.cancel();
    published = [keyA.jwk, b.jwk];
  });

  it('still takes static tokens beside OAuth, and /metrics needs either', async () => {
    const res = await post('static-ops-token', INIT);
    expect(res.status).toBe(200);
    await res.text();
    const base = audience.replace(/\/mcp$/, '');
    expect((await fetch(`${base}/metrics`)).status).toBe(401);
    expect((await fetch(`${base}/metrics`, { headers: { authorization: 'Bearer static-ops-token' } })).status).toBe(
      200,
    );
  });

  it('lets an OAuth operator (<iss>#<sub>) on /metrics and /admin, and answers any other OAuth user 403', async () => {
    const base = audience.replace(/\/mcp$/, '');
    const operator = await token(keyA, {}, { sub: 'operator-1' });
    const user = await token(keyA, {}, { sub: 'user-1' });
    for (const path of ['/metrics', '/admin/api/overview', '/admin/queues/api/redis/stats']) {
      const allowed = await fetch(`${base}${path}`, { headers: { authorization: `Bearer ${operator}` } });
      await allowed.body?.cancel();
      expect(allowed.status, path).toBe(200);
      const refused = await fetch(`${base}${path}`, { headers: { authorization: `Bearer ${user}` } });
      await refused.body?.cancel();
      expect(refused.status, path).toBe(403);
    }
  });

  it('never logs a token, and hands the worker the principal only', async () => {
    const secretToken = await token(keyA, {}, { sub: 'user-logs' });
    const call = await session(secretToken);
    await call('tools/call', { name: 'build_report', arguments: { report: 'r', items: 1 } });
    const signature = secretToken.split('.')[2] ?? '';
    expect(signature.length).toBeGreaterThan(20);
    expect(gateway.output()).not.toContain(signature);
    expect(gateway.output()).not.toContain('static-ops-token');
    expect(worker.output()).not.toContain(signature);
    expect(worker.output()).toContain('user-logs');
  });
});

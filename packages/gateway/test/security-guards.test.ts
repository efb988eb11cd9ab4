import { describe, expect, it } from 'vitest';
import type { Request, Response } from 'express';
import { createLogger, loadGatewayConfig } from '@taskrelay/shared';
import { HeaderVerdicts, hostGuard, jsonDepthExceeds, requireJsonContent } from '../src/http/http-guards.js';
import { sanitizeOutgoing } from '../src/http/safe-errors.js';
import { TokenVerifier } from '../src/http/auth/token-verifier.js';

const log = createLogger('test', { level: 'silent' });
const bytes = (text: string) => new TextEncoder().encode(text);

describe('JSON depth scan', () => {
  it('counts object and array nesting, and ignores brackets inside strings and after escapes', () => {
    expect(jsonDepthExceeds(bytes('{"a":[1,{"b":[]}]}'), 4)).toBe(false);
    expect(jsonDepthExceeds(bytes('{"a":[1,{"b":[]}]}'), 3)).toBe(true);
    expect(jsonDepthExceeds(bytes('{"a":[1,{"b":[[]]}]}'), 4)).toBe(true);
    expect(jsonDepthExceeds(bytes('{"a":"[[[[[[[[[[{{{{{{"}'), 2)).toBe(false);
    expect(jsonDepthExceeds(bytes('{"a":"\\"[[[[[[[[[["}'), 2)).toBe(false);
    expect(jsonDepthExceeds(bytes(`${'['.repeat(65)}${']'.repeat(65)}`), 64)).toBe(true);
    expect(jsonDepthExceeds(bytes(`${'[]'.repeat(10_000)}`), 1)).toBe(false);
  });
});

function hostStatus(guard: ReturnType<typeof hostGuard>, host: string | undefined): number {
  let status = 200;
  const res = {
    status: (s: number) => {
      status = s;
      return res;
    },
    json: () => res,
  } as unknown as Response;
  guard({ headers: host === undefined ? {} : { host } } as Request, res, () => undefined);
  return status;
}

describe('Host validation (DNS rebinding)', () => {
  it('accepts loopback names and the bound address on any port by default, nothing else', () => {
    const guard = hostGuard(undefined, '127.0.0.2');
    for (const host of ['localhost:3000', '127.0.0.1', '[::1]:8080', 'LOCALHOST:1', '127.0.0.2:3000']) {
      expect(hostStatus(guard, host), host).toBe(200);
    }
    for (const host of ['evil.example', 'localhost.evil.example', '127.0.0.1.nip.io', 'a@localhost', '', undefined]) {
      expect(hostStatus(guard, host), String(host)).toBe(403);
    }
  });

  it('treats a configured host:port as that port only, and a bare host as any port', () => {
    const guard = hostGuard(['mcp.example.com', 'internal.example:8443'], '0.0.0.0');
    // Each verdict twice: the second comes from the guard's memory of the header's value.
    for (let round = 0; round < 2; round++) {
      expect(hostStatus(guard, 'mcp.example.com')).toBe(200);
      expect(hostStatus(guard, 'mcp.example.com:444')).toBe(200);
      expect(hostStatus(guard, 'internal.example:8443')).toBe(200);
      expect(hostStatus(guard, 'internal.example:8444')).toBe(403);
      expect(hostStatus(guard, 'localhost')).toBe(403);
    }
  });
});

/** What requireJsonContent answers a POST with these headers: 200 when it lets it through, else status and message. */
function contentStatus(headers: Record<string, string>): { status: number; message?: string } {
  let answer: { status: number; message?: string } = { status: 200 };
  const res = {
    status: (status: number) => {
      answer = { status };
      return res;
    },
    json: (body: { error: { message: string } }) => {
      answer.message = body.error.message;
      return res;
    },
  } as unknown as Response;
  const req = {
    method: 'POST',
    headers,
    is(type: string) {
      // express's req.is, on these headers.
      return type === 'application/json' && /^application\/json\s*(;|$)/i.test(headers['content-type'] ?? '')
        ? type
        : false;
    },
  } as unknown as Request;
  requireJsonContent(req, res, () => undefined);
  return answer;
}

describe('Content-Type of a POST', () => {
  it('lets UTF-8 JSON through and refuses the rest, the same each time a header value comes again', () => {
    const body = { 'content-length': '2' };
    for (let round = 0; round < 3; round++) {
      expect(contentStatus({ ...body, 'content-type': 'application/json' })).toEqual({ status: 200 });
      expect(contentStatus({ ...body, 'content-type': 'application/json; charset=UTF-8' })).toEqual({ status: 200 });
      expect(contentStatus({ ...body, 'content-type': 'text/plain' })).toMatchObject({
        status: 415,
        message: /must be application\/json/,
      });
      expect(contentStatus({ ...body, 'content-type': 'application/json; charset=latin1' })).toMatchObject({
        status: 415,
        message: /charset "latin1" is not accepted/,
      });
      // A JSON type already let through once, on a POST without a body: no content type at all (type-is's rule).
      expect(contentStatus({ 'content-type': 'application/json' })).toMatchObject({ status: 415 });
      expect(contentStatus({ 'content-type': 'application/json', 'transfer-encoding': 'chunked' })).toEqual({
        status: 200,
      });
      expect(contentStatus(body)).toMatchObject({ status: 415 });
    }
  });

  it('keeps at most its bound of verdicts, however many values it sees', () => {
    const verdicts = new HeaderVerdicts<number>(8);
    let judged = 0;
    const judge = (value: string) => {
      judged++;
      return value.length;
    };
    expect(verdicts.of('abc', judge)).toBe(3);
    expect(verdicts.of('abc', judge)).toBe(3);
    expect(judged).toBe(1);
    for (let i = 0; i < 100; i++) {
      expect(verdicts.of(`value-${i}`, judge)).toBe(`value-${i}`.length);
      expect(verdicts.size).toBeLessThanOrEqual(8);
    }
  });
});

describe('errors that reveal nothing', () => {
  it('replaces an internal error without a taskrelay code, and keeps the ones the gateway worded', () => {
    const raw = {
      jsonrpc: '2.0' as const,
      id: 1,
      error: { code: -32603, message: 'WRONGTYPE Operation against a key' },
    };
    expect(sanitizeOutgoing(raw, log, 's')).toEqual({ ...raw, error: { code: -32603, message: 'Internal error' } });
    const worded = { ...raw, error: { code: -32603, message: 'Task store unavailable', data: { code: 'X' } } };
    expect(sanitizeOutgoing(worded, log, 's')).toBe(worded);
    const invalid = { ...raw, error: { code: -32602, message: 'Task not found: x' } };
    expect(sanitizeOutgoing(invalid, log, 's')).toBe(invalid);
  });

  it('turns the SDK’s zod issue list into -32602 naming the field', () => {
    const issues = JSON.stringify(
      [
        {
          code: 'invalid_type',
          path: ['params', 'taskId'],
          message: 'Invalid input: expected string, received number',
        },
      ],
      null,
      2,
    );
    const out = sanitizeOutgoing({ jsonrpc: '2.0', id: 2, error: { code: -32603, message: issues } }, log, 's');
    expect(out).toEqual({
      jsonrpc: '2.0',
      id: 2,
      error: { code: -32602, message: 'Invalid params: taskId: expected string, received number' },
    });
  });
});

describe('static tokens', () => {
  it('maps each token to its principal and refuses near misses', async () => {
    const verifier = new TokenVerifier({
      staticTokens: new Map([
        ['alpha-token', 'alice'],
        ['beta-token', 'bob'],
      ]),
      oauth: undefined,
      log,
    });
    expect((await verifier.verifyAccessToken('beta-token')).clientId).toBe('bob');
    for (const wrong of ['beta-toke', 'beta-token ', 'BETA-TOKEN', '']) {
      await expect(verifier.verifyAccessToken(wrong)).rejects.toThrow(/Invalid bearer token/);
    }
  });
});

describe('security configuration', () => {
  it('refuses a non-loopback HOST without authentication unless explicitly allowed', () => {
    expect(() => loadGatewayConfig({ HOST: '0.0.0.0' })).toThrow(/TASKRELAY_ALLOW_UNAUTHENTICATED=true/);
    expect(loadGatewayConfig({ HOST: '0.0.0.0', TASKRELAY_ALLOW_UNAUTHENTICATED: 'true' }).allowUnauthenticated).toBe(
      true,
    );
    expect(loadGatewayConfig({ HOST: '0.0.0.0', TASKRELAY_AUTH_TOKENS: 'a:b' }).host).toBe('0.0.0.0');
    for (const host of ['127.0.0.1', 'localhost', '::1', '127.3.4.5'])
      expect(loadGatewayConfig({ HOST: host }).host).toBe(host);
  });

  it('needs the three OAuth variables together, as URLs', () => {
    expect(() => loadGatewayConfig({ TASKRELAY_OAUTH_ISSUER: 'https://a/' })).toThrow(/must be set together/);
    expect(() =>
      loadGatewayConfig({
        TASKRELAY_OAUTH_ISSUER: 'https://a/',
        TASKRELAY_OAUTH_AUDIENCE: 'gateway',
        TASKRELAY_OAUTH_JWKS_URL: 'https://a/jwks',
      }),
    ).toThrow(/TASKRELAY_OAUTH_AUDIENCE must be an http/);
    const config = loadGatewayConfig({
      TASKRELAY_OAUTH_ISSUER: 'https://a/',
      TASKRELAY_OAUTH_AUDIENCE: 'https://g/mcp',
      TASKRELAY_OAUTH_JWKS_URL: 'https://a/jwks',
      TASKRELAY_OAUTH_SCOPES: ' read  write ',
    });
    expect(config.oauth?.requiredScopes).toEqual(['read', 'write']);
    expect(() => loadGatewayConfig({ TASKRELAY_OAUTH_SCOPES: 'x' })).toThrow(/needs TASKRELAY_OAUTH_ISSUER/);
  });

  it('names the variable of a bad limit', () => {
    expect(() => loadGatewayConfig({ TASKRELAY_MAX_BODY_BYTES: '10' })).toThrow(
      /TASKRELAY_MAX_BODY_BYTES must be at least 1024/,
    );
    expect(() => loadGatewayConfig({ TASKRELAY_RATE_LIMIT_CALLS: 'many' })).toThrow(
      /TASKRELAY_RATE_LIMIT_CALLS must be a whole number/,
    );
  });
});

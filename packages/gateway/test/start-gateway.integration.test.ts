/** `startGateway` asks only for what differs from the defaults (resolveGatewayOptions applies the rest). */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadGatewayConfig, resolveGatewayOptions } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { startGateway } from '../src/app/gateway.js';

let server: TestRedis;

beforeAll(async () => {
  server = await startRedis();
});

afterAll(async () => {
  await server?.stop();
});

describe('startGateway with a few options', () => {
  it('starts from a Redis URL, a prefix and a port, with every other setting at its documented default', async () => {
    const gateway = await startGateway({
      redisUrl: server.url,
      prefix: uniquePrefix('start'),
      port: 0,
      logLevel: 'silent',
    });
    try {
      const health = await fetch(gateway.url.replace(/\/mcp$/, '/healthz'));
      expect(health.status).toBe(200);
      const init = await fetch(gateway.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'initialize',
          params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } },
        }),
      });
      expect(init.status).toBe(200);
    } finally {
      await gateway.close();
    }
  });
});

describe('resolveGatewayOptions', () => {
  it('gives the defaults an empty environment gives, with what was passed on top', () => {
    expect(resolveGatewayOptions({ redisUrl: 'redis://h:1' })).toEqual(loadGatewayConfig({ REDIS_URL: 'redis://h:1' }));
    const resolved = resolveGatewayOptions({ redisUrl: 'redis://h:1', port: 0, webhooks: { maxAttempts: 3 } });
    expect(resolved).toMatchObject({ port: 0, maxTtlMs: 86_400_000, webhooks: { maxAttempts: 3, retryBaseMs: 2_000 } });
  });

  it('checks each option with the bounds of its variable and the rules across them, naming the option', () => {
    expect(() => resolveGatewayOptions({ port: 70_000 })).toThrow(
      /^Invalid gateway options: port must be at most 65535$/,
    );
    expect(() => resolveGatewayOptions({ webhooks: { maxAttempts: 0 } })).toThrow(
      /^Invalid gateway options: webhooks\.maxAttempts must be at least 1$/,
    );
    expect(() => resolveGatewayOptions({ defaultTtlMs: 90_000_000 })).toThrow(
      /^Invalid gateway options: defaultTtlMs must not exceed maxTtlMs$/,
    );
    expect(() => resolveGatewayOptions({ host: '0.0.0.0' })).toThrow(
      /^Invalid gateway options: host 0\.0\.0\.0 is not a loopback address and no authentication is configured/,
    );
    expect(resolveGatewayOptions({ host: '0.0.0.0', authTokens: new Map([['t', 'alice']]) }).host).toBe('0.0.0.0');
  });
});

import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/errors.js';
import { loadGatewayConfig, loadWorkerConfig, requireRedisUrl } from '../src/config.js';

describe('configuration', () => {
  it('applies the contract defaults', () => {
    const g = loadGatewayConfig({});
    expect(g).toMatchObject({
      host: '127.0.0.1',
      port: 3000,
      prefix: 'taskrelay',
      logLevel: 'info',
      progressIntervalMs: 50,
      shutdownGraceMs: 10_000,
    });
    expect(g.authTokens).toBeUndefined();
    expect(g.allowedOrigins).toBeUndefined();
    const w = loadWorkerConfig({});
    expect(w).toMatchObject({ concurrency: 8, lockDurationMs: 30_000, queue: 'default', toolsModule: undefined });
  });

  it('parses auth tokens into token → principal', () => {
    const g = loadGatewayConfig({ TASKRELAY_AUTH_TOKENS: 'alice:s3cret, bob:t0ken' });
    expect(g.authTokens?.get('s3cret')).toBe('alice');
    expect(g.authTokens?.get('t0ken')).toBe('bob');
  });

  it('rejects a bad value with one line naming the variable', () => {
    const attempt = () => loadGatewayConfig({ PORT: 'abc' });
    expect(attempt).toThrow(ConfigError);
    expect(attempt).toThrow(/^Invalid configuration: PORT must be a whole number \(got "abc"\)$/);
    expect(() => loadWorkerConfig({ WORKER_CONCURRENCY: '0' })).toThrow(/WORKER_CONCURRENCY must be at least 1/);
    expect(() => loadGatewayConfig({ REDIS_URL: 'http://x' })).toThrow(
      /REDIS_URL must be a redis:\/\/ or rediss:\/\/ URL/,
    );
    expect(() => loadGatewayConfig({ LOG_LEVEL: 'loud' })).toThrow(/LOG_LEVEL must be one of/);
    expect(() => loadGatewayConfig({ GATEWAY_SHUTDOWN_GRACE_MS: '-1' })).toThrow(
      /GATEWAY_SHUTDOWN_GRACE_MS must be at least 0/,
    );
    expect(loadGatewayConfig({ GATEWAY_SHUTDOWN_GRACE_MS: '0' }).shutdownGraceMs).toBe(0);
  });

  it('never echoes auth tokens in its error', () => {
    expect(() => loadGatewayConfig({ TASKRELAY_AUTH_TOKENS: 'nocolon' })).toThrow(
      /^Invalid configuration: TASKRELAY_AUTH_TOKENS must be a comma list of principal:token pairs$/,
    );
  });

  it('treats empty variables as unset', () => {
    expect(loadGatewayConfig({ PORT: '', TASKRELAY_PREFIX: '' }).port).toBe(3000);
  });

  it('requires REDIS_URL only where asked', () => {
    expect(() => requireRedisUrl(loadWorkerConfig({}))).toThrow(/REDIS_URL is required/);
    expect(requireRedisUrl(loadWorkerConfig({ REDIS_URL: 'redis://127.0.0.1:1' }))).toBe('redis://127.0.0.1:1');
  });
});

import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/protocol/errors.js';
import { loadGatewayConfig, loadWorkerConfig, requireRedisUrl } from '../src/config.js';
import { keyLayoutOf, parseRedisTarget } from '../src/redis.js';

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

describe('Redis Cluster, Sentinel and TLS configuration', () => {
  it('uses REDIS_CLUSTER_NODES instead of REDIS_URL, with a {prefix}', () => {
    const w = loadWorkerConfig({
      REDIS_CLUSTER_NODES: '127.0.0.1:7000, 127.0.0.1:7001,[::1]:7002',
      REDIS_URL: 'redis://ignored:1',
      TASKRELAY_PREFIX: '{acme}',
    });
    expect(requireRedisUrl(w)).toBe('redis+cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002');
    expect(parseRedisTarget(requireRedisUrl(w))).toEqual({
      kind: 'cluster',
      nodes: [
        { host: '127.0.0.1', port: 7000 },
        { host: '127.0.0.1', port: 7001 },
        { host: '::1', port: 7002 },
      ],
    });
  });

  it('refuses a cluster of the single layout without a {prefix}, or with a bad node list, in one line', () => {
    expect(() => loadGatewayConfig({ REDIS_CLUSTER_NODES: '127.0.0.1:7000', TASKRELAY_KEY_LAYOUT: 'single' })).toThrow(
      /^Invalid configuration: TASKRELAY_PREFIX must be wrapped in \{\} on a Redis Cluster with the single key layout \(one hash slot for every key\), e\.g\. \{taskrelay\}, or be unbraced with TASKRELAY_KEY_LAYOUT=auto \(got "taskrelay"\)$/,
    );
    expect(() => loadGatewayConfig({ REDIS_CLUSTER_NODES: '127.0.0.1:7000', TASKRELAY_PREFIX: 'a{b}' })).toThrow(
      /must be wrapped in \{\}/,
    );
    expect(() => loadWorkerConfig({ REDIS_CLUSTER_NODES: '127.0.0.1', TASKRELAY_PREFIX: '{a}' })).toThrow(
      /^Invalid configuration: REDIS_CLUSTER_NODES must be a comma list of host:port \(bad entry "127\.0\.0\.1"\)/,
    );
    expect(() => loadWorkerConfig({ REDIS_CLUSTER_NODES: 'h:99999', TASKRELAY_PREFIX: '{a}' })).toThrow(
      /REDIS_CLUSTER_NODES must be a comma list/,
    );
    // The API path too: a cluster target with a bare prefix never reaches Redis.
    expect(() =>
      requireRedisUrl({ ...loadWorkerConfig({ TASKRELAY_KEY_LAYOUT: 'single' }), redisUrl: 'redis+cluster://h:1' }),
    ).toThrow(/TASKRELAY_PREFIX must be wrapped in \{\}/);
  });

  it('picks the key layout (PROTOCOL.md §1.1): sharded on a cluster with an unbraced prefix, or when forced', () => {
    const cluster = loadGatewayConfig({ REDIS_CLUSTER_NODES: '127.0.0.1:7000' });
    expect(keyLayoutOf(cluster.redisUrl, cluster.prefix, cluster.keyLayout)).toBe('sharded');
    const braced = loadGatewayConfig({ REDIS_CLUSTER_NODES: '127.0.0.1:7000', TASKRELAY_PREFIX: '{tr}' });
    expect(keyLayoutOf(braced.redisUrl, braced.prefix, braced.keyLayout)).toBe('single');
    const one = loadWorkerConfig({ REDIS_URL: 'redis://127.0.0.1:6379' });
    expect(keyLayoutOf(one.redisUrl, one.prefix, one.keyLayout)).toBe('single');
    const forced = loadWorkerConfig({ REDIS_URL: 'redis://127.0.0.1:6379', TASKRELAY_KEY_LAYOUT: 'sharded' });
    expect(keyLayoutOf(forced.redisUrl, forced.prefix, forced.keyLayout)).toBe('sharded');
    expect(() =>
      loadWorkerConfig({
        REDIS_URL: 'redis://127.0.0.1:6379',
        TASKRELAY_KEY_LAYOUT: 'sharded',
        TASKRELAY_PREFIX: '{a}',
      }),
    ).toThrow(/^Invalid configuration: TASKRELAY_PREFIX must have no braces with the sharded key layout[^\n]*$/);
    expect(() => loadGatewayConfig({ TASKRELAY_KEY_LAYOUT: 'split' })).toThrow(
      /^Invalid configuration: TASKRELAY_KEY_LAYOUT must be one of auto, single, sharded \(got "split"\)$/,
    );
  });

  it('accepts Sentinels with a master name', () => {
    const g = loadGatewayConfig({ REDIS_SENTINELS: 's1:26379,s2:26379', REDIS_SENTINEL_NAME: 'mymaster' });
    expect(parseRedisTarget(requireRedisUrl(g))).toEqual({
      kind: 'sentinel',
      sentinels: [
        { host: 's1', port: 26379 },
        { host: 's2', port: 26379 },
      ],
      name: 'mymaster',
    });
    expect(() => loadGatewayConfig({ REDIS_SENTINELS: 's1:26379' })).toThrow(/REDIS_SENTINEL_NAME .* is required/);
    expect(() =>
      loadGatewayConfig({ REDIS_SENTINELS: 's1:1', REDIS_SENTINEL_NAME: 'm', REDIS_CLUSTER_NODES: 'h:1' }),
    ).toThrow(/not both/);
  });

  it('accepts rediss:// for TLS', () => {
    const w = loadWorkerConfig({ REDIS_URL: 'rediss://user:pw@redis.example:6380/2' });
    expect(parseRedisTarget(requireRedisUrl(w))).toEqual({
      kind: 'standalone',
      url: 'rediss://user:pw@redis.example:6380/2',
    });
  });
});

import { createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import getPort from 'get-port';
import { ReplyError } from 'ioredis';
import { TaskrelayError } from '../src/protocol/errors.js';
import { Cluster } from 'ioredis';
import {
  FAIL_FAST_REDIS_OPTIONS,
  createRedis,
  isRedisUnavailableError,
  parseRedisTarget,
  waitForRedis,
  type Redis,
  type RedisClient,
} from '../src/redis.js';

const clients: RedisClient[] = [];

/** The client of a single server or a Sentinel master: an ioredis `Redis`, never a `Cluster`. */
function single(client: RedisClient): Redis {
  if (client instanceof Cluster) throw new Error('expected a single-server client, got a Cluster');
  return client;
}
const servers: Server[] = [];
const sockets: Socket[] = [];

afterEach(async () => {
  for (const client of clients.splice(0)) client.disconnect();
  for (const socket of sockets.splice(0)) socket.destroy();
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

function failFastClient(port: number, options: Parameters<typeof createRedis>[1] = {}): Redis {
  const client = single(createRedis(`redis://127.0.0.1:${port}`, { ...FAIL_FAST_REDIS_OPTIONS, ...options }));
  client.on('error', () => undefined);
  clients.push(client);
  return client;
}

const rejection = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (error: unknown) => error,
  );

describe('what counts as Redis being unavailable', () => {
  it('recognises what ioredis rejects with when nothing listens', async () => {
    const client = failFastClient(await getPort({ host: '127.0.0.1' }));
    const error = await rejection(client.get('k'));
    expect(error).toBeInstanceOf(Error);
    expect(isRedisUnavailableError(error)).toBe(true);
  });

  it('recognises a command that got no answer in time', async () => {
    // Accepts connections and never answers: a Redis host that hangs.
    const server = createServer((socket) => {
      sockets.push(socket);
      socket.on('error', () => undefined);
    });
    servers.push(server);
    const port = await getPort({ host: '127.0.0.1' });
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
    const client = failFastClient(port, { enableReadyCheck: false, commandTimeout: 100 });
    const error = await rejection(client.get('k'));
    expect((error as Error).message).toMatch(/timed out/);
    expect(isRedisUnavailableError(error)).toBe(true);
  });

  it('recognises a connection that was closed', async () => {
    const client = failFastClient(await getPort({ host: '127.0.0.1' }), { lazyConnect: true });
    client.disconnect();
    expect(isRedisUnavailableError(await rejection(client.get('k')))).toBe(true);
  });

  it('recognises what a cluster answers during a failover (PROTOCOL.md §10.10)', () => {
    const failover = [
      new Error('Too many Cluster redirections. Last error: Error: Connection is closed.'),
      new ReplyError('CLUSTERDOWN The cluster is down'),
      new ReplyError('TRYAGAIN Multiple keys request during rehashing of slot'),
      new ReplyError('MOVED 3999 127.0.0.1:6381'),
      new ReplyError('ASK 3999 127.0.0.1:6381'),
      new ReplyError("READONLY You can't write against a read only replica."),
      new ReplyError('UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)'),
      new ReplyError('MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to no'),
      new Error('Connection is closed.'),
      new Error('Node is disconnected'),
      new Error('Cluster is disconnected.'),
      new Error('Failed to refresh slots cache.'),
      new Error('None of startup nodes is available'),
    ];
    for (const error of failover) expect(isRedisUnavailableError(error), error.message).toBe(true);
    // An answer that merely mentions one of the words is still Redis's answer.
    expect(isRedisUnavailableError(new ReplyError('ERR unknown command MOVED'))).toBe(false);
    expect(isRedisUnavailableError(new ReplyError('NOSCRIPT No matching script'))).toBe(false);
  });

  it('looks through causes and aggregates, and says no to errors Redis answered with', () => {
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
    expect(isRedisUnavailableError(new Error('Could not enqueue the job', { cause: refused }))).toBe(true);
    expect(isRedisUnavailableError(new AggregateError([new Error('x'), refused]))).toBe(true);
    expect(isRedisUnavailableError(new TaskrelayError('REDIS_UNAVAILABLE', 'down'))).toBe(true);

    expect(isRedisUnavailableError(new ReplyError('ERR wrong number of arguments'))).toBe(false);
    expect(isRedisUnavailableError(new TaskrelayError('TASK_NOT_FOUND', 'Task not found: x'))).toBe(false);
    expect(isRedisUnavailableError(new Error('boom'))).toBe(false);
    expect(isRedisUnavailableError('Connection is closed')).toBe(false);
    expect(isRedisUnavailableError(undefined)).toBe(false);
  });
});

describe('Redis targets (standalone, TLS, Cluster, Sentinel)', () => {
  it('makes a TLS client for rediss://', () => {
    const client = single(createRedis('rediss://127.0.0.1:6380/1', { lazyConnect: true }));
    clients.push(client);
    expect(client.options.tls).toBeDefined();
    expect(client.options).toMatchObject({ host: '127.0.0.1', port: 6380, db: 1 });
  });

  it('makes a Cluster client for redis+cluster://, with per-node options on every node', () => {
    const client = createRedis('redis+cluster://127.0.0.1:7000,127.0.0.1:7001', {
      lazyConnect: true,
      connectionName: 'x',
      ...FAIL_FAST_REDIS_OPTIONS,
    });
    clients.push(client);
    expect(client).toBeInstanceOf(Cluster);
    const cluster = client as Cluster;
    expect(cluster.options.redisOptions).toMatchObject({ connectionName: 'x', commandTimeout: 2_000 });
    expect(cluster.options.clusterRetryStrategy?.(3, new Error('x'))).toBe(150);
  });

  it('makes a Sentinel client for redis+sentinel://', () => {
    const client = single(createRedis('redis+sentinel://127.0.0.1:26379,[::1]:26380/mymaster', { lazyConnect: true }));
    clients.push(client);
    expect(client.options).toMatchObject({
      name: 'mymaster',
      sentinels: [
        { host: '127.0.0.1', port: 26379 },
        { host: '::1', port: 26380 },
      ],
    });
  });

  it('refuses anything else with one line', () => {
    expect(() => createRedis('http://127.0.0.1:1')).toThrow(/^Invalid Redis target: must be redis:\/\//);
    expect(() => parseRedisTarget('redis+sentinel://h:1')).toThrow(/needs \/<master name>/);
    expect(() => parseRedisTarget('redis+cluster://nope')).toThrow(/a cluster node must be host:port/);
  });

  it('reports an unreachable cluster as Redis unavailable, naming the seed nodes', async () => {
    const port = await getPort({ host: '127.0.0.1' });
    const client = createRedis(`redis+cluster://127.0.0.1:${port}`, { retryStrategy: () => null });
    client.on('error', () => undefined);
    clients.push(client);
    const error = await rejection(waitForRedis(client, 1_000));
    expect(isRedisUnavailableError(error)).toBe(true);
    expect((error as Error).message).toMatch(new RegExp(`cluster 127\\.0\\.0\\.1:${port}`));
  });
});

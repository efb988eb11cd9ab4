/**
 * A real Redis Cluster for the cluster suites: `redis-server --cluster-enabled yes` on free loopback ports (each with
 * its bus port, +10000, free too), joined by `redis-cli --cluster create --cluster-yes`, no replicas. Ends only the
 * servers it started, by PID.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import { waitFor } from './wait-for.js';

export interface TestCluster {
  /** `host:port` of every master, for REDIS_CLUSTER_NODES. */
  nodes: string[];
  ports: number[];
  /** A client of one node (not cluster-aware: for CLUSTER and KEYS commands on that node). */
  node(port: number): Redis;
  stop(): Promise<void>;
}

/** A port whose cluster bus port (+10000) is free too. */
async function clusterPort(taken: Set<number>): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const port = await getPort({
      host: '127.0.0.1',
      port: Array.from({ length: 200 }, (_, k) => 20_000 + Math.floor(Math.random() * 20_000) + k),
    });
    if (taken.has(port) || port + 10_000 > 65_535) continue;
    if ((await getPort({ host: '127.0.0.1', port: port + 10_000 })) !== port + 10_000) continue;
    taken.add(port);
    return port;
  }
  throw new Error('no free port pair for a cluster node');
}

export async function startRedisCluster(masters = 3): Promise<TestCluster> {
  if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status !== 0) {
    throw new Error('the cluster suites need redis-server and redis-cli on PATH (apt-get install redis-server)');
  }
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-cluster-'));
  const taken = new Set<number>();
  const ports: number[] = [];
  for (let i = 0; i < masters; i++) ports.push(await clusterPort(taken));
  const servers: ChildProcess[] = ports.map((port) =>
    spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        join(dir, `nodes-${port}.conf`),
        '--cluster-node-timeout',
        '5000',
        '--dir',
        dir,
        '--save',
        '',
        '--appendonly',
        'no',
        '--dbfilename',
        `dump-${port}.rdb`,
      ],
      { stdio: 'ignore' },
    ),
  );
  const clients = new Map<number, Redis>();
  const node = (port: number): Redis => {
    let client = clients.get(port);
    if (!client) {
      client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1, lazyConnect: false });
      client.on('error', () => undefined);
      clients.set(port, client);
    }
    return client;
  };
  const stop = async () => {
    for (const client of clients.values()) client.disconnect();
    await Promise.all(
      servers.map(
        (server) =>
          new Promise<void>((resolve) => {
            if (server.exitCode !== null || server.signalCode !== null) return resolve();
            server.once('exit', () => resolve());
            server.kill('SIGKILL');
          }),
      ),
    );
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (const port of ports) {
      await waitFor(
        async () =>
          (await node(port)
            .ping()
            .catch(() => '')) === 'PONG',
        {
          timeoutMs: 10_000,
          message: `cluster node ${port} did not start`,
        },
      );
    }
    const created = spawnSync(
      'redis-cli',
      ['--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', '0', '--cluster-yes'],
      { encoding: 'utf8', timeout: 30_000 },
    );
    if (created.status !== 0) throw new Error(`redis-cli --cluster create failed:\n${created.stdout}${created.stderr}`);
    for (const port of ports) {
      await waitFor(async () => /cluster_state:ok/.test(String(await node(port).cluster('INFO'))), {
        timeoutMs: 20_000,
        message: `cluster node ${port} did not reach cluster_state:ok`,
      });
    }
  } catch (error) {
    await stop();
    throw error;
  }
  return { nodes: ports.map((p) => `127.0.0.1:${p}`), ports, node, stop };
}

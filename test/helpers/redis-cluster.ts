/**
 * A real Redis Cluster for the cluster suites: `redis-server --cluster-enabled yes` on free loopback ports (each with
 * its bus port, +10000, free too), joined by `redis-cli --cluster create --cluster-yes`, with `replicas` replicas per
 * master (none unless asked). Ends only the servers it started, by PID; `kill` SIGKILLs one of them (a failover test).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import type { MasterSlots } from '@taskrelay/shared';
import { waitFor } from './wait-for.js';

export interface TestCluster {
  /** `host:port` of every node (masters, then replicas when there are any), for REDIS_CLUSTER_NODES. */
  nodes: string[];
  ports: number[];
  /** A client of one node (not cluster-aware: for CLUSTER and KEYS commands on that node). */
  node(port: number): Redis;
  /** SIGKILLs one node and waits until it is gone. */
  kill(port: number): Promise<void>;
  /** The port of the master serving `slot` now, as node `via` sees it (CLUSTER SHARDS would need Redis 7 clients). */
  masterOf(slot: number, via?: number): Promise<number>;
  /** The ports of the replicas of master `port` now, as that master sees them. */
  replicasOf(port: number): Promise<number[]>;
  stop(): Promise<void>;
}

export interface ClusterOptions {
  /** Replicas per master (default 0). */
  replicas?: number;
  /** `cluster-node-timeout`: how long a node may not answer before it is failed over (default 5000 ms). */
  nodeTimeoutMs?: number;
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

export async function startRedisCluster(masters = 3, options: ClusterOptions = {}): Promise<TestCluster> {
  const replicas = options.replicas ?? 0;
  if (spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status !== 0) {
    throw new Error('the cluster suites need redis-server and redis-cli on PATH (apt-get install redis-server)');
  }
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-cluster-'));
  const taken = new Set<number>();
  const ports: number[] = [];
  for (let i = 0; i < masters * (1 + replicas); i++) ports.push(await clusterPort(taken));
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
        String(options.nodeTimeoutMs ?? 5000),
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
      [
        '--cluster',
        'create',
        ...ports.map((p) => `127.0.0.1:${p}`),
        '--cluster-replicas',
        String(replicas),
        '--cluster-yes',
      ],
      { encoding: 'utf8', timeout: 30_000 },
    );
    if (created.status !== 0) throw new Error(`redis-cli --cluster create failed:\n${created.stdout}${created.stderr}`);
    for (const port of ports) {
      await waitFor(async () => /cluster_state:ok/.test(String(await node(port).cluster('INFO'))), {
        timeoutMs: 20_000,
        message: `cluster node ${port} did not reach cluster_state:ok`,
      });
    }
    // A replica serves a failover only once it has synced with its master.
    for (const port of ports) {
      await waitFor(
        async () => {
          const info = await node(port).info('replication');
          return /role:master/.test(info) || /master_link_status:up/.test(info);
        },
        { timeoutMs: 20_000, message: `cluster replica ${port} did not sync with its master` },
      );
    }
  } catch (error) {
    await stop();
    throw error;
  }
  const byPort = new Map(ports.map((port, i) => [port, servers[i] as ChildProcess]));
  const kill = async (port: number) => {
    clients.get(port)?.disconnect();
    clients.delete(port);
    const server = byPort.get(port);
    if (!server || server.exitCode !== null || server.signalCode !== null) return;
    await new Promise<void>((resolve) => {
      server.once('exit', () => resolve());
      server.kill('SIGKILL');
    });
  };
  /** `CLUSTER NODES` of node `via`: one line per node, `<id> <ip:port@bus> <flags> <master id> …`. */
  const clusterNodes = async (via: number) =>
    String(await node(via).cluster('NODES'))
      .trim()
      .split('\n')
      .map((line) => line.split(' '))
      .map(([id = '', address = '', flags = '', master = '', , , , , ...slots]) => ({
        id,
        port: Number(address.split('@')[0]?.split(':')[1]),
        flags: flags.split(','),
        master,
        slots,
      }));
  const live = () => ports.find((p) => byPort.get(p)?.exitCode === null && byPort.get(p)?.signalCode === null);
  const masterOf = async (slot: number, via = live() ?? 0) => {
    for (const entry of await clusterNodes(via)) {
      if (!entry.flags.includes('master') || entry.flags.includes('fail')) continue;
      for (const range of entry.slots) {
        const [from, to = from] = range.split('-').map(Number);
        if (from !== undefined && to !== undefined && slot >= from && slot <= to) return entry.port;
      }
    }
    throw new Error(`no live master serves slot ${slot}`);
  };
  const replicasOf = async (port: number) => {
    const entries = await clusterNodes(port);
    const id = entries.find((e) => e.flags.includes('myself'))?.id;
    return entries.filter((e) => e.master === id && !e.flags.includes('fail')).map((e) => e.port);
  };
  return { nodes: ports.map((p) => `127.0.0.1:${p}`), ports, node, kill, masterOf, replicasOf, stop };
}

/** Each master's slot ranges, by its port, from the first node's `CLUSTER SLOTS` (for `masterOfSlot`). */
export async function clusterMasters(cluster: TestCluster): Promise<MasterSlots> {
  const reply = (await cluster.node(cluster.ports[0] ?? 0).cluster('SLOTS')) as unknown as Array<
    [number, number, [string, number]]
  >;
  const out: MasterSlots = new Map();
  for (const [from, to, [, port]] of reply) out.set(String(port), [...(out.get(String(port)) ?? []), [from, to]]);
  return out;
}

/** Commands (`only` that one) each node ran since its last reset, by port, from `INFO commandstats`. */
export async function commandsPerMaster(cluster: TestCluster, only?: string): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (const port of cluster.ports) {
    const info = await cluster.node(port).info('commandstats');
    let calls = 0;
    for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
      if (only === undefined || match[1] === only) calls += Number(match[2]);
    }
    out.set(port, calls);
  }
  return out;
}

/** Zeroes every node's command counts (`CONFIG RESETSTAT`). */
export async function resetCommandStats(cluster: TestCluster): Promise<void> {
  for (const port of cluster.ports) await cluster.node(port).config('RESETSTAT');
}

/**
 * One disposable test stack: a Redis, gateways, workers and SDK clients, started for a file and stopped after it.
 * Before it, each cross-process suite wrote the same Redis → gateway → workers → client setup and teardown itself.
 *
 *   const stack = useStack({ name: 'cancel', workers: [{ WORKER_CONCURRENCY: '1' }] });
 *   it('…', async () => { const client = await stack.client(); … stack.gateway.url … });
 *
 * `useStack` registers the file's `beforeAll` and `afterAll`; `startStack` is the same without them (for a test that
 * wants a stack of its own). Everything started here is stopped by `stop()`, in order: clients, then processes (by
 * PID), then an owned Redis.
 */
import { afterAll, beforeAll } from 'vitest';
import { Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { startRedis, uniquePrefix, type StartRedisOptions, type TestRedis } from './redis.js';
import { startRedisCluster, type ClusterOptions, type TestCluster } from './redis-cluster.js';
import {
  FIXTURE_TOOLS,
  connectClient,
  startGatewayProcess,
  startPythonWorkerProcess,
  startWorkerProcess,
  type ClientShape,
  type GatewayProcess,
  type ManagedProcess,
  type StartOptions,
} from './processes.js';

type Env = Record<string, string | undefined>;

export interface StackOptions {
  /** Names the key prefix (`uniquePrefix(name)`), so two files never share keys on the run's Redis. */
  name: string;
  /** What every process of the stack gets, besides REDIS_URL and TASKRELAY_PREFIX. */
  env?: Env;
  /** One entry per gateway, each its own extra environment. Default: one gateway. */
  gateways?: Env[];
  /** What every Node worker of the stack gets (its tools, lock, concurrency…), `addWorker`'s included. */
  workerEnv?: Env;
  /** One entry per worker, each its own extra environment (TASKRELAY_TOOLS, TASKRELAY_QUEUE…). Default: one demo worker. */
  workers?: Env[];
  /** One entry per Python worker (`python -m taskrelay_worker`; TASKRELAY_TOOLS names a .py file). Default: none. */
  pythonWorkers?: Env[];
  /** Authentication on: principal → bearer token, as every gateway's TASKRELAY_AUTH_TOKENS. Default: off. */
  tokens?: Record<string, string>;
  /** A Redis of the stack's own (`startRedis` options, e.g. `{ owned: true }` for a fault suite). Default: the run's. */
  redis?: StartRedisOptions;
  /**
   * A Redis Cluster of the stack's own instead (test/helpers/redis-cluster.ts: `masters`, default 3, and its options):
   * every process gets REDIS_CLUSTER_NODES (every node a seed, so a process started after a master died still finds
   * the cluster) and the prefix in braces, `{…}`: the single layout. `braces: false` leaves them off: the sharded
   * layout (PROTOCOL.md §1.1).
   */
  cluster?: ClusterOptions & { masters?: number; braces?: boolean };
  /** Connects `mcp`, an SDK client of the first gateway, at start (with these headers when an object). */
  mcp?: boolean | Record<string, string>;
  /** `useStack`'s start hook's bound, when a stack needs more than vitest's (load-stretched) default. */
  hookTimeoutMs?: number;
  /** Readiness bounds of the processes (stretched by the load, test/helpers/load.ts). */
  ready?: StartOptions;
}

export interface TestStack {
  /** The stack's Redis (throws on a cluster stack: see `cluster`). */
  readonly redis: TestRedis;
  /** The stack's Redis Cluster (throws without the `cluster` option). */
  readonly cluster: TestCluster;
  readonly prefix: string;
  /** REDIS_URL, TASKRELAY_PREFIX and the stack's `env`: what another process of this stack needs. */
  readonly env: Env;
  readonly gateways: GatewayProcess[];
  /** The first gateway. */
  readonly gateway: GatewayProcess;
  readonly workers: ManagedProcess[];
  readonly pythonWorkers: ManagedProcess[];
  /** `{ authorization: 'Bearer …' }` of a principal of `tokens`. */
  auth(principal: string): Record<string, string>;
  /** A Redis connection to the stack's server, closed with the stack (throws on a cluster stack). */
  readonly r: Redis;
  /** The client `mcp: true` connected at start (throws without it). */
  readonly mcp: Client;
  /**
   * A connected SDK client of the first gateway (or `url`), closed with the stack; `shape` gives it other
   * capabilities or handlers set before it connects.
   */
  client(headers?: Record<string, string>, url?: string, shape?: ClientShape): Promise<Client>;
  /** Another gateway (with the stack's tokens), stopped with the stack. */
  addGateway(env?: Env): Promise<GatewayProcess>;
  /**
   * SIGKILLs a gateway (default: the first) and starts another with its environment behind the same address, in its
   * place in `gateways`.
   */
  restartGateway(gateway?: GatewayProcess): Promise<GatewayProcess>;
  addWorker(env?: Env): Promise<ManagedProcess>;
  addPythonWorker(env?: Env): Promise<ManagedProcess>;
  stop(): Promise<void>;
}

export async function startStack(options: StackOptions): Promise<TestStack> {
  const cluster = options.cluster ? await startRedisCluster(options.cluster.masters ?? 3, options.cluster) : undefined;
  const redis = cluster ? undefined : await startRedis(options.redis);
  const name = uniquePrefix(options.name);
  const prefix = cluster && options.cluster?.braces !== false ? `{${name}}` : name;
  const env: Env = cluster
    ? { ...options.env, REDIS_CLUSTER_NODES: cluster.nodes.join(','), TASKRELAY_PREFIX: prefix }
    : { ...options.env, REDIS_URL: redis?.url, TASKRELAY_PREFIX: prefix };
  const gatewayEnv: Env = options.tokens
    ? {
        TASKRELAY_AUTH_TOKENS: Object.entries(options.tokens)
          .map(([principal, token]) => `${principal}:${token}`)
          .join(','),
      }
    : {};
  const gateways: GatewayProcess[] = [];
  const workers: ManagedProcess[] = [];
  const pythonWorkers: ManagedProcess[] = [];
  const clients: Client[] = [];
  let mcp: Client | undefined;
  // An owned Redis (a durable one is owned too) is one a fault suite kills: there commands wait for the reconnect (as
  // faults.ts's testRedis).
  const owned = options.redis?.owned === true || options.redis?.appendOnly === true;
  const r = new Redis(redis?.url ?? '', { lazyConnect: true, maxRetriesPerRequest: owned ? null : 1 });
  if (owned) r.on('error', () => undefined);
  /** Each gateway's own environment, for its restart. */
  const gatewayEnvs = new Map<GatewayProcess, Env>();
  const startGateway = async (extra: Env) => {
    const gateway = await startGatewayProcess({ ...env, ...gatewayEnv, ...extra }, options.ready);
    gatewayEnvs.set(gateway, extra);
    return gateway;
  };
  const addGateway = async (extra: Env = {}) => {
    const gateway = await startGateway(extra);
    gateways.push(gateway);
    return gateway;
  };
  const addWorker = async (extra: Env = {}) => {
    const worker = await startWorkerProcess({ ...env, ...options.workerEnv, ...extra }, options.ready);
    workers.push(worker);
    return worker;
  };
  const addPythonWorker = async (extra: Env = {}) => {
    const worker = await startPythonWorkerProcess({ ...env, ...extra }, options.ready);
    pythonWorkers.push(worker);
    return worker;
  };
  const stack: TestStack = {
    get redis() {
      if (redis === undefined) throw new Error(`stack ${options.name} runs on a cluster (read stack.cluster)`);
      return redis;
    },
    get cluster() {
      if (cluster === undefined) throw new Error(`stack ${options.name} has no cluster (the cluster option)`);
      return cluster;
    },
    prefix,
    env,
    gateways,
    get gateway() {
      const first = gateways[0];
      if (first === undefined) throw new Error('this stack has no gateway');
      return first;
    },
    get mcp() {
      if (mcp === undefined) throw new Error(`stack ${options.name} connected no client (mcp: true)`);
      return mcp;
    },
    workers,
    pythonWorkers,
    get r() {
      if (cluster)
        throw new Error(`stack ${options.name} runs on a cluster: connect an ioredis Cluster to stack.cluster`);
      return r;
    },
    auth(principal) {
      const token = options.tokens?.[principal];
      if (token === undefined) throw new Error(`stack ${options.name} has no token for ${principal}`);
      return { authorization: `Bearer ${token}` };
    },
    async client(headers = {}, url, shape) {
      const client = await connectClient(url ?? stack.gateway.url, headers, shape);
      clients.push(client);
      return client;
    },
    addGateway,
    async restartGateway(gateway = stack.gateway) {
      const index = gateways.indexOf(gateway);
      if (index < 0) throw new Error(`stack ${options.name} did not start the gateway on port ${gateway.port}`);
      await gateway.kill('SIGKILL');
      const restarted = await startGateway({ ...gatewayEnvs.get(gateway), PORT: String(gateway.port) });
      gateways[index] = restarted;
      return restarted;
    },
    addWorker,
    addPythonWorker,
    async stop() {
      await Promise.allSettled(clients.map((c) => c.close()));
      await Promise.allSettled([...gateways, ...workers, ...pythonWorkers].map((p) => p.kill('SIGKILL')));
      r.disconnect();
      await (cluster ?? redis)?.stop();
    },
  };
  try {
    // Started at once, listed in the order given: `gateway` is the first one asked for, whichever was ready first.
    // Workers start once every gateway is ready, as the suites moved onto this helper started theirs.
    gateways.push(...(await settleAll((options.gateways ?? [{}]).map((extra) => startGateway(extra)))));
    const [startedWorkers, startedPythons] = await Promise.allSettled([
      settleAll(
        (options.workers ?? [{}]).map((extra) =>
          startWorkerProcess({ ...env, ...options.workerEnv, ...extra }, options.ready),
        ),
      ),
      settleAll(
        (options.pythonWorkers ?? []).map((extra) => startPythonWorkerProcess({ ...env, ...extra }, options.ready)),
      ),
    ]);
    if (startedWorkers.status === 'fulfilled') workers.push(...startedWorkers.value);
    if (startedPythons.status === 'fulfilled') pythonWorkers.push(...startedPythons.value);
    for (const group of [startedWorkers, startedPythons]) {
      if (group.status === 'rejected') throw group.reason;
    }
    if (options.mcp) mcp = await stack.client(options.mcp === true ? {} : options.mcp);
  } catch (error) {
    await stack.stop();
    throw error;
  }
  return stack;
}

/**
 * Like Promise.all, but waits for every start to settle, so a start that fails does not leave the others running
 * unseen: the started ones are stopped by PID.
 */
async function settleAll<T extends ManagedProcess>(starts: Array<Promise<T>>): Promise<T[]> {
  const settled = await Promise.allSettled(starts);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) {
    await Promise.allSettled(settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value.kill('SIGKILL')] : [])));
    throw failed.reason;
  }
  return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
}

/** `startStack` for the whole file: started in `beforeAll`, stopped in `afterAll`. Read its members inside tests. */
export function useStack(options: StackOptions): TestStack {
  let started: TestStack | undefined;
  beforeAll(async () => {
    started = await startStack(options);
  }, options.hookTimeoutMs);
  afterAll(async () => {
    await started?.stop();
  });
  return new Proxy({} as TestStack, {
    get(_target, property) {
      if (started === undefined) throw new Error(`stack ${options.name} is not started (read it inside a test)`);
      const value = started[property as keyof TestStack];
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(started) : value;
    },
  });
}

/** The test fixtures' worker (test/fixtures/tools.mjs), on a queue of its own beside the demo worker. */
export const FIXTURE_WORKER: Env = { TASKRELAY_TOOLS: FIXTURE_TOOLS, TASKRELAY_QUEUE: 'fixtures' };

/**
 * A real Redis for integration tests. Inside a vitest project that has the shared-Redis global setup
 * (`redis-global-setup.ts`: integration, e2e, browser, terminal), `startRedis()` hands out that run's one server, which
 * every file shares under its own key prefix. Otherwise, and always for `{ owned: true }`, the first of these that
 * applies:
 * 1. `TEST_REDIS_URL` or `REDIS_URL` if set (skipped for `{ owned: true }`: fault tests get a server of their own).
 * 2. a `redis-server` from PATH spawned on a free port (what CI uses). `TASKRELAY_TEST_NO_SPAWN=1` skips this step,
 *    to exercise step 3 on a machine that has both.
 * 3. testcontainers (`redis:7-alpine`), loaded lazily so runs that never get here pay nothing for it. `kill()` is
 *    `docker stop -t 0` (SIGTERM then SIGKILL at once, no save points configured) and removes the container;
 *    `restart()` starts a fresh container bound to the same host port. Like the spawned server, a restarted Redis is
 *    empty. Without a container runtime, step 3 fails with one error naming all three ways to get a Redis.
 *
 * `{ owned: true, appendOnly: true }` spawns a durable server instead (`--appendonly yes --appendfsync always`, so every
 * acknowledged write is on disk): `kill()` then `restart()` brings it back on the same port from the same data dir,
 * with everything it had acknowledged. It needs `redis-server` on PATH (a restarted container starts empty).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import type { StartedRedisContainer } from '@testcontainers/redis';
import { waitFor } from './wait-for.js';

export interface TestRedis {
  url: string;
  port: number;
  /** true when this helper owns the server (it can be stopped and restarted). */
  owned: boolean;
  stop(): Promise<void>;
  /**
   * Kill the server without cleanup (SIGKILL; a container: `docker stop -t 0`); `restart()` brings it back on the same
   * port: empty, or with everything acknowledged when started with `appendOnly`.
   */
  kill(): Promise<void>;
  restart(): Promise<void>;
}

function hasRedisServer(): boolean {
  return spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status === 0;
}

async function ping(url: string): Promise<boolean> {
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

export interface StartRedisOptions {
  /** A server of this file's own (never `TEST_REDIS_URL`/`REDIS_URL`): it may be killed and restarted. */
  owned?: boolean;
  /** Durable across `kill()`/`restart()`: AOF with fsync on every write, same port and data dir. Implies `owned`. */
  appendOnly?: boolean;
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** The URL of the run's one shared Redis, provided by `redis-global-setup.ts`. */
    redisUrl?: string;
  }
}

/** The run's shared Redis, when this file runs in a vitest project whose global setup started one. */
async function sharedRedisUrl(): Promise<string | undefined> {
  // bench/ imports this module outside vitest, where `inject` has no worker state to read.
  if (process.env['VITEST'] === undefined) return undefined;
  const { inject } = await import('vitest');
  return inject('redisUrl');
}

/**
 * A Redis for one test file: the run's shared server (never stopped by `stop()`), or one of its own with
 * `{ owned: true }`.
 */
export async function startRedis(options: StartRedisOptions = {}): Promise<TestRedis> {
  if (process.env['TASKRELAY_TEST_PROJECT'] === 'unit') {
    throw new Error(
      'unit tests run without Redis: a test file that needs one is an integration test (name it *.integration.test.ts)',
    );
  }
  const shared = options.owned || options.appendOnly ? undefined : await sharedRedisUrl();
  return startRedisServer(options, shared);
}

/**
 * The Redis of `startRedis`, without the shared server: what the global setup itself starts. `external` (or
 * `TEST_REDIS_URL` / `REDIS_URL`) is used as is unless the caller wants a server of its own.
 */
export async function startRedisServer(options: StartRedisOptions = {}, external?: string): Promise<TestRedis> {
  external ??= process.env['TEST_REDIS_URL'] ?? process.env['REDIS_URL'];
  if (external && !options.owned && !options.appendOnly) {
    const port = Number(new URL(external).port || 6379);
    return {
      url: external,
      port,
      owned: false,
      stop: async () => undefined,
      kill: async () => {
        throw new Error('cannot kill an external Redis (unset TEST_REDIS_URL and REDIS_URL)');
      },
      restart: async () => undefined,
    };
  }
  if (process.env['TASKRELAY_TEST_NO_SPAWN'] === '1' || !hasRedisServer()) {
    if (options.appendOnly) {
      throw new Error('startRedis({ appendOnly: true }) needs redis-server on PATH (apt-get install redis-server)');
    }
    return startContainer();
  }
  const port = await getPort({ host: '127.0.0.1' });
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-redis-'));
  let child: ChildProcess | undefined;
  const url = `redis://127.0.0.1:${port}`;
  const persistence = options.appendOnly ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no'];
  const launch = async () => {
    child = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', ...persistence, '--dir', dir],
      {
        stdio: 'ignore',
      },
    );
    await waitFor(() => ping(url), { timeoutMs: 10_000, message: `redis-server on port ${port} did not start` });
  };
  const killChild = async (signal: NodeJS.Signals) => {
    const c = child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    const exited = new Promise((resolve) => c.once('exit', resolve));
    c.kill(signal);
    await exited;
  };
  await launch();
  return {
    url,
    port,
    owned: true,
    stop: async () => {
      await killChild('SIGTERM');
      rmSync(dir, { recursive: true, force: true });
    },
    kill: () => killChild('SIGKILL'),
    restart: launch,
  };
}

const CONTAINER_IMAGE = 'redis:7-alpine';
// Same settings as the spawned server: nothing is persisted, so a restart comes back empty.
const CONTAINER_COMMAND = ['redis-server', '--save', '', '--appendonly', 'no'];
const NO_RUNTIME = 'Could not find a working container runtime strategy';

async function startContainer(): Promise<TestRedis> {
  let container: StartedRedisContainer | undefined;
  // The first start lets the runtime pick the host port; restarts bind that same port so `url` stays valid.
  let hostPort: number | undefined;
  const launch = async (): Promise<StartedRedisContainer> => {
    try {
      const { RedisContainer } = await import('@testcontainers/redis');
      const image = new RedisContainer(CONTAINER_IMAGE).withCommand(CONTAINER_COMMAND);
      if (hostPort !== undefined) image.withExposedPorts({ container: 6379, host: hostPort });
      container = await image.start();
      hostPort = container.getPort();
      return container;
    } catch (error) {
      if (error instanceof Error && error.message.includes(NO_RUNTIME)) {
        throw new Error(
          'Integration tests need a Redis: install redis-server (apt-get install redis-server / brew install redis), ' +
            'set TEST_REDIS_URL, or run a container runtime for testcontainers',
          { cause: error },
        );
      }
      throw error;
    }
  };
  const stopContainer = async () => {
    const c = container;
    container = undefined;
    await c?.stop({ timeout: 0 });
  };
  const started = await launch();
  return {
    url: `redis://${started.getHost()}:${started.getPort()}`,
    port: started.getPort(),
    owned: true,
    stop: stopContainer,
    kill: stopContainer,
    restart: async () => {
      await launch();
    },
  };
}

/** A fresh key prefix per test, so tests never see each other's keys and never need FLUSHALL. */
export function uniquePrefix(label = 't'): string {
  return `trtest-${label}-${randomBytes(4).toString('hex')}`;
}

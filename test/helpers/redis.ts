/**
 * A real Redis for integration tests (STYLE.md): `TEST_REDIS_URL` or `REDIS_URL` if set, else a `redis-server`
 * spawned on a free port. Fault tests pass `{ owned: true }` to always get a server of their own to kill and restart.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import { waitFor } from './wait-for.js';

export interface TestRedis {
  url: string;
  port: number;
  /** true when this helper owns the server (it can be stopped and restarted). */
  owned: boolean;
  stop(): Promise<void>;
  /** Kill the server (SIGKILL) without cleanup; `restart()` brings it back on the same port. */
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

export async function startRedis(options: { owned?: boolean } = {}): Promise<TestRedis> {
  const external = process.env['TEST_REDIS_URL'] ?? process.env['REDIS_URL'];
  if (external && !options.owned) {
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
  if (!hasRedisServer()) {
    throw new Error('Integration tests need redis-server on PATH (apt-get install redis-server) or TEST_REDIS_URL');
  }
  const port = await getPort({ host: '127.0.0.1' });
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-redis-'));
  let child: ChildProcess | undefined;
  const url = `redis://127.0.0.1:${port}`;
  const launch = async () => {
    child = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
      { stdio: 'ignore' },
    );
    await waitFor(() => ping(url), { timeoutMs: 10_000, message: `redis-server on port ${port} did not start` });
  };
  const killChild = async (signal: NodeJS.Signals) => {
    const c = child;
    if (!c || c.exitCode !== null) return;
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

/** A fresh key prefix per test, so tests never see each other's keys and never need FLUSHALL. */
export function uniquePrefix(label = 't'): string {
  return `trtest-${label}-${randomBytes(4).toString('hex')}`;
}

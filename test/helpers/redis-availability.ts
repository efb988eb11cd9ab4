/**
 * Whether this machine can give the integration projects a Redis, decided before any test starts (vitest.config.ts):
 * `TEST_REDIS_URL` / `REDIS_URL`, a `redis-server` on PATH, or a container runtime for testcontainers. Without any of
 * them, the projects that need Redis are left out of the run with one line saying why, instead of every file failing
 * on its own.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

/** Where Docker and Podman put their API socket; testcontainers finds a runtime through one of these or `DOCKER_HOST`. */
function containerRuntimeSockets(): string[] {
  const runtimeDir = process.env['XDG_RUNTIME_DIR'];
  return [
    '/var/run/docker.sock',
    join(homedir(), '.docker', 'run', 'docker.sock'),
    ...(runtimeDir ? [join(runtimeDir, 'docker.sock'), join(runtimeDir, 'podman', 'podman.sock')] : []),
  ];
}

/** How the tests will get a Redis, or undefined when they cannot. */
export function redisSource(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const url = env['TEST_REDIS_URL'] ?? env['REDIS_URL'];
  if (url) return url;
  if (env['TASKRELAY_TEST_NO_SPAWN'] !== '1') {
    const found = spawnSync('redis-server', ['--version'], { stdio: 'ignore', env });
    if (found.status === 0) return 'redis-server';
  }
  if (env['DOCKER_HOST'] || containerRuntimeSockets().some((path) => existsSync(path))) return 'testcontainers';
  return undefined;
}

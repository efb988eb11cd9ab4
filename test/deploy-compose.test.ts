/**
 * docker-compose.yml against the contract, offline (no container engine here or in CI): every service's command runs
 * a built entry point the image holds, its environment is what that process reads (docs/CONFIGURATION.md) with
 * values its config loader accepts; Redis is durable and health-checked; the gateway's healthcheck is /readyz;
 * workers scale. `docker-compose config -q` validates the file itself (.ci/run installs docker-compose 1.29).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { ROOT } from './helpers/processes.js';
import { envProblems, processOf } from './helpers/deploy-contract.js';

interface Service {
  image?: string;
  build?: string | { context: string; dockerfile?: string };
  command?: string[];
  environment?: Record<string, string>;
  ports?: string[];
  volumes?: string[];
  healthcheck?: { test: string[] };
  pull_policy?: string;
  container_name?: string;
  stop_grace_period?: string;
  profiles?: string[];
  depends_on?: Record<string, { condition: string }>;
}

const compose = parse(readFileSync(resolve(ROOT, 'docker-compose.yml'), 'utf8')) as {
  services: Record<string, Service>;
  volumes: Record<string, unknown>;
};
const dockerfile = readFileSync(resolve(ROOT, 'Dockerfile'), 'utf8');
const services = Object.entries(compose.services);
const hasCompose = spawnSync('docker-compose', ['version'], { stdio: 'ignore' }).status === 0;

/** The command a service runs: its own, or its image's CMD (the example project's Dockerfile). */
function commandOf(service: Service): string[] {
  if (service.command) return service.command;
  const context = typeof service.build === 'string' ? service.build : service.build?.context;
  if (!context) return [];
  const dockerfile = (typeof service.build === 'object' && service.build.dockerfile) || 'Dockerfile';
  const cmd = /^CMD (\[.*\])$/m.exec(readFileSync(resolve(ROOT, context, dockerfile), 'utf8'))?.[1];
  return cmd ? (JSON.parse(cmd) as string[]) : [];
}

/** A Redis Cluster node of the `cluster` profile. */
const isRedisNode = (name: string) => /^redis-node-\d+$/.test(name);

const seconds = (duration: string | undefined) => {
  const m = /^(\d+)s$/.exec(duration ?? '');
  return m ? Number(m[1]) : 0;
};

// Each `docker-compose config` starts a Python process: a few seconds on a loaded 2-core machine, where one run took
// 12 s and failed on the unit project's 10 s default.
describe('docker-compose.yml', { timeout: 60_000 }, () => {
  it.runIf(hasCompose)('is valid for docker-compose, with every profile', () => {
    const checked = spawnSync(
      'docker-compose',
      [
        '-f',
        'docker-compose.yml',
        '--profile',
        'custom',
        '--profile',
        'mounted',
        '--profile',
        'python',
        '--profile',
        'cluster',
        'config',
        '-q',
      ],
      { cwd: ROOT, encoding: 'utf8' },
    );
    expect(checked.stderr).toBe('');
    expect(checked.status).toBe(0);
  });

  it('runs Redis with AOF, noeviction, a healthcheck and a named volume', () => {
    const redis = compose.services['redis'];
    expect(redis?.command).toEqual(expect.arrayContaining(['--appendonly', 'yes']));
    expect(redis?.command?.join(' ')).toMatch(/--maxmemory-policy noeviction/);
    expect(redis?.healthcheck?.test).toEqual(expect.arrayContaining(['redis-cli', 'ping']));
    const volume = redis?.volumes?.[0]?.split(':')[0] ?? '';
    expect(Object.keys(compose.volumes)).toContain(volume);
  });

  it("gives every taskrelay service a built entry point, the contract's environment and Redis before it starts", () => {
    const problems: string[] = [];
    let runs = 0;
    for (const [name, service] of services) {
      if (name === 'redis' || name === 'redis-cluster-init' || isRedisNode(name)) continue;
      const command = commandOf(service);
      const kind = processOf(command);
      if (!kind) {
        problems.push(`${name}: command ${JSON.stringify(command)} runs no taskrelay entry point`);
        continue;
      }
      runs++;
      const script = command.find((c) => c.endsWith('main.js')) ?? '';
      // The stock image copies packages/<kind>/dist; the example image installs the package into node_modules; the
      // Python worker's image runs `python -m taskrelay_worker` from its virtualenv (test/deploy-python-image.test.ts).
      if (command.includes('taskrelay_worker')) {
        expect(command.slice(-2)).toEqual(['-m', 'taskrelay_worker']);
      } else if (script.startsWith('packages/')) {
        expect(existsSync(resolve(ROOT, script)), `${script} (run pnpm build)`).toBe(true);
        expect(dockerfile).toContain(`/app/packages/${kind}/dist packages/${kind}/dist`);
      } else {
        expect(script).toBe(`node_modules/@taskrelay/${kind}/dist/main.js`);
      }
      for (const p of envProblems(kind, service.environment ?? {})) problems.push(`${name}: ${p}`);
      if (service.profiles?.includes('cluster')) {
        // The cluster stack: seeds are cluster nodes of this file, and it starts once the cluster is made.
        const seeds = service.environment?.['REDIS_CLUSTER_NODES']?.split(',') ?? [];
        if (seeds.length === 0 || !seeds.every((seed) => isRedisNode(seed.split(':')[0] ?? ''))) {
          problems.push(`${name}: REDIS_CLUSTER_NODES`);
        }
        if (service.depends_on?.['redis-cluster-init']?.condition !== 'service_completed_successfully') {
          problems.push(`${name}: depends_on redis-cluster-init`);
        }
        continue;
      }
      if (!service.environment?.['REDIS_URL']?.startsWith('redis://redis:')) problems.push(`${name}: REDIS_URL`);
      if (service.depends_on?.['redis']?.condition !== 'service_healthy') problems.push(`${name}: depends_on redis`);
      const tools = service.environment?.['TASKRELAY_TOOLS'];
      if (tools) {
        const mount = service.volumes?.map((v) => v.split(':')).find(([, target]) => tools.startsWith(`${target}/`));
        if (!mount?.[0] || !existsSync(resolve(ROOT, mount[0], tools.slice((mount[1] ?? '').length + 1)))) {
          problems.push(`${name}: TASKRELAY_TOOLS ${tools} is not a mounted file`);
        }
      }
    }
    expect(problems).toEqual([]);
    expect(runs).toBeGreaterThanOrEqual(4);
  });

  it('runs a 3-master cluster with a replica each under the cluster profile, durable and health-checked', () => {
    const nodes = services.filter(([name]) => isRedisNode(name));
    expect(nodes).toHaveLength(6);
    for (const [name, node] of nodes) {
      expect(node.profiles, name).toEqual(['cluster']);
      const command = node.command?.join(' ') ?? '';
      expect(command, name).toMatch(/--cluster-enabled yes/);
      expect(command, name).toMatch(/--appendonly yes/);
      expect(command, name).toMatch(/--maxmemory-policy noeviction/);
      expect(node.healthcheck?.test, name).toEqual(expect.arrayContaining(['redis-cli', 'ping']));
      expect(Object.keys(compose.volumes), name).toContain(node.volumes?.[0]?.split(':')[0]);
      expect(node.ports, name).toBeUndefined();
    }
    const init = compose.services['redis-cluster-init'];
    expect(init?.profiles).toEqual(['cluster']);
    expect(init?.command?.join(' ')).toMatch(/redis-cli --cluster create \$\$addrs --cluster-replicas 1 --cluster-yes/);
    expect(Object.keys(init?.depends_on ?? {}).sort()).toEqual(nodes.map(([name]) => name).sort());
    // The stack on it: a gateway on its own loopback port and workers, seeded by the nodes, today's braced prefix.
    const gateway = compose.services['cluster-gateway'];
    expect(gateway?.ports).toEqual(['127.0.0.1:${TASKRELAY_CLUSTER_PORT:-3001}:3000']);
    expect(gateway?.environment?.['TASKRELAY_PREFIX']).toBe('{taskrelay}');
    expect(processOf(commandOf(compose.services['cluster-worker'] ?? {}))).toBe('worker');
  });

  it('health-checks the gateway on /readyz and publishes it on loopback only, on TASKRELAY_PORT (default 3000)', () => {
    const gateway = compose.services['gateway'];
    expect(gateway?.healthcheck?.test.join(' ')).toMatch(/\/readyz/);
    expect(gateway?.ports).toEqual(['127.0.0.1:${TASKRELAY_PORT:-3000}:3000']);
    expect(gateway?.environment?.['HOST']).toBe('0.0.0.0');
  });

  it.runIf(hasCompose)('publishes the gateway on the host port TASKRELAY_PORT names', () => {
    const rendered = spawnSync('docker-compose', ['-f', 'docker-compose.yml', 'config'], {
      cwd: ROOT,
      encoding: 'utf8',
      env: { ...process.env, TASKRELAY_PORT: '8123' },
    });
    expect(rendered.status).toBe(0);
    const gateway = (parse(rendered.stdout) as { services: Record<string, { ports?: unknown[] }> }).services['gateway'];
    expect(JSON.stringify(gateway?.ports)).toMatch(/8123/);
  });

  it('publishes Redis on the host only with the docker-compose.redis-port.yml override, on loopback', () => {
    expect(compose.services['redis']?.ports).toBeUndefined();
    const override = parse(readFileSync(resolve(ROOT, 'docker-compose.redis-port.yml'), 'utf8')) as {
      services: Record<string, Service>;
    };
    expect(Object.keys(override.services)).toEqual(['redis']);
    expect(override.services['redis']?.ports).toEqual(['127.0.0.1:${TASKRELAY_REDIS_PORT:-6379}:6379']);
  });

  it.runIf(hasCompose)('is valid with the Redis port override', () => {
    const checked = spawnSync(
      'docker-compose',
      ['-f', 'docker-compose.yml', '-f', 'docker-compose.redis-port.yml', 'config', '-q'],
      { cwd: ROOT, encoding: 'utf8' },
    );
    expect(checked.stderr).toBe('');
    expect(checked.status).toBe(0);
  });

  it('builds the stock image once: one service builds it, the others run it and never pull it', () => {
    const stock = services.filter(([, s]) => s.image === 'taskrelay:local');
    const builders = stock.filter(([, s]) => s.build !== undefined).map(([name]) => name);
    expect(builders).toEqual(['gateway']);
    for (const [name, service] of stock) {
      if (name !== 'gateway') expect(service.pull_policy, name).toBe('never');
    }
    // Every service built from the repository's own Dockerfile names the shared image.
    const fromRoot = services.filter(
      ([, s]) =>
        s.build === '.' || (typeof s.build === 'object' && s.build.context === '.' && s.build.dockerfile === undefined),
    );
    expect(fromRoot.map(([name]) => name)).toEqual(['gateway']);
  });

  it('lets workers scale (no fixed name or host port) and stop after their drain', () => {
    for (const [name, service] of services) {
      if (processOf(commandOf(service)) !== 'worker') continue;
      expect(service.container_name, name).toBeUndefined();
      expect(service.ports, name).toBeUndefined();
      // WORKER_SHUTDOWN_GRACE_MS (30 s) plus WORKER_ABORT_GRACE_MS (5 s) before Docker's SIGKILL.
      expect(seconds(service.stop_grace_period), name).toBeGreaterThanOrEqual(35);
    }
  });

  it('builds images in stages, with production dependencies only, running as a non-root user', () => {
    for (const file of [dockerfile, readFileSync(resolve(ROOT, 'examples/custom-worker/Dockerfile'), 'utf8')]) {
      expect(file.match(/^FROM /gm)?.length ?? 0).toBeGreaterThanOrEqual(2);
      expect(file).toMatch(/--prod\b|--omit=dev/);
      const runtime = file.slice(file.lastIndexOf('\nFROM '));
      expect(runtime).toMatch(/^USER node$/m);
    }
  });
});

/**
 * Issue 12, packages a user can depend on: `pnpm pack` of @taskrelay/worker and @taskrelay/shared installs into a
 * fresh project outside the workspace (examples/custom-worker, copied to a temp dir, the packages taken from the
 * tarballs and everything else from the pnpm store: offline where the store has it all), the project's own tests
 * pass, and its tool runs through a real gateway beside the demo worker without a misrouted call.
 */
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import {
  ROOT,
  connectClient,
  startGatewayProcess,
  startWorkerProcess,
  stopAll,
  type GatewayProcess,
  type ManagedProcess,
} from './helpers/processes.js';
import { waitFor } from './helpers/wait-for.js';

const EXAMPLE = resolve(ROOT, 'examples/custom-worker');
const INSTALL_TIMEOUT_MS = 180_000;

let scratch: string;
let project: string;
let redis: TestRedis;

function run(command: string, args: string[], cwd: string, timeoutMs = INSTALL_TIMEOUT_MS) {
  const result = spawnSync(command, args, {
    cwd,
    encoding: 'utf8',
    timeout: timeoutMs,
    env: { ...process.env, CI: 'true' },
  });
  // A command that could not start or was killed (timeout) printed nothing: say why instead of an empty reason.
  const why = result.error
    ? `${result.error.message}\n`
    : result.signal
      ? `killed by ${result.signal}${result.signal === 'SIGTERM' ? ` (timeout ${timeoutMs} ms?)` : ''}\n`
      : '';
  return { status: result.status, output: `${why}${result.stdout ?? ''}${result.stderr ?? ''}` };
}

/** Packs a workspace package into `dest` and returns the tarball's path. */
function pack(pkg: string, dest: string): string {
  const packed = run('pnpm', ['pack', '--pack-destination', dest], resolve(ROOT, 'packages', pkg));
  if (packed.status !== 0) throw new Error(`pnpm pack of ${pkg} failed:\n${packed.output}`);
  const name = readdirSync(dest).find((f) => f.startsWith(`taskrelay-${pkg}-`) && f.endsWith('.tgz'));
  if (!name) throw new Error(`no tarball for ${pkg} in ${dest}`);
  return join(dest, name);
}

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'taskrelay-pack-'));
  const tarballs = join(scratch, 'tarballs');
  const shared = pack('shared', tarballs);
  const worker = pack('worker', tarballs);

  project = join(scratch, 'my-tools');
  for (const entry of ['package.json', 'src', 'test'])
    cpSync(join(EXAMPLE, entry), join(project, entry), { recursive: true });
  // What a user does before the packages are on a registry: depend on the tarballs. The worker's own dependency on
  // @taskrelay/shared 0.x is pointed at its tarball too.
  const manifest = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')) as {
    dependencies: Record<string, string>;
  };
  manifest.dependencies['@taskrelay/worker'] = `file:${worker}`;
  manifest.dependencies['@taskrelay/shared'] = `file:${shared}`;
  writeFileSync(join(project, 'package.json'), JSON.stringify(manifest, null, 2));
  writeFileSync(
    join(project, 'pnpm-workspace.yaml'),
    `overrides:\n  '@taskrelay/shared': 'file:${shared}'\nallowBuilds:\n  msgpackr-extract: true\n`,
  );
  // Offline from the store when it holds everything (it does after the workspace's install); else the registry.
  let installed = run('pnpm', ['install', '--offline'], project);
  if (installed.status !== 0) installed = run('pnpm', ['install', '--prefer-offline'], project);
  if (installed.status !== 0) throw new Error(`pnpm install of the example failed:\n${installed.output}`);

  redis = await startRedis();
}, INSTALL_TIMEOUT_MS * 2);

afterAll(async () => {
  await stopAll();
  await redis?.stop();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe('the packed @taskrelay/worker in a project of its own', () => {
  it('ships built JavaScript, types and a worker bin, and no workspace: specifiers', () => {
    const installed = JSON.parse(
      readFileSync(join(project, 'node_modules/@taskrelay/worker/package.json'), 'utf8'),
    ) as { dependencies: Record<string, string>; types: string; bin: Record<string, string> };
    expect(Object.values(installed.dependencies).some((v) => v.startsWith('workspace:'))).toBe(false);
    expect(installed.dependencies['zod']).toBe('^4.0.0');
    for (const file of [installed.types, installed.bin['taskrelay-worker'] ?? 'missing']) {
      expect(readFileSync(join(project, 'node_modules/@taskrelay/worker', file), 'utf8').length).toBeGreaterThan(0);
    }
  });

  it("passes the example project's own tests", () => {
    const tested = run(process.execPath, ['--test', 'test/'], project, 60_000);
    expect(tested.output).toMatch(/# fail 0/);
    expect(tested.status).toBe(0);
  });

  describe("runs the project's tool beside the demo tools through a gateway", () => {
    let gateway: GatewayProcess;
    let client: Client;
    let custom: ManagedProcess;

    beforeAll(async () => {
      const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('pack') };
      gateway = await startGatewayProcess(env);
      // The installed package's entry point, run from the project: the user's tools module resolves its own
      // @taskrelay/worker and zod from the project's node_modules.
      const child = spawn(process.execPath, ['node_modules/@taskrelay/worker/dist/main.js'], {
        cwd: project,
        env: { ...process.env, ...env, LOG_LEVEL: 'info', TASKRELAY_TOOLS: './src/tools.js' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));
      custom = {
        child,
        pid: child.pid ?? -1,
        output: () => out,
        logs: () => [],
        kill: async (signal = 'SIGTERM') => {
          if (child.exitCode === null && child.signalCode === null) child.kill(signal);
          return exited;
        },
        exited,
      };
      await waitFor(
        () => {
          if (child.exitCode !== null) throw new Error(`example worker exited: ${out}`);
          return out.includes('"worker ready"');
        },
        { timeoutMs: 20_000, message: 'example worker did not become ready' },
      );
      await startWorkerProcess(env);
      client = await connectClient(gateway.url);
    });

    afterAll(async () => {
      await client?.close();
      await custom?.kill();
    });

    it('lists count_to with the demo tools and answers every call of both, none misrouted', async () => {
      await waitFor(async () => {
        const names = (await client.listTools()).tools.map((t) => t.name);
        return names.includes('count_to') && names.includes('build_report');
      });
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          client.request(
            i % 2 === 0
              ? { method: 'tools/call', params: { name: 'count_to', arguments: { n: 3, delayMs: 0 } } }
              : {
                  method: 'tools/call',
                  params: { name: 'build_report', arguments: { report: 'r', items: 1, delayMs: 0 } },
                },
            CallToolResultSchema,
          ),
        ),
      );
      results.forEach((r, i) => {
        expect(r.isError ?? false).toBe(false);
        expect(r.structuredContent).toEqual(i % 2 === 0 ? { counted: 3 } : { report: 'r', items: 1 });
      });
    });
  });
});

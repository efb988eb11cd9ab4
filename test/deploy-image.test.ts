/**
 * The Dockerfile builds an image that runs, checked without a container engine (none here or in CI): every workspace
 * package is in its COPY set, and a replay of the file (test/helpers/dockerfile-replay.ts: the same files copied
 * into a scratch tree per stage, the same RUN commands run there, pnpm install and build included) leaves a final
 * stage from which the gateway and a worker start, with the image's own environment, and answer a tool call. The
 * stock image's mounted-tools path (TASKRELAY_TOOLS on a module outside /app, docker-compose's `mounted` profile)
 * and the CLI it ships run from it too.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ROOT } from './helpers/processes.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import { contextSources, parseDockerfile, replayDockerfile, type ReplayedImage } from './helpers/dockerfile-replay.js';

const parsed = parseDockerfile(readFileSync(resolve(ROOT, 'Dockerfile'), 'utf8'));
const workspacePackages = readdirSync(resolve(ROOT, 'packages')).filter((name) =>
  existsSync(resolve(ROOT, 'packages', name, 'package.json')),
);

describe('the Dockerfile', () => {
  it('copies every workspace package in: its manifest before the install, its sources before the build', () => {
    const copied = new Set(contextSources(parsed).map((s) => s.replace(/\/$/, '')));
    const missing = workspacePackages.flatMap((name) =>
      [`packages/${name}/package.json`, `packages/${name}`].filter((path) => !copied.has(path)),
    );
    expect(missing).toEqual([]);
  });

  it("puts every package's built dist into the runtime stage", () => {
    const runtime = parsed.stages.at(-1);
    const fromBuild = new Set(
      (runtime?.steps ?? []).flatMap((s) => (s.kind === 'copy' && s.from !== undefined ? s.sources : [])),
    );
    const missing = workspacePackages.filter((name) => !fromBuild.has(`/app/packages/${name}/dist`));
    expect(missing).toEqual([]);
  });
});

describe('a replay of the Dockerfile', () => {
  let scratch: string;
  let image: ReplayedImage;
  let redis: TestRedis;
  const children: ChildProcess[] = [];

  /** Runs `argv` (node plus a script, as the image's CMD or compose's `command`) inside the replayed image. */
  function run(argv: string[], env: Record<string, string>) {
    const [command = 'node', ...args] = argv;
    // The image's environment, not this test's: only PATH (for the host's node) comes from outside.
    const child = spawn(command === 'node' ? process.execPath : command, args, {
      cwd: image.workdir,
      env: { PATH: `${dirname(process.execPath)}:/usr/bin:/bin`, ...image.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(child);
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
    return { child, output: () => out };
  }

  beforeAll(async () => {
    scratch = mkdtempSync(join(tmpdir(), 'taskrelay-image-'));
    image = replayDockerfile({ context: ROOT, scratch });
    redis = await startRedis();
  }, 600_000);

  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await redis?.stop();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  it("starts the image's gateway and worker, which answer a tool call; the shipped CLI and a mounted tools module work", async () => {
    const port = await getPort({ host: '127.0.0.1' });
    const env = {
      REDIS_URL: redis.url,
      TASKRELAY_PREFIX: uniquePrefix('image'),
      HOST: '127.0.0.1',
      PORT: String(port),
    };
    const gateway = run(image.cmd, env);
    const worker = run(['node', 'packages/worker/dist/main.js'], env);
    // docker-compose's `mounted` profile: a tools module on /tools, importing '@taskrelay/worker' and 'zod' from the
    // image (the /node_modules links its last RUN makes).
    cpSync(resolve(ROOT, 'examples/custom-worker/src'), join(image.root, 'tools'), { recursive: true });
    const mounted = run(['node', 'packages/worker/dist/main.js'], {
      ...env,
      TASKRELAY_TOOLS: join(image.root, 'tools/tools.js'),
    });
    const base = `http://127.0.0.1:${port}`;
    await waitFor(
      async () => {
        for (const p of [gateway, worker, mounted]) {
          if (p.child.exitCode !== null) throw new Error(`a process of the image exited:\n${p.output()}`);
        }
        const ready = await fetch(`${base}/readyz`).catch(() => undefined);
        return ready?.status === 200 && [worker, mounted].every((w) => w.output().includes('"worker ready"'));
      },
      { timeoutMs: 30_000, message: 'the image did not start' },
    );

    const client = new Client({ name: 'image-test', version: '0.0.0' });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`)));
    try {
      await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'count_to'), {
        timeoutMs: 15_000,
        message: 'the mounted tool was not listed',
      });
      const report = await client.callTool({ name: 'build_report', arguments: { report: 'image', items: 2 } });
      expect(report.structuredContent).toEqual({ report: 'image', items: 2 });
      const counted = await client.callTool({ name: 'count_to', arguments: { n: 2, delayMs: 0 } });
      expect(counted.structuredContent).toEqual({ counted: 2 });
    } finally {
      await client.close();
    }

    const cli = spawnSync(process.execPath, ['packages/cli/dist/main.js', 'tools', '--url', `${base}/mcp`], {
      cwd: image.workdir,
      encoding: 'utf8',
      env: { PATH: process.env['PATH'] ?? '', ...image.env },
    });
    expect(cli.stderr).toBe('');
    expect(cli.stdout).toMatch(/build_report/);
  }, 90_000);
});

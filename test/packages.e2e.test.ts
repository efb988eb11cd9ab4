/**
 * Issue 49 item 1: the packages a user installs, installed the way a user would, outside the workspace.
 * `node scripts/pack.mjs` packs the four npm packages and the Python wheel (CONTRACT §14); then, in fresh folders
 * under the OS temp directory:
 * - a Node project `npm install`s the tarballs, and its `taskrelay-gateway` and `taskrelay-worker` (the demo tools)
 *   start from its node_modules;
 * - a Python venv `pip install`s the wheel (whose build hook made the scripts and manifest inside it), and its
 *   `taskrelay-worker` serves a tool of its own; the gateway's protocol generation is its own (the worker refuses to
 *   start otherwise);
 * - `npm i -g` of the packed CLI into a temp prefix gives a `taskrelay` that calls a tool from each worker;
 * - examples/custom-worker's image, replayed from its Dockerfile with the packed tarballs in its context
 *   (test/helpers/dockerfile-replay.ts), serves its `count_to` tool.
 * Nothing here resolves a module from the workspace: every process runs from the installed copies.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { execFile } from 'node:child_process';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { replayDockerfile, type ReplayedImage } from './helpers/dockerfile-replay.js';
import { scaled } from './helpers/load.js';
import { PYTHON, ROOT } from './helpers/processes.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';

const run = promisify(execFile);
/** The host's Python for the fresh venv (the repository's .venv only tells that Python 3.11+ is here). */
const HOST_PYTHON = 'python3';
/** npm's cache on this machine: the replayed image's `npm install` reads it, as a builder with a warm layer would. */
const NPM_CACHE = spawnSync('npm', ['config', 'get', 'cache'], { encoding: 'utf8' }).stdout.trim();

/** A Python tool of the user's own, in a folder of its own. */
const PY_TOOL = `from taskrelay_worker import tool


@tool(name="py_echo", description="Says back what it was given.", input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
async def py_echo(args, ctx):
    await ctx.progress(1, 1, "echoed")
    return {"echo": args["text"], "attempt": ctx.attempt}
`;

interface Proc {
  child: ChildProcess;
  output: () => string;
}

describe.skipIf(PYTHON === undefined)('the packed packages, installed outside the workspace', () => {
  let scratch: string;
  let packed: string[];
  let redis: TestRedis;
  const procs: Proc[] = [];
  let env: Record<string, string>;
  let url: string;
  let cliBin: string;
  let image: ReplayedImage;

  function start(command: string, args: string[], cwd: string, extra: Record<string, string> = {}): Proc {
    // Only PATH (the host's node and python) comes from this process; the rest is what a user would set.
    const child = spawn(command, args, {
      cwd,
      env: { PATH: `${dirname(process.execPath)}:/usr/bin:/bin`, HOME: scratch, ...env, ...extra },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
    const proc = { child, output: () => out };
    procs.push(proc);
    return proc;
  }

  function cli(args: string[]) {
    return spawnSync(cliBin, [...args, '--url', url], {
      encoding: 'utf8',
      env: { PATH: `${dirname(process.execPath)}:/usr/bin:/bin`, HOME: scratch },
      timeout: scaled(60_000),
    });
  }

  beforeAll(async () => {
    // The replay below shares this machine's npm cache: a Dockerfile that empties it must not run here.
    expect(readFileSync(join(ROOT, 'examples/custom-worker/Dockerfile'), 'utf8')).not.toMatch(/npm cache clean/);
    scratch = mkdtempSync(join(tmpdir(), 'taskrelay-packages-'));
    const out = join(scratch, 'packed');
    // --no-build: vitest's bootstrap built, and other suites may be reading dist/ now.
    const packStart = Date.now();
    const packing = spawnSync(process.execPath, ['scripts/pack.mjs', '--no-build', '--out', out], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    if (packing.status !== 0) throw new Error(`scripts/pack.mjs failed:\n${packing.stderr}`);
    const packMs = Date.now() - packStart;
    packed = readdirSync(out).map((f) => join(out, f));
    const tarballs = packed.filter((f) => f.endsWith('.tgz'));
    const wheel = packed.find((f) => f.endsWith('.whl')) ?? '';
    const npmFlags = ['--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'];

    const app = join(scratch, 'app');
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
    const venv = join(scratch, 'venv');
    const prefix = join(scratch, 'prefix');
    const custom = join(scratch, 'custom-worker');
    cpSync(join(ROOT, 'examples/custom-worker'), custom, {
      recursive: true,
      filter: (path) => !/node_modules|packed/.test(path.slice(ROOT.length)),
    });
    mkdirSync(join(custom, 'packed'));
    for (const file of tarballs) cpSync(file, join(custom, 'packed', file.slice(out.length + 1)));
    // The installs at once: each mostly waits on the registry or its cache. The replay is synchronous, so it runs
    // while the three child processes go on, and the Python side is one shell for the same reason.
    const t0 = Date.now();
    const installs = Promise.all([
      run('npm', ['install', ...npmFlags, ...tarballs], { cwd: app }),
      run('npm', ['install', '-g', ...npmFlags, '--prefix', prefix, tarballs.find((f) => f.includes('-cli-')) ?? ''], {
        cwd: scratch,
      }),
      run('sh', [
        '-c',
        '"$0" -m venv "$1" && "$1/bin/pip" install --quiet --disable-pip-version-check "$2"',
        HOST_PYTHON,
        venv,
        wheel,
      ]),
    ]);
    image = replayDockerfile({ context: custom, scratch: join(scratch, 'image'), npmCache: NPM_CACHE });
    const replayed = Date.now() - t0;
    await installs;
    console.log(`packed in ${packMs} ms; image replayed in ${replayed} ms; all installed in ${Date.now() - t0} ms`);
    cliBin = join(prefix, 'bin/taskrelay');

    redis = await startRedis();
    const port = await getPort({ host: '127.0.0.1' });
    url = `http://127.0.0.1:${port}/mcp`;
    env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('packed'), HOST: '127.0.0.1', PORT: String(port) };
    const tools = join(scratch, 'tools');
    mkdirSync(tools);
    writeFileSync(join(tools, 'py_tools.py'), PY_TOOL);
    const gateway = start(join(app, 'node_modules/.bin/taskrelay-gateway'), [], app);
    const worker = start(join(app, 'node_modules/.bin/taskrelay-worker'), [], app);
    // The image's own command, environment and working folder (its absolute paths are inside the replayed root).
    const [command = 'node', ...args] = image.cmd;
    const imageWorker = start(command === 'node' ? process.execPath : command, args, image.workdir, {
      ...image.env,
      TASKRELAY_TOOLS: join(image.root, image.env['TASKRELAY_TOOLS'] ?? ''),
    });
    await waitFor(async () => (await fetch(url.replace('/mcp', '/readyz')).catch(() => undefined))?.status === 200, {
      timeoutMs: scaled(30_000),
      message: `the packed gateway did not start:\n${gateway.output()}`,
    });
    // After the gateway: it records its scripts generation, which the Python worker checks against its own.
    const pyWorker = start(join(venv, 'bin/taskrelay-worker'), [], tools, { TASKRELAY_TOOLS: 'py_tools.py' });
    await waitFor(
      () => {
        for (const p of [gateway, worker, imageWorker, pyWorker]) {
          if (p.child.exitCode !== null) throw new Error(`an installed process exited:\n${p.output()}`);
        }
        return [worker, imageWorker, pyWorker].every((p) => p.output().includes('worker ready'));
      },
      { timeoutMs: scaled(30_000), message: 'the installed workers did not start' },
    );
    console.log(`the installed processes were ready ${Date.now() - t0} ms after the installs began`);
  }, scaled(600_000));

  afterAll(async () => {
    for (const { child } of procs) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await redis?.stop();
    // Three node_modules and a venv: deleting them took over a minute under load, so it goes on after the suite.
    if (scratch) spawn('rm', ['-rf', scratch], { detached: true, stdio: 'ignore' }).unref();
  });

  it('packs the four npm packages and the wheel, whose build hook put the scripts and manifest inside it', () => {
    const names = packed.map((f) => f.slice(f.lastIndexOf('/') + 1).replace(/-\d+\.\d+\.\d+.*$/, ''));
    expect(names.sort()).toEqual([
      'taskrelay-cli',
      'taskrelay-gateway',
      'taskrelay-shared',
      'taskrelay-worker',
      'taskrelay_worker',
    ]);
    const wheel = packed.find((f) => f.endsWith('.whl')) ?? '';
    const listing = spawnSync(HOST_PYTHON, ['-m', 'zipfile', '-l', wheel], { encoding: 'utf8' }).stdout;
    expect(listing).toMatch(/taskrelay_worker\/_generated\/manifest\.json/);
    expect(listing).toMatch(/taskrelay_worker\/_generated\/startRun-3\.lua/);
  });

  it('the globally installed taskrelay lists every tool and calls one on each installed worker', () => {
    const tools = cli(['tools']);
    expect(tools.stderr).toBe('');
    for (const name of ['build_report', 'py_echo', 'count_to']) expect(tools.stdout).toContain(name);

    const node = cli(['call', 'build_report', 'report=packed', 'items=2', '--task', '--json']);
    expect(node.status, node.stderr).toBe(0);
    expect(node.stdout).toContain('"report":"packed"');

    const python = cli(['call', 'py_echo', 'text=from the wheel', '--task', '--json']);
    expect(python.status, python.stderr).toBe(0);
    expect(python.stdout).toContain('"echo":"from the wheel"');

    const image = cli(['call', 'count_to', 'n=2', 'delayMs=0', '--json']);
    expect(image.status, image.stderr).toBe(0);
    expect(image.stdout).toContain('"counted":2');
  });
});

/**
 * `npm start` (scripts/start-stack.mjs) fails loudly when its port is taken, instead of announcing "taskrelay is
 * running" for whatever else answers there; and the lines it prints for a Python worker, pasted as printed, add one
 * to its stack (its private Redis is on a random port, which the docs cannot name).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import getPort from 'get-port';
import { PYTHON, ROOT } from './helpers/processes.js';
import { scaled } from './helpers/load.js';
import { waitFor } from './helpers/wait-for.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';

let redis: TestRedis;
let squatter: Server;

beforeAll(async () => {
  redis = await startRedis();
  // Something else on the port, that even answers /readyz with 200.
  squatter = createServer((_req, res) => res.end('{"status":"ready"}'));
  await new Promise<void>((done) => squatter.listen(0, '127.0.0.1', done));
});

afterAll(async () => {
  await new Promise((done) => squatter?.close(done));
  await redis?.stop();
});

describe('npm start', () => {
  it('exits 1 with one line naming the taken port, and never says it is running', async () => {
    const { port } = squatter.address() as AddressInfo;
    const child = spawn(process.execPath, [resolve(ROOT, 'scripts/start-stack.mjs')], {
      cwd: ROOT,
      env: {
        ...process.env,
        REDIS_URL: redis.url,
        TASKRELAY_PREFIX: uniquePrefix('start'),
        HOST: '127.0.0.1',
        PORT: String(port),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((done) => child.once('exit', done));
    expect(code).toBe(1);
    expect(out).toMatch(new RegExp(`127\\.0\\.0\\.1:${port} is already in use`));
    expect(out).not.toMatch(/taskrelay is running/);
  });
});

describe.skipIf(PYTHON === undefined)('npm start’s lines for a Python worker', () => {
  const started: ChildProcess[] = [];
  afterAll(async () => {
    for (const child of started.reverse()) {
      if (child.exitCode !== null || child.signalCode !== null) continue;
      const exited = new Promise((done) => child.once('exit', done));
      child.kill('SIGTERM');
      await exited;
    }
  });

  function spawnLogged(command: string, args: string[], env: NodeJS.ProcessEnv) {
    const child = spawn(command, args, { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    started.push(child);
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
    return { child, output: () => out };
  }

  it('pasted as printed, serve the example tool through the stack’s gateway, on its private Redis', async () => {
    const port = await getPort({ host: '127.0.0.1' });
    // No REDIS_URL: the stack starts its own Redis on a free port, as a newcomer's `npm start` does.
    const env: NodeJS.ProcessEnv = { ...process.env, HOST: '127.0.0.1', PORT: String(port), LOG_FORMAT: 'json' };
    delete env['REDIS_URL'];
    delete env['TASKRELAY_PREFIX'];
    const stack = spawnLogged(process.execPath, [resolve(ROOT, 'scripts/start-stack.mjs')], env);
    await waitFor(() => /Ctrl-C stops everything/.test(stack.output()), {
      timeoutMs: scaled(60_000),
      message: 'npm start did not print its banner',
    });
    const line = /^ {4}(REDIS_URL=\S+ .*\.venv\/bin\/taskrelay-worker)$/m.exec(stack.output())?.[1];
    expect(line, stack.output()).toBeDefined();
    // The line as a shell would run it: NAME=value words, then the command.
    const words = (line ?? '').split(' ');
    const assignments = Object.fromEntries(words.filter((w) => /^\w+=/.test(w)).map((w) => w.split(/=(.*)/, 2)));
    const command = words.filter((w) => !/^\w+=/.test(w));
    expect(assignments['REDIS_URL']).toMatch(/^redis:\/\/127\.0\.0\.1:\d+$/);
    const worker = spawnLogged(resolve(ROOT, command[0] ?? ''), command.slice(1), {
      PATH: process.env['PATH'],
      ...assignments,
    });
    await waitFor(
      () => {
        if (worker.child.exitCode !== null) throw new Error(`the pasted Python worker exited:\n${worker.output()}`);
        return worker.output().includes('worker ready');
      },
      {
        timeoutMs: scaled(30_000),
        message: 'the pasted Python worker did not start',
      },
    );
    const cli = /^ {4}npx (taskrelay --url \S+) call /m.exec(stack.output())?.[1]?.split(' ') ?? [];
    expect(cli[0]).toBe('taskrelay');
    const call = spawnSync(
      resolve(ROOT, 'node_modules/.bin/taskrelay'),
      [...cli.slice(1), 'call', 'train', 'epochs=2', 'samples=200', '--json'],
      { cwd: ROOT, encoding: 'utf8', timeout: scaled(60_000) },
    );
    expect(call.status, call.stderr).toBe(0);
    expect(call.stdout).toMatch(/"epochs":2/);
  });
});

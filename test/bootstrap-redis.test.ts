/**
 * `npm start` / `npm test` on a fresh machine (scripts/bootstrap.mjs): when there is no REDIS_URL and no
 * redis-server, bootstrap installs Redis with the platform's package manager, printing the exact command; it asks on
 * a terminal, goes ahead with --yes or CI=true, and stops with one line where it can do neither. Checked without
 * installing anything: stub apt-get / brew on a fake PATH record their arguments (and the install stub leaves a stub
 * redis-server behind, as the real one would).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { waitFor } from './helpers/wait-for.js';

const BOOTSTRAP = resolve(ROOT, 'scripts/bootstrap.mjs');
let dir: string;
let bin: string;
let calls: string;

const stub = (name: string, body = '') =>
  writeFileSync(join(bin, name), `#!/bin/sh\necho "${name} $*" >> "${calls}"\n${body}\nexit 0\n`, { mode: 0o755 });
/** The installing call leaves a redis-server behind, as the real package does. */
const installs = `case "$*" in *install*) printf '#!/bin/sh\\nexit 0\\n' > "${join('$STUB_BIN', 'redis-server')}"; /bin/chmod +x "$STUB_BIN/redis-server";; esac`;

function osRelease(id: string): string {
  const file = join(dir, `os-release-${id}`);
  writeFileSync(file, `NAME="${id}"\nID=${id}\n`);
  return file;
}

/** Runs bootstrap with only the stubs on PATH (so no real redis-server, apt-get or brew is found). */
function bootstrap(env: Record<string, string>, args: string[] = []) {
  const base: Record<string, string> = { PATH: bin, STUB_BIN: bin, HOME: dir };
  const ran = spawnSync(process.execPath, [BOOTSTRAP, ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    env: { ...base, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const recorded = existsSync(calls) ? readFileSync(calls, 'utf8').trim().split('\n') : [];
  return { status: ran.status, stderr: ran.stderr, calls: recorded };
}

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'taskrelay-bootstrap-'));
  bin = join(dir, 'bin');
  execFileSync('/bin/mkdir', [bin]);
  calls = join(dir, 'calls.log');
});

afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('bootstrap installs a missing redis-server', () => {
  it.runIf(process.getuid?.() === 0)('runs apt-get as root on Debian with CI=true, saying exactly what it runs', () => {
    stub('apt-get', installs);
    const run = bootstrap({ CI: 'true', TASKRELAY_BOOTSTRAP_OS_RELEASE: osRelease('debian') });
    expect(run.stderr).toContain(
      'installing it: apt-get update && apt-get install -y --no-install-recommends redis-server',
    );
    expect(run.calls).toEqual([
      'apt-get --version',
      'apt-get update',
      'apt-get install -y --no-install-recommends redis-server',
    ]);
    expect(run.status).toBe(0);
  });

  it.runIf(process.getuid?.() === 0)(
    'with --tests (npm test) installs what the suite drives besides Redis, in the same one install',
    () => {
      // The install leaves every program behind, as the real packages do.
      const leaves = `case "$*" in *install*) for p in redis-server tmux chromium docker-compose; do printf '#!/bin/sh\\nexit 0\\n' > "$STUB_BIN/$p"; /bin/chmod +x "$STUB_BIN/$p"; done;; esac`;
      stub('apt-get', leaves);
      const run = bootstrap({ CI: 'true', TASKRELAY_BOOTSTRAP_OS_RELEASE: osRelease('debian') }, ['--tests']);
      expect(run.stderr).toContain(
        'redis-server, tmux, chromium, docker-compose are missing; installing them: apt-get update && ' +
          'apt-get install -y --no-install-recommends redis-server tmux chromium docker-compose',
      );
      expect(run.status).toBe(0);
      // What is there already is not installed again: here only chromium is missing.
      for (const p of ['redis-server', 'tmux', 'docker-compose']) stub(p);
      rmSync(join(bin, 'chromium'));
      rmSync(calls);
      const again = bootstrap({ CI: 'true', TASKRELAY_BOOTSTRAP_OS_RELEASE: osRelease('debian') }, ['--tests']);
      expect(again.calls).toContain('apt-get install -y --no-install-recommends chromium');
      expect(again.status).toBe(0);
    },
  );

  it('with --tests finds each program the way it answers (tmux: -V, and it fails on --version), installing nothing', () => {
    for (const p of ['redis-server', 'chromium', 'docker-compose']) stub(p);
    writeFileSync(join(bin, 'tmux'), '#!/bin/sh\ncase "$1" in -V) exit 0;; *) exit 1;; esac\n', { mode: 0o755 });
    stub('apt-get');
    const run = bootstrap({ CI: 'true', TASKRELAY_BOOTSTRAP_OS_RELEASE: osRelease('debian') }, ['--tests']);
    expect(run.calls.filter((c) => c.startsWith('apt-get install'))).toEqual([]);
    expect(run.status).toBe(0);
  });

  it('runs brew install redis on macOS with --yes', () => {
    stub('brew', installs);
    const run = bootstrap({ TASKRELAY_BOOTSTRAP_PLATFORM: 'darwin' }, ['--yes']);
    expect(run.stderr).toContain('installing it: brew install redis');
    expect(run.calls).toEqual(['brew --version', 'brew install redis']);
    expect(run.status).toBe(0);
  });

  it('goes ahead when npm passes --yes (npm start --yes sets npm_config_yes)', () => {
    stub('brew', installs);
    const run = bootstrap({ TASKRELAY_BOOTSTRAP_PLATFORM: 'darwin', npm_config_yes: 'true' });
    expect(run.calls).toContain('brew install redis');
    expect(run.status).toBe(0);
  });

  it('off a terminal without --yes or CI, installs nothing and says in one line what to run', () => {
    stub('brew', installs);
    const run = bootstrap({ TASKRELAY_BOOTSTRAP_PLATFORM: 'darwin' });
    expect(run.status).toBe(1);
    expect(run.calls).toEqual(['brew --version']);
    expect(run.stderr.trim().split('\n')).toHaveLength(1);
    expect(run.stderr).toMatch(/redis-server is missing; to install it, run: brew install redis \(or rerun with --yes/);
  });

  it('stops with the one clear line where no package manager can serve, before building anything', () => {
    stub('apt-get', installs);
    const run = bootstrap({ CI: 'true', TASKRELAY_BOOTSTRAP_OS_RELEASE: osRelease('fedora') });
    expect(run.status).toBe(1);
    expect(run.calls).toEqual([]);
    expect(run.stderr.trim().split('\n')).toHaveLength(1);
    expect(run.stderr).toMatch(/^bootstrap: no REDIS_URL and no redis-server on PATH: install one/);
  });

  it('does nothing about Redis when REDIS_URL is set', () => {
    stub('brew', installs);
    const run = bootstrap({ TASKRELAY_BOOTSTRAP_PLATFORM: 'darwin', REDIS_URL: 'redis://127.0.0.1:1' });
    expect(run.calls).toEqual([]);
    expect(run.status).toBe(0);
  });

  it('with --no-redis (pnpm test:unit, whose project is Node only) neither asks for Redis nor installs it', () => {
    stub('brew', installs);
    const run = bootstrap({ TASKRELAY_BOOTSTRAP_PLATFORM: 'darwin' }, ['--no-redis']);
    expect(run.calls).toEqual([]);
    expect(run.stderr).not.toMatch(/redis/i);
    expect(run.status).toBe(0);
  });

  it('asks first on a terminal, and installs once the user says yes', async () => {
    stub('brew', installs);
    const socket = `bootstrap-${process.pid}`;
    const tmux = (...args: string[]) => execFileSync('tmux', ['-L', socket, ...args], { encoding: 'utf8' });
    const script = join(dir, 'run.sh');
    writeFileSync(
      script,
      `#!/bin/sh\nPATH='${bin}' STUB_BIN='${bin}' TASKRELAY_BOOTSTRAP_PLATFORM=darwin '${process.execPath}' '${BOOTSTRAP}'\necho "exit=$?"\nsleep 60\n`,
    );
    chmodSync(script, 0o755);
    try {
      tmux(
        'new-session',
        '-d',
        '-s',
        'ask',
        '-x',
        '160',
        '-y',
        '10',
        '-c',
        ROOT,
        `env -u CI -u REDIS_URL -u npm_config_yes ${script}`,
      );
      await waitFor(() => tmux('capture-pane', '-p', '-t', 'ask').includes('[Y/n]'), { timeoutMs: 15_000 });
      expect(tmux('capture-pane', '-p', '-t', 'ask')).toContain('Run `brew install redis` now? [Y/n]');
      expect(existsSync(calls) ? readFileSync(calls, 'utf8') : '').not.toContain('brew install');
      tmux('send-keys', '-t', 'ask', 'y', 'Enter');
      await waitFor(() => tmux('capture-pane', '-p', '-t', 'ask').includes('exit=0'), { timeoutMs: 15_000 });
      expect(readFileSync(calls, 'utf8')).toContain('brew install redis');
    } finally {
      tmux('kill-server');
    }
  });
});

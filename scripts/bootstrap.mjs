#!/usr/bin/env node
// Makes `npm test` / `npm start` / `pnpm bench` work on a machine that has only Node: first, when there is no
// REDIS_URL and no redis-server on PATH, installs Redis with the platform's package manager (apt-get on Debian/Ubuntu,
// as root or through sudo; brew on macOS), printing the exact command; on a terminal it asks first, with `--yes`
// (`npm start --yes`, `npm test --yes`) or CI=true it goes ahead, elsewhere it stops with one line saying what to run.
// With `--tests` (`npm test`) the same goes for what the suite drives besides Redis: tmux (the CLI's terminal test),
// chromium (the dashboard test) and docker-compose (the compose file's offline check), in the same one install.
// Then installs the workspace with the pinned pnpm when it was never installed, and rebuilds the packages whose
// `dist` is missing or older than their sources. With `--tests` (and `--python`: `pnpm bench`), when Python 3.11+ is on PATH, makes `.venv` and
// installs the Python worker into it (packages/worker-python, editable, with its test extra) for its pytest suite and
// the cross-language suite; without Python 3.11+ it says in one line that those are skipped. Prints nothing when
// there is nothing to do. Plain Node, no dependencies (it runs before any are installed).
//
// For tests only: TASKRELAY_BOOTSTRAP_PLATFORM stands for process.platform and TASKRELAY_BOOTSTRAP_OS_RELEASE for
// /etc/os-release, so the installer choice can be checked with stub package managers on a fake PATH.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline/promises';
import { fileURLToPath } from 'node:url';
import { build, PACKAGES, STEPS } from './build.mjs';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const isWindows = process.platform === 'win32';

function log(message) {
  process.stderr.write(`bootstrap: ${message}\n`);
}

function fail(message) {
  log(message);
  process.exit(1);
}

function run(command, args) {
  const result = spawnSync(command, args, { cwd: root, stdio: 'inherit', shell: isWindows });
  if (result.error) fail(`could not run ${command}: ${result.error.message}`);
  if (result.status !== 0) fail(`\`${[command, ...args].join(' ')}\` failed (exit ${result.status ?? result.signal})`);
}

/** The pnpm version pinned in package.json's `packageManager` (`pnpm@12.4.2`); a different pnpm refuses the lockfile. */
function pinnedPnpmVersion() {
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  const match = /^pnpm@(\d+\.\d+\.\d+)/.exec(manifest.packageManager ?? '');
  if (!match) fail('package.json has no "packageManager": "pnpm@x.y.z" field');
  return match[1];
}

function pnpmOnPath() {
  const result = spawnSync('pnpm', ['--version'], { cwd: root, encoding: 'utf8', shell: isWindows });
  return result.status === 0 ? result.stdout.trim() : undefined;
}

function install() {
  const pinned = pinnedPnpmVersion();
  const found = pnpmOnPath();
  if (found === pinned) {
    log(`installing dependencies (pnpm ${pinned})…`);
    run('pnpm', ['install', '--frozen-lockfile']);
  } else {
    log(
      `installing dependencies with npx pnpm@${pinned}` +
        (found ? ` (pnpm on PATH is ${found}, not the pinned ${pinned})…` : ' (no pnpm on PATH)…'),
    );
    run('npx', ['-y', `pnpm@${pinned}`, 'install', '--frozen-lockfile']);
  }
}

/**
 * Newest modification time (ms) under `path`, or 0 when it does not exist. Directories count too (their mtime moves
 * when a file is added or deleted), unless `only` selects files: then only the files it accepts count.
 */
function newestMtime(path, only) {
  let stat;
  try {
    stat = statSync(path);
  } catch {
    return 0;
  }
  if (!stat.isDirectory()) return only === undefined || only(path) ? stat.mtimeMs : 0;
  let newest = only === undefined ? stat.mtimeMs : 0;
  for (const entry of readdirSync(path)) {
    if (entry === 'node_modules') continue;
    newest = Math.max(newest, newestMtime(join(path, entry), only));
  }
  return newest;
}

/**
 * A package is stale when its dist is missing, lacks what a build step writes, or is older than its src (`.lua` files
 * too), its tsconfig or the shared base config.
 */
function stalePackages() {
  const baseConfig = newestMtime(join(root, 'tsconfig.base.json'));
  return PACKAGES.filter((name) => {
    const dir = join(root, 'packages', name);
    const dist = join(dir, 'dist');
    // A package with no sources yet has nothing to build (tsc -b emits no dist for it and says nothing).
    if (newestMtime(join(dir, 'src'), (file) => file.endsWith('.ts')) === 0) return false;
    if (!existsSync(dist)) return true;
    // A dist that tsc wrote but a later step did not (the Lua commands of an older bootstrap) is not a build.
    if (STEPS.some((step) => step.pkg === name && !existsSync(join(dir, step.output)))) return true;
    const inputs = Math.max(newestMtime(join(dir, 'src')), newestMtime(join(dir, 'tsconfig.json')), baseConfig);
    return newestMtime(dist) < inputs;
  });
}

function rebuild(stale) {
  log(`building (${stale.join(', ')} out of date)…`);
  // The same build as `pnpm build` (scripts/build.mjs): tsc -b, then the steps tsc does not know (the Lua commands).
  build();
}

function onPath(command, versionArgs = ['--version']) {
  return spawnSync(command, versionArgs, { stdio: 'ignore', shell: isWindows }).status === 0;
}

/** `ID` and `ID_LIKE` of /etc/os-release (`debian`, `ubuntu`, …), lower case. */
function linuxFamily() {
  const file = process.env['TASKRELAY_BOOTSTRAP_OS_RELEASE'] ?? '/etc/os-release';
  let text;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  return [...text.matchAll(/^(?:ID|ID_LIKE)=(.*)$/gm)].flatMap((m) =>
    m[1].replace(/["']/g, '').toLowerCase().split(/\s+/),
  );
}

/** What bootstrap installs when missing: the program it looks for on PATH, and its package per package manager. */
const REDIS = { bin: 'redis-server', apt: 'redis-server', brew: 'redis' };
/** What `npm test` drives besides Redis (`--tests`): each is on `.ci/run`'s list too. */
const TEST_TOOLS = [
  // tmux answers `-V`, and fails on `--version`.
  { bin: 'tmux', apt: 'tmux', brew: 'tmux', version: ['-V'] },
  { bin: 'chromium', apt: 'chromium', brew: undefined },
  { bin: 'docker-compose', apt: 'docker-compose', brew: 'docker-compose' },
];

/** The commands that install `tools` here, or undefined when no package manager here can install them all. */
function installPlan(tools) {
  const platform = process.env['TASKRELAY_BOOTSTRAP_PLATFORM'] ?? process.platform;
  if (platform === 'darwin') {
    if (!onPath('brew') || tools.some((t) => t.brew === undefined)) return undefined;
    return [['brew', 'install', ...tools.map((t) => t.brew)]];
  }
  if (platform !== 'linux') return undefined;
  const family = linuxFamily();
  if (!family.some((id) => id === 'debian' || id === 'ubuntu') || !onPath('apt-get')) return undefined;
  const asRoot = process.getuid?.() === 0;
  if (!asRoot && !onPath('sudo')) return undefined;
  const sudo = asRoot ? [] : ['sudo'];
  return [
    [...sudo, 'apt-get', 'update'],
    [...sudo, 'apt-get', 'install', '-y', '--no-install-recommends', ...tools.map((t) => t.apt)],
  ];
}

const NO_REDIS =
  'no REDIS_URL and no redis-server on PATH: install one (`apt-get install redis-server`, `brew install redis`) ' +
  'or run `docker compose -f docker-compose.yml -f docker-compose.redis-port.yml up -d redis` and start with ' +
  'REDIS_URL=redis://127.0.0.1:6379';

async function ensureTools() {
  // `pnpm test:unit` needs no Redis: its project is Node only (docs/TESTING.md).
  const external = ['REDIS_URL', 'REDIS_CLUSTER_NODES', 'REDIS_SENTINELS'].some((name) => process.env[name]);
  const wanted = [
    ...(process.argv.includes('--no-redis') || external ? [] : [REDIS]),
    ...(process.argv.includes('--tests') ? TEST_TOOLS : []),
  ];
  const missing = wanted.filter((t) => !onPath(t.bin, t.version));
  if (missing.length === 0) return;
  const names = missing.map((t) => t.bin).join(', ');
  const isAre = missing.length > 1 ? 'are' : 'is';
  const itThem = missing.length > 1 ? 'them' : 'it';
  const plan = installPlan(missing);
  if (!plan) {
    if (missing.includes(REDIS)) fail(NO_REDIS);
    fail(
      `${names} ${isAre} missing and no package manager here can install ${itThem}: install ${itThem}, then run the tests again`,
    );
  }
  const shown = plan.map((argv) => argv.join(' ')).join(' && ');
  const yes =
    process.argv.includes('--yes') ||
    process.env['npm_config_yes'] === 'true' ||
    ['1', 'true'].includes((process.env['CI'] ?? '').toLowerCase());
  if (!yes) {
    if (!process.stdin.isTTY || !process.stderr.isTTY) {
      fail(
        `${names} ${isAre} missing; to install ${itThem}, run: ${shown} (or rerun with --yes, e.g. \`npm start --yes\`)`,
      );
    }
    const prompt = createInterface({ input: process.stdin, output: process.stderr });
    const answer = (await prompt.question(`bootstrap: ${names} ${isAre} missing. Run \`${shown}\` now? [Y/n] `)).trim();
    prompt.close();
    if (!/^(y|yes)?$/i.test(answer))
      fail(`not installing ${names}; ${missing.includes(REDIS) ? NO_REDIS : 'the tests need it'}`);
  }
  log(`${names} ${isAre} missing; installing ${itThem}: ${shown}`);
  for (const argv of plan) run(argv[0], argv.slice(1));
  const still = missing.filter((t) => !onPath(t.bin, t.version)).map((t) => t.bin);
  if (still.length > 0) fail(`\`${shown}\` ran, but there is still no ${still.join(', ')} on PATH`);
}

/**
 * The Python worker's environment for `npm test` (issue 33): `.venv` with packages/worker-python installed (editable,
 * `[test]`), reinstalled when its pyproject.toml changes. No Python 3.11+: one line, and the Python suites skip.
 */
function ensurePython() {
  const python = ['python3', 'python'].find((bin) => {
    const probe = spawnSync(bin, ['-c', 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)']);
    return probe.status === 0;
  });
  if (!python) {
    log('no Python 3.11+ on PATH: the Python worker tests (pytest, test/python-worker.e2e.test.ts) are skipped');
    return;
  }
  const venv = join(root, '.venv');
  const venvPython = join(venv, isWindows ? 'Scripts/python.exe' : 'bin/python');
  if (!existsSync(venvPython)) {
    const made = spawnSync(python, ['-m', 'venv', venv], { cwd: root, stdio: 'inherit' });
    if (made.status !== 0) {
      log(
        `\`${python} -m venv .venv\` failed (on Debian: apt-get install python3-venv): the Python worker tests are skipped`,
      );
      return;
    }
  }
  const pyproject = join(root, 'packages/worker-python/pyproject.toml');
  const stamp = join(venv, '.taskrelay-worker-installed');
  const digest = createHash('sha256').update(readFileSync(pyproject)).digest('hex');
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === digest) return;
  log('installing the Python worker into .venv (pip install -e packages/worker-python[test])');
  run(venvPython, [
    '-m',
    'pip',
    'install',
    '--quiet',
    '--disable-pip-version-check',
    '-e',
    'packages/worker-python[test]',
  ]);
  writeFileSync(stamp, digest);
}

await ensureTools();
if (!existsSync(join(root, 'node_modules', '.modules.yaml'))) install();
const stale = stalePackages();
if (stale.length > 0) rebuild(stale);
// After the build: the Python package's generated scripts come from it (its build hook, hatch_build.py, would
// otherwise build the packages itself, and fails on a fresh clone before the install). `pnpm bench --python`'s rows
// need the same .venv.
if (process.argv.includes('--tests') || process.argv.includes('--python')) ensurePython();

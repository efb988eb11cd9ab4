#!/usr/bin/env node
// Packs a release's artifacts into one folder (default `.packed/`, or `--out DIR`), the files a user installs:
//   taskrelay-shared-X.tgz, taskrelay-worker-X.tgz, taskrelay-gateway-X.tgz, taskrelay-cli-X.tgz  (`pnpm pack`, which
//     rewrites each `workspace:*` dependency to the exact version it packs, so the four install together), and
//   taskrelay_worker-X-py3-none-any.whl  (`pip wheel packages/worker-python`: its build hook makes the generated
//     scripts and manifest inside the wheel; hatch_build.py).
// The build runs first (scripts/build.mjs), unless `--no-build` (the caller built, and other processes may be reading
// dist/ right now: test/packages.e2e.test.ts). `--no-wheel` skips the wheel (no Python 3.11+ here). Prints the paths it
// wrote, one per line, on stdout. Used by the release steps (README "Cutting a release"), test/packages.e2e.test.ts
// and examples/custom-worker's image. Plain Node, no dependencies.
import { spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build, PACKAGES } from './build.mjs';

const root = dirname(dirname(fileURLToPath(import.meta.url)));

function fail(message) {
  process.stderr.write(`pack: ${message}\n`);
  process.exit(1);
}

function run(command, args, cwd) {
  const result = spawnSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  if (result.error) fail(`could not run ${command}: ${result.error.message}`);
  if (result.status !== 0) {
    fail(`\`${[command, ...args].join(' ')}\` failed (exit ${result.status}):\n${result.stderr}${result.stdout}`);
  }
}

/** Packs every package into `out` (emptied first) and returns the paths written. */
export function pack({ out = join(root, '.packed'), wheel = true, rebuild = true } = {}) {
  if (rebuild) build();
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  for (const name of PACKAGES) run('pnpm', ['pack', '--pack-destination', out], join(root, 'packages', name));
  if (wheel) {
    const python = process.env['PYTHON'] ?? 'python3';
    run(
      python,
      ['-m', 'pip', 'wheel', '--quiet', '--disable-pip-version-check', '--no-deps', '--wheel-dir', out, '.'],
      join(root, 'packages/worker-python'),
    );
  }
  return readdirSync(out)
    .sort()
    .map((file) => join(out, file));
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const args = process.argv.slice(2);
  const flags = ['--out', '--no-wheel', '--no-build'];
  const unknown = args.filter((a, i) => !flags.includes(a) && args[i - 1] !== '--out');
  if (unknown.length > 0) {
    fail(`unknown argument ${unknown[0]} (usage: node scripts/pack.mjs [--out DIR] [--no-wheel] [--no-build])`);
  }
  const at = args.indexOf('--out');
  if (at !== -1 && !args[at + 1]) fail('--out needs a folder');
  const out = at === -1 ? undefined : resolve(args[at + 1]);
  const options = { out, wheel: !args.includes('--no-wheel'), rebuild: !args.includes('--no-build') };
  for (const file of pack(options)) process.stdout.write(`${file}\n`);
}

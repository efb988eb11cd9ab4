#!/usr/bin/env node
// The one build of the packages, whoever starts it: `pnpm build`, `pnpm typecheck`, bootstrap (`npm start`,
// `npm test`, `pnpm bench`) and the Dockerfile all run this file, so they all produce the same `dist/`:
//   1. `tsc -b` over the packages (it skips what is up to date and keeps project references consistent);
//   2. every build step that tsc does not know, listed in STEPS: today the Lua commands copied beside the compiled
//      code (packages/shared/copy-commands.mjs), which tsc never copies, and the same scripts resolved for the Python
//      worker (packages/shared/emit-python-lua.mjs).
// Before this file, bootstrap ran step 1 only, so a fresh clone's `npm start` had no Lua in dist and its worker
// exited at once. Plain Node, no dependencies.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
/** In dependency order (tsc -b orders them by project references anyway). */
export const PACKAGES = ['shared', 'worker', 'gateway', 'cli'];
/**
 * Build steps after tsc: a Node script run from the repository root, the package it builds for, and what it writes
 * there (a package missing one of these outputs is out of date, whatever its timestamps say).
 */
export const STEPS = [
  { script: 'packages/shared/copy-commands.mjs', pkg: 'shared', output: 'dist/protocol/commands' },
  // The same scripts, includes resolved, for the Python worker (PROTOCOL.md §29.2): not committed (git-ignored); the
  // editable install reads them from here, and the wheel's build hook (hatch_build.py) runs this step itself.
  {
    script: 'packages/shared/emit-python-lua.mjs',
    pkg: 'shared',
    output: '../worker-python/src/taskrelay_worker/_generated/manifest.json',
  },
];

function fail(message) {
  process.stderr.write(`build: ${message}\n`);
  process.exit(1);
}

function run(args) {
  const result = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
  if (result.error) fail(`could not run node ${args.join(' ')}: ${result.error.message}`);
  if (result.status !== 0) fail(`\`node ${args.join(' ')}\` failed (exit ${result.status ?? result.signal})`);
}

export function build() {
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  if (!existsSync(tsc)) fail('node_modules/typescript is missing: run `pnpm install --frozen-lockfile`');
  run([tsc, '-b', ...PACKAGES.map((name) => `packages/${name}`)]);
  for (const step of STEPS) run([join(root, step.script)]);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) build();

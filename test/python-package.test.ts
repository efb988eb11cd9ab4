/**
 * Issue 33 item 6: the Python worker's own tests (packages/worker-python/tests, pytest) run with the README's test
 * command, in the `.venv` that `npm test`'s bootstrap makes. Skipped, with one line, when there is no Python 3.11+.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { PYTHON, ROOT } from './helpers/processes.js';

if (PYTHON === undefined)
  console.log('pytest of packages/worker-python skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('packages/worker-python', () => {
  it('passes its pytest suite', () => {
    const run = spawnSync(PYTHON!, ['-m', 'pytest', 'packages/worker-python', '-q', '-p', 'no:cacheprovider'], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0);
    expect(run.stdout).toMatch(/\d+ passed/);
  });
});

/**
 * `kubernetes-validate --strict` (PyPI): Kubernetes objects checked against the API's JSON schemas bundled in the
 * package (offline), rejecting properties the API does not know, which kubernetes-models' `validate()` lets through.
 * Found at `KUBERNETES_VALIDATE`, else on PATH. CI installs it into a venv of its own (.ci/run) and sets
 * TASKRELAY_REQUIRE_HELM, which makes a missing one an error; locally the check is skipped, saying so.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';

export const KUBERNETES_VALIDATE: string | undefined = (() => {
  const candidates = [
    process.env['KUBERNETES_VALIDATE'],
    ...(process.env['PATH'] ?? '').split(delimiter).map((dir) => join(dir, 'kubernetes-validate')),
  ];
  const found = candidates.find((c): c is string => !!c && existsSync(c));
  if (!found && process.env['TASKRELAY_REQUIRE_HELM'])
    throw new Error('TASKRELAY_REQUIRE_HELM is set but kubernetes-validate was not found (KUBERNETES_VALIDATE, PATH)');
  if (!found)
    console.log('strict Kubernetes schema checks skipped: no kubernetes-validate (pip install kubernetes-validate)');
  return found;
})();

/**
 * The objects of `yaml` that do not validate strictly, one line each (empty when all do). Kinds it has no schema for
 * (KEDA's) are left to kubernetes-models.
 */
export function strictSchemaProblems(yaml: string): string[] {
  if (!KUBERNETES_VALIDATE) return [];
  const dir = mkdtempSync(join(tmpdir(), 'kv-'));
  try {
    const file = join(dir, 'objects.yaml');
    writeFileSync(file, yaml);
    const run = spawnSync(KUBERNETES_VALIDATE, ['--strict', '--quiet', '--no-warn', file], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    const lines = `${run.stdout}${run.stderr}`.split('\n').filter((l) => l.trim() !== '');
    if (run.status === 0) return [];
    return lines.length > 0 ? lines : [`kubernetes-validate exited ${run.status}`];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Issue 19, Deliver item 7, and issue 47 item 5: the requirements manifest (test/requirements/manifest.ts) run on
 * every cell of worker language × transport × tasks rendering each requirement applies to
 * (test/requirements/drivers.ts): one `describe` per language and combination, one `it` per requirement. One stack per
 * language (test/helpers/stack.ts): a gateway (authentication on, a small TASKRELAY_MAX_RESULT_BYTES) and one worker
 * serving the manifest's tools, test/fixtures/manifest-tools.mjs (Node) or test/fixtures/manifest_tools.py (Python),
 * shared by every combination. The Python cell is skipped, with one line, when no Python with taskrelay-worker is
 * installed (`npm test` and `.ci/run` make `.venv`).
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PYTHON, ROOT } from './helpers/processes.js';
import { useStack, type StackOptions } from './helpers/stack.js';
import { COMBINATIONS, openDriver, type Combination, type Driver } from './requirements/drivers.js';
import {
  REQUIREMENTS,
  WORKER_GAPS,
  type GapId,
  type KnownFailure,
  type Language,
  type Requirement,
} from './requirements/manifest.js';

const MAX_RESULT_BYTES = 8_192;
const TOKENS = { alice: 'alice-manifest-token', bob: 'bob-manifest-token' };
/** MANIFEST_STRICT=1 runs the known failures as ordinary tests: to see what they answer today, or that a fix works. */
const STRICT = process.env['MANIFEST_STRICT'] === '1';

/**
 * Started once per language for the whole file, so it may take its time: under the load of other suites (load
 * average 20+ on 2 cores) a gateway took 14–22 s to answer /readyz, past the helpers' default 20 s. The hook has 60 s.
 */
const STARTUP = { readyTimeoutMs: 45_000 };

const LANGUAGES: ReadonlyArray<{
  id: Language;
  skip: boolean;
  stack: Pick<StackOptions, 'workers' | 'pythonWorkers'>;
}> = [
  {
    id: 'node',
    skip: false,
    stack: { workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/manifest-tools.mjs') }] },
  },
  {
    id: 'python',
    skip: PYTHON === undefined,
    stack: { workers: [], pythonWorkers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/manifest_tools.py') }] },
  },
];

if (PYTHON === undefined) {
  console.log('requirements: the Python cell skipped: no .venv/bin/python with taskrelay-worker (needs Python 3.11+)');
}

it('the manifest names each requirement once and applies each to at least one combination', () => {
  const ids = REQUIREMENTS.map((r) => r.id);
  expect(new Set(ids).size).toBe(ids.length);
  const known = new Set(COMBINATIONS.map((c) => c.id));
  for (const requirement of REQUIREMENTS) {
    expect(requirement.appliesTo.length).toBeGreaterThan(0);
    for (const combo of [...requirement.appliesTo, ...Object.keys(requirement.knownFailure ?? {})]) {
      expect(known.has(combo as Combination['id'])).toBe(true);
    }
  }
});

/** What a requirement is expected to fail with in this cell, if anything: a recorded known failure, or an open gap. */
function expectedFailure(requirement: Requirement, language: Language, combo: Combination): KnownFailure | undefined {
  if (STRICT) return undefined;
  const known = requirement.knownFailure?.[combo.id];
  if (known) return known;
  for (const [id, failsWith] of Object.entries(requirement.gaps ?? {})) {
    const gap = WORKER_GAPS[id as GapId];
    if (gap.open && gap.language === language && failsWith) return { differs: gap.reason, failsWith };
  }
  return undefined;
}

for (const language of LANGUAGES) {
  describe.skipIf(language.skip)(`${language.id} worker`, () => {
    const stack = useStack({
      name: `manifest-${language.id}`,
      tokens: TOKENS,
      gateways: [{ TASKRELAY_MAX_RESULT_BYTES: String(MAX_RESULT_BYTES) }],
      ...language.stack,
      ready: STARTUP,
    });

    for (const combo of COMBINATIONS) {
      describe(combo.title, () => {
        let driver: Driver;
        beforeAll(async () => {
          driver = await openDriver(combo, { url: stack.gateway.url, tokens: TOKENS });
        });
        afterAll(async () => {
          await driver?.close();
        });

        for (const requirement of REQUIREMENTS.filter((r) => r.appliesTo.includes(combo.id))) {
          const name = `${requirement.id}: ${requirement.title} [${requirement.spec}]`;
          const run = () =>
            requirement.body(driver, {
              maxResultBytes: MAX_RESULT_BYTES,
              language: language.id,
              workerPids: [...stack.workers, ...stack.pythonWorkers].map((w) => w.pid),
            });
          const known = expectedFailure(requirement, language.id, combo);
          if (known === undefined) {
            it(name, run);
            continue;
          }
          // Expected to fail, and only in the way recorded: another error is let through as a pass, which it.fails
          // reports red ("expected to fail"), with that error on stderr.
          it.fails(`${name} (known failure: ${known.differs})`, async () => {
            try {
              await run();
            } catch (error) {
              if (known.failsWith.test(error instanceof Error ? error.message : String(error))) throw error;
              console.error(
                `${requirement.id} on ${language.id}/${combo.id} failed otherwise than recorded (${String(known.failsWith)}):`,
                error,
              );
              return;
            }
          });
        }
      });
    }
  });
}

/**
 * Issue 48 item 7, PROTOCOL.md §34.4: the per-principal bound on stored bytes holds when one principal's runs store
 * artifacts at once on several workers, Node and Python. The bound is checked and counted in one script
 * (`blobPut`), so however the stores interleave, the principal never holds more than its bound in Redis; the refused
 * stores say which bound refused them, and another principal's budget is untouched.
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKeys } from '@taskrelay/shared';
import { PYTHON, ROOT, startPythonWorkerProcess, stopAll } from '../helpers/processes.js';
import { startStack, type TestStack } from '../helpers/stack.js';
import { startTask, taskResult } from '../helpers/tasks.js';

const SIZE = 1_500;
const PRINCIPAL_MAX = 8_192;
const TASKS = 12;
const BOUNDS = {
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK: '4096',
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL: String(PRINCIPAL_MAX),
};

let stack: TestStack;

beforeAll(async () => {
  stack = await startStack({
    name: 'f-artifact-bytes',
    redis: { owned: true },
    env: { TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token' },
    workers: [
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-bounds-tools.mjs'), ...BOUNDS },
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-bounds-tools.mjs'), ...BOUNDS },
    ],
  });
  if (PYTHON !== undefined) {
    await startPythonWorkerProcess({
      ...stack.env,
      ...BOUNDS,
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'),
    });
  }
}, 60_000);

afterAll(async () => {
  await stopAll();
  await stack?.stop();
});

/** What each run of `tool` said of its two artifacts, for `count` runs of one principal started at once. */
async function runAtOnce(who: string, tool: string, count: number): Promise<string[]> {
  const client = await stack.client({ authorization: `Bearer ${who}-token` });
  const ids = await Promise.all(Array.from({ length: count }, () => startTask(client, tool, { size: SIZE })));
  const results = await Promise.all(ids.map((id) => taskResult(client, id, 60_000)));
  return results.flatMap((r) => (r.structuredContent as { outcomes: string[] }).outcomes);
}

describe('the per-principal stored-bytes bound, under concurrent stores on several workers', () => {
  it('admits no more than the bound, whichever worker stores, and says so to the refused', async () => {
    const tools = PYTHON === undefined ? ['bounded_artifacts'] : ['bounded_artifacts', 'py_bounded_artifacts'];
    const outcomes = (await Promise.all(tools.map((tool) => runAtOnce('alice', tool, TASKS / tools.length)))).flat();
    const stored = outcomes.filter((o) => o === 'stored').length;
    // Each store is SIZE bytes: exactly as many as fit under the bound go in, the rest are refused.
    expect(stored).toBe(Math.floor(PRINCIPAL_MAX / SIZE));
    for (const refused of outcomes.filter((o) => o !== 'stored')) expect(refused).toMatch(/principal/i);
    // What Redis holds for alice: her counter, and the stored values themselves.
    const keys = createKeys(stack.prefix);
    expect(Number(await stack.r.get(keys.principalBlobBytes('alice')))).toBe(stored * SIZE);
    let held = 0;
    for (const key of await stack.r.keys(`${stack.prefix}:blob:*`)) held += await stack.r.strlen(key);
    expect(held).toBeLessThanOrEqual(PRINCIPAL_MAX);
    expect(held).toBe(stored * SIZE);
  }, 120_000);

  it("leaves another principal's budget untouched", async () => {
    expect(await runAtOnce('bob', 'bounded_artifacts', 1)).toEqual(['stored', 'stored']);
  }, 60_000);
});

/**
 * PROTOCOL.md §12.11: a deploy between two runs of a task. Build 1 of three tools (one per `onVersionChange` policy)
 * starts tasks that wait for an answer; build 1 is stopped and build 2 started; the answers then resume the tasks on
 * build 2, which records its version and applies each tool's policy: `resume` goes on with the step and the answer,
 * `restart` clears them and runs from the top (the question asked again), `fail` fails the task with
 * `VERSION_CHANGED`. On every era. And while a build-1 worker is alive, build 2 leaves a build-1 task to it.
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKeys } from '@taskrelay/shared';
import { ROOT, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { COMBINATIONS, openDriver, type Driver, type Json } from './requirements/drivers.js';

const TOKENS = { alice: 'alice-versions-token' };
const build = (version: 1 | 2, extra: Record<string, string> = {}) => ({
  TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/versioned-tools.mjs'),
  TASKRELAY_QUEUE: 'versions',
  TOOL_VERSION: String(version),
  ...extra,
});

const stack = useStack({
  name: 'tool-versions',
  gateways: [{ TASKRELAY_AUTH_TOKENS: `alice:${TOKENS.alice}` }],
  workers: [],
});

const answerName = () => Promise.resolve({ action: 'accept', content: { name: 'Ada' } } as Json);

for (const combo of COMBINATIONS) {
  describe(`a deploy between a question and its answer, ${combo.title}`, () => {
    let driver: Driver;
    let v2: ManagedProcess | undefined;
    const tasks: Record<string, string> = {};

    beforeAll(async () => {
      const v1 = await stack.addWorker(build(1));
      driver = await openDriver(combo, { url: stack.gateway.url, tokens: TOKENS });
      for (const tool of ['ver_resume', 'ver_restart', 'ver_fail']) {
        tasks[tool] = (await driver.createTask(tool, {})).taskId;
      }
      for (const taskId of Object.values(tasks)) await driver.waitStatus(taskId, 'input_required');
      expect(await stack.r.hget(createKeys(stack.prefix).task(tasks['ver_resume']!), 'toolVersion')).toBe('1');
      // The deploy: build 1 drains (its tasks wait, holding no slot), build 2 starts.
      expect(await v1.kill('SIGTERM')).toBe(0);
      v2 = await stack.addWorker(build(2));
    });

    afterAll(async () => {
      await driver?.close();
      await v2?.kill('SIGTERM');
    });

    it('resume: build 2 goes on with the step and the answer, and records its version', async () => {
      const taskId = tasks['ver_resume']!;
      const result = await driver.taskResult(taskId, { answer: answerName });
      expect(result['structuredContent']).toMatchObject({ version: 2, prepared: { by: 1 }, name: 'Ada' });
      expect(await stack.r.hget(createKeys(stack.prefix).task(taskId), 'toolVersion')).toBe('2');
      // tools/list shows the version the newest worker runs (its catalog is cached for a second).
      const listedVersion = async () =>
        ((await driver.listTools()).find((t) => t['name'] === 'ver_resume')?.['_meta'] as Json | undefined)?.[
          'dev.taskrelay/version'
        ];
      await waitFor(async () => (await listedVersion()) === '2', { message: 'tools/list does not show version 2' });
      await waitFor(() =>
        v2!
          .logs()
          .some(
            (l) => l['taskId'] === taskId && l['from'] === '1' && l['to'] === '2' && l['onVersionChange'] === 'resume',
          ),
      );
    });

    it('restart: build 2 clears the step and the answer, runs from the top and asks again', async () => {
      const taskId = tasks['ver_restart']!;
      const result = await driver.taskResult(taskId, { answer: answerName });
      expect(result['structuredContent']).toMatchObject({ version: 2, prepared: { by: 2 }, name: 'Ada' });
      // Build 1's question (number 1) and its answer were cleared; build 2 asked anew, under a number above it.
      const hash = await stack.r.hgetall(createKeys(stack.prefix).task(taskId));
      expect(hash['inputFloor']).toBe('1');
      expect(Object.keys(hash).filter((f) => f.startsWith('input:'))).toEqual(['input:2']);
      expect(hash['answer:2']).toBeDefined();
    });

    it('fail: the task fails with VERSION_CHANGED, saying both versions', async () => {
      const taskId = tasks['ver_fail']!;
      let outcome: Json | Error;
      try {
        outcome = await driver.taskResult(taskId, { answer: answerName });
      } catch (error) {
        outcome = error as Error;
      }
      const text = outcome instanceof Error ? outcome.message : JSON.stringify(outcome);
      expect(text).toMatch(/started on tool ver_fail version 1; this worker runs version 2 \(onVersionChange: fail\)/);
      const hash = await stack.r.hgetall(createKeys(stack.prefix).task(taskId));
      expect(hash['status']).toBe('failed');
      expect(JSON.parse(hash['error'] ?? '{}')).toMatchObject({ code: 'VERSION_CHANGED' });
    });
  });
}

describe('while a worker of the version the task ran is alive', () => {
  it('build 2 leaves the task to it, and the task resumes on build 1', async () => {
    const v1 = await stack.addWorker(build(1, { WORKER_CONCURRENCY: '1' }));
    const driver = await openDriver(COMBINATIONS[0]!, { url: stack.gateway.url, tokens: TOKENS });
    let v2: ManagedProcess | undefined;
    try {
      // The gateway's catalog (cached for a second) lists build 1's own tool once it has read build 1's catalog.
      await waitFor(async () => (await driver.listTools()).some((t) => t['name'] === 'ver_block'));
      const { taskId } = await driver.createTask('ver_resume', {});
      await driver.waitStatus(taskId, 'input_required');
      // Build 1's only slot is busy for a while (called before build 2 starts: a newer build's catalog hides the
      // tools it dropped): build 2 takes the resumed job first, and must leave it.
      const block = await driver.createTask('ver_block', { ms: 600_000 });
      await waitFor(() => v1.logs().some((l) => l['taskId'] === block.taskId && l['msg'] === 'tool started'), {
        message: 'build 1 did not start ver_block',
      });
      v2 = await stack.addWorker(build(2));
      const settled = driver.taskResult(taskId, { answer: answerName });
      // Build 2 takes the answered task's job and leaves it while build 1 is alive; then build 1's slot is freed.
      await waitFor(() => v2!.logs().some((l) => l['taskId'] === taskId && String(l['msg']).endsWith('left to it')), {
        message: 'build 2 never left the task to build 1',
      });
      await driver.cancel(block.taskId);
      const result = await settled;
      expect(result['structuredContent']).toMatchObject({ version: 1, prepared: { by: 1 }, name: 'Ada' });
      expect(v2.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started')).toBe(false);
    } finally {
      await driver.close();
      await v2?.kill('SIGTERM');
      await v1.kill('SIGTERM');
    }
  });
});

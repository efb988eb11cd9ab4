/**
 * PROTOCOL.md §12.3: a deploy between two answers never hands an answer to another question. A task of `pay` v1
 * (asks the amount, then a confirmation) is answered once, then, while it waits for the confirmation, its workers are
 * replaced by v2 (which asks the confirmation first). Matched by position alone, v2 used to complete with
 * `confirm: {amount: 100}, amount: {ok: true}`, on every era. Now each question it asks keeps only an answer stored for
 * the same question (its key or place, and its requested schema); the changed ones are asked again. A step renamed by
 * the deploy runs again (steps are keyed by name), and the worker reports it with the task id.
 */
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, type ManagedProcess } from './helpers/processes.js';
import { waitFor } from './helpers/wait-for.js';
import { useStack } from './helpers/stack.js';
import { COMBINATIONS, openDriver, type Driver, type InputRequest, type Json } from './requirements/drivers.js';

const TOKENS = { alice: 'alice-deploy-token' };
const worker = (version: 1 | 2) => ({
  TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/deploy-tools.mjs'),
  TASKRELAY_QUEUE: 'deploy',
  DEPLOY_VERSION: String(version),
});

const stack = useStack({
  name: 'deploy-questions',
  gateways: [{ TASKRELAY_AUTH_TOKENS: `alice:${TOKENS.alice}` }],
  workers: [],
});

/** Answers by what is asked, never by order: the amount question gets 100, the confirmation true. */
function answerOf(request: InputRequest): Json {
  const properties = (request.params['requestedSchema'] as { properties?: Json } | undefined)?.properties ?? {};
  if ('amount' in properties) return { action: 'accept', content: { amount: 100 } };
  if ('ok' in properties) return { action: 'accept', content: { ok: true } };
  throw new Error(`unexpected question ${JSON.stringify(request.params)}`);
}

for (const combo of COMBINATIONS) {
  describe(`a deploy between two answers, ${combo.title}`, () => {
    let driver: Driver;
    let v1: ManagedProcess;
    let v2: ManagedProcess | undefined;

    beforeAll(async () => {
      v1 = await stack.addWorker(worker(1));
      driver = await openDriver(combo, { url: stack.gateway.url, tokens: TOKENS });
    });

    afterAll(async () => {
      await driver?.close();
      await v2?.kill('SIGTERM');
    });

    it('asks the changed questions again and completes with each answer on its own question', async () => {
      const { taskId } = await driver.createTask('pay', {});
      const asked: string[] = [];
      const result = await driver.taskResult(taskId, {
        answer: async (request) => {
          const answer = answerOf(request);
          asked.push(Object.keys(answer['content'] as Json)[0] ?? '?');
          // v1's second question: deploy v2 while the task waits for its answer (the run is suspended, no slot).
          if (asked.length === 2 && v2 === undefined) {
            expect(await v1.kill('SIGTERM')).toBe(0);
            v2 = await stack.addWorker(worker(2));
          }
          return answer;
        },
      });
      expect(result['isError']).toBeFalsy();
      expect(result['structuredContent']).toEqual({ version: 2, amount: { amount: 100 }, confirm: { ok: true } });
      // v1 asked amount then confirm; v2 met both changed (each at its place) and asked them again, in its order.
      expect(asked).toEqual(['amount', 'ok', 'ok', 'amount']);
      await waitFor(
        () =>
          v2!
            .logs()
            .filter((l) => l['taskId'] === taskId && String(l['msg']).startsWith('the question asked here changed'))
            .length === 2,
        { message: 'v2 did not warn, with the task id, that the questions changed' },
      );
    });

    it('reports a step a deploy renamed, with the task id, when its side effect runs again', async () => {
      const deployed = v2!;
      await deployed.kill('SIGTERM');
      const v1again = await stack.addWorker(worker(1));
      const { taskId } = await driver.createTask('charge', {});
      let renamed: ManagedProcess | undefined;
      const result = await driver.taskResult(taskId, {
        answer: async (request) => {
          if (renamed === undefined) {
            expect(await v1again.kill('SIGTERM')).toBe(0);
            renamed = await stack.addWorker(worker(2));
            v2 = renamed;
          }
          return answerOf(request);
        },
      });
      // The step ran again under its new name (the side effect R8 found); the worker said so, naming the task.
      expect(result['structuredContent']).toMatchObject({ version: 2, charged: { chargedBy: 2 } });
      await waitFor(
        () =>
          renamed!
            .logs()
            .some(
              (l) =>
                l['taskId'] === taskId &&
                l['step'] === 'charge_card' &&
                JSON.stringify(l['storedSteps']) === '["charge"]' &&
                String(l['msg']).includes('renamed by a deploy'),
            ),
        { message: 'the renamed step was not reported with the task id' },
      );
    });
  });
}

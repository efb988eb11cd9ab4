// The tool alone, without Redis: its published schema, its validation and its run with a stand-in context.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isToolDefinition } from '@taskrelay/worker';
import { count_to } from '../src/tools.js';

/** What the worker hands `run`, reduced to what count_to uses. */
function fakeContext() {
  const progress = [];
  const controller = new AbortController();
  return {
    progress,
    controller,
    ctx: {
      taskId: 'test-task',
      tool: 'count_to',
      attempt: 1,
      signal: controller.signal,
      log: console,
      progress: (value, total, message) => progress.push({ value, total, message }),
      sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
      throwIfCancelled: () => controller.signal.throwIfAborted(),
    },
  };
}

test('count_to is a tool definition with a published JSON Schema', () => {
  assert.equal(isToolDefinition(count_to), true);
  assert.equal(count_to.descriptor.name, 'count_to');
  assert.deepEqual(count_to.descriptor.inputSchema.required, ['n']);
});

test('count_to rejects arguments out of range', () => {
  assert.equal(count_to.inputSchema.safeParse({ n: 0 }).success, false);
  assert.equal(count_to.inputSchema.safeParse({ n: 'three' }).success, false);
});

test('count_to counts, reporting each number as progress', async () => {
  const { ctx, progress } = fakeContext();
  const input = count_to.inputSchema.parse({ n: 3, delayMs: 0 });
  assert.deepEqual(await count_to.run(input, ctx), { counted: 3 });
  assert.deepEqual(
    progress.map((p) => p.value),
    [1, 2, 3],
  );
  assert.equal(progress.at(-1).message, 'Counted to 3');
});

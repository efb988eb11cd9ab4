/**
 * Fault suite, PROTOCOL.md §22.5: reading large results never holds the connection every other command of the gateway
 * waits on. Ten concurrent `tasks/result` of 16 MiB results by one principal used to go over that one connection: most
 * timed out as `Task store unavailable`, and another principal's calls waited behind them. Now each large result is
 * read over a connection of its own, at most TASKRELAY_MAX_LARGE_READS_PER_PRINCIPAL at once per principal.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ROOT, connectClient } from '../helpers/processes.js';
import { startStack, type TestStack } from '../helpers/stack.js';
import { startTask, taskResult } from '../helpers/tasks.js';
import { waitFor } from '../helpers/wait-for.js';

const ABUSE_TOOLS = `${ROOT}/test/fixtures/abuse-tools.mjs`;
const TOKENS = { alice: 'alice-large-token', bob: 'bob-large-token' };
const MIB = 16;

let stack: TestStack;
let alice: Client;
let bob: Client;

beforeAll(async () => {
  stack = await startStack({
    name: 'f-large',
    redis: { owned: true },
    gateways: [
      {
        TASKRELAY_AUTH_TOKENS: `alice:${TOKENS.alice},bob:${TOKENS.bob}`,
        TASKRELAY_MAX_RESULT_BYTES: String(32 * 1024 * 1024),
      },
    ],
    // Results stay inline here (PROTOCOL.md §34.3 moves those over 1 MiB out by default): this suite reads them whole.
    workers: [
      {
        TASKRELAY_TOOLS: ABUSE_TOOLS,
        WORKER_CONCURRENCY: '16',
        TASKRELAY_INLINE_RESULT_BYTES: String(32 * 1024 * 1024),
      },
    ],
  });
  alice = await connectClient(stack.gateway.url, { authorization: `Bearer ${TOKENS.alice}` });
  bob = await connectClient(stack.gateway.url, { authorization: `Bearer ${TOKENS.bob}` });
});

afterAll(async () => {
  await alice?.close();
  await bob?.close();
  await stack?.stop();
});

describe('large results', () => {
  it("ten concurrent 16 MiB tasks/result all arrive, and another principal's calls go on meanwhile", async () => {
    const ids = await Promise.all(
      Array.from({ length: 10 }, () => startTask(alice, 'huge_result', { mib: MIB }, { timeoutMs: 60_000 })),
    );
    await waitFor(
      async () =>
        (await Promise.all(ids.map((id) => alice.experimental.tasks.getTask(id)))).every(
          (t) => t.status === 'completed',
        ),
      { timeoutMs: 60_000, message: 'the large tasks did not complete' },
    );
    // Bob polls his own small task the whole time the large results are read.
    const small = await startTask(bob, 'big_result', { bytes: 10 });
    let reading = true;
    const bobErrors: string[] = [];
    let bobCalls = 0;
    const bobLoop = (async () => {
      while (reading) {
        try {
          await bob.experimental.tasks.getTask(small);
          bobCalls++;
        } catch (error) {
          bobErrors.push(error instanceof Error ? error.message : String(error));
        }
      }
    })();
    const results = await Promise.allSettled(ids.map((id) => taskResult(alice, id, 120_000)));
    reading = false;
    await bobLoop;
    const failures = results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []));
    expect(failures).toEqual([]);
    for (const r of results) {
      const content = (r as PromiseFulfilledResult<{ content: Array<{ text?: string }> }>).value.content;
      expect(content[0]?.text?.length).toBe(MIB * 1024 * 1024);
    }
    expect(bobErrors).toEqual([]);
    expect(bobCalls).toBeGreaterThan(0);
  });
});

/**
 * Fault suite, PROTOCOL.md §26.8: a batch survives its workers being SIGKILLed mid-run, its gateway being killed and
 * restarted, and a Redis restart (AOF): no child is lost (every one is recorded, the task completes with all of them)
 * and none is counted twice (a child whose worker died after it ran runs again, and its outcome is still recorded and
 * counted once).
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, it } from 'vitest';
import { expectExactBatch, killBusyWorker, tracedWorkers } from '../helpers/batch-trace.js';
import { createKeys } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { type WorkerPool, startTask, taskResult, watchingClient } from '../helpers/faults.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
const SIZE = 150;
const DIR = mkdtempSync(join(tmpdir(), 'f-batch-'));
const TRACE = join(DIR, 'trace.log');
/**
 * Each kill happens while children run: the children from `from` on wait at a gate file the test opens after the
 * kill before, so the batch cannot run out of work while a replacement worker starts (seconds on a loaded machine).
 */
const KILLS = [
  { at: 15, gate: undefined },
  { at: 40, gate: join(DIR, 'gate-1'), from: 20 },
  { at: 65, gate: join(DIR, 'gate-2'), from: 45 },
] as const;
const LAST_GATE = { gate: join(DIR, 'gate-3'), from: 70 };
const GATES = [...KILLS.flatMap((k) => (k.gate === undefined ? [] : [k])), LAST_GATE];
/** The gate child `n` waits at: the last one whose `from` it has reached. */
const gateOf = (n: number) => GATES.filter((g) => n >= g.from).at(-1)?.gate;

// Redis with its append-only file: it restarts with what it acknowledged.
const stack = useStack({
  name: 'f-batch',
  redis: { appendOnly: true },
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500', LOG_LEVEL: 'warn' }],
  workers: [],
});
let workers: WorkerPool;

beforeAll(async () => {
  workers = await tracedWorkers(stack, BATCH_TOOLS, TRACE, { TASKRELAY_QUEUE: 'batch' });
});

/** Children a killed worker died running: each must run again, and still be counted once. */
const diedRunning: number[] = [];

describe('§26.8 batch crash safety', () => {
  it('loses no child and counts none twice through worker SIGKILLs, a gateway restart and a Redis restart', async () => {
    const watcher = await watchingClient(stack.gateway.url);
    const items = Array.from({ length: SIZE }, (_v, n) => {
      const gate = gateOf(n);
      return gate === undefined ? { n, delayMs: 300 } : { n, delayMs: 300, gate };
    });
    const taskId = await startTask(watcher.client, 'fan_out', { items, concurrency: 12 }, { ttl: 600_000 });
    const batch = createKeys(stack.prefix).batch(taskId);
    const done = async () => Number((await stack.r.hget(batch.hash, 'completed')) ?? 0);

    for (const [i, { at }] of KILLS.entries()) {
      await waitFor(async () => (await done()) >= at, { timeoutMs: 60_000, message: `${at} children done` });
      diedRunning.push(...(await killBusyWorker(workers, TRACE)));
      writeFileSync(KILLS[i + 1]?.gate ?? LAST_GATE.gate, '');
    }
    await watcher.client.close().catch(() => undefined);

    // The gateway dies and comes back on the same address; the batch goes on meanwhile (it runs on workers).
    await waitFor(async () => (await done()) >= 85, { timeoutMs: 60_000, message: '85 children done' });
    await stack.restartGateway();

    // Redis restarts with its append-only file: the batch, its children's jobs and the parent's delayed job survive.
    await waitFor(async () => (await done()) >= 100, { timeoutMs: 60_000, message: '100 children done' });
    await stack.redis.kill();
    await stack.redis.restart();

    const client = (await watchingClient(stack.gateway.url)).client;
    const result = await taskResult(client, taskId, 120_000);
    // None lost, none counted twice, and each child a killed worker held ran again (test/helpers/batch-trace.ts).
    const counted = { done: await done(), outcomes: await stack.r.hlen(batch.outcomes) };
    expectExactBatch(result, SIZE, counted, TRACE, diedRunning);
    await client.close();
  }, 240_000);
});

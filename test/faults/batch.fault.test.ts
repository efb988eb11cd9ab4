/**
 * Fault suite, PROTOCOL.md §26.8: a batch survives its workers being SIGKILLed mid-run, its gateway being killed and
 * restarted, and a Redis restart (AOF): no child is lost (every one is recorded, the task completes with all of them)
 * and none is counted twice (a child whose worker died after it ran runs again, and its outcome is still recorded and
 * counted once).
 */
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { createKeys } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { WorkerPool, startTask, taskResult, watchingClient } from '../helpers/faults.js';

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
  workers = new WorkerPool(
    {
      TASKRELAY_TOOLS: BATCH_TOOLS,
      TASKRELAY_QUEUE: 'batch',
      WORKER_LOCK_DURATION_MS: '1500',
      WORKER_CONCURRENCY: '4',
      LOG_LEVEL: 'info',
      BATCH_TRACE_FILE: TRACE,
    },
    (env) => stack.addWorker(env),
  );
  await workers.start(3);
});

interface TraceLine {
  pid: number;
  what: 'start' | 'done';
  n: number;
}

/** Every child run so far, from the fixture's trace file (written synchronously, so a SIGKILL loses none). */
function trace(): TraceLine[] {
  if (!existsSync(TRACE)) return [];
  return readFileSync(TRACE, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [pid, what, n] = l.split(' ');
      return { pid: Number(pid), what: what as TraceLine['what'], n: Number(n) };
    });
}

/** The children a worker process started and did not finish (it is running them, or it died running them). */
function heldBy(pid: number, lines = trace()): number[] {
  const open = new Set<number>();
  for (const l of lines) {
    if (l.pid !== pid) continue;
    if (l.what === 'start') open.add(l.n);
    else open.delete(l.n);
  }
  return [...open];
}

/** Children a killed worker died running: each must run again, and still be counted once. */
const diedRunning: number[] = [];

/** SIGKILLs a worker that is running children right now, and starts a replacement. */
async function killBusyWorker(): Promise<void> {
  let victim: number | undefined;
  await waitFor(
    () => {
      victim = [...workers.procs.keys()].find((pid) => heldBy(pid).length > 0);
      return victim !== undefined;
    },
    { timeoutMs: 10_000, message: 'a worker running a child' },
  );
  await workers.kill(victim!);
  // Read after the exit: exactly what it held when it died.
  diedRunning.push(...heldBy(victim!));
  await workers.start(1);
}

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
      await killBusyWorker();
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
    const body = result.structuredContent as {
      total: number;
      completed: number;
      failed: number;
      cancelled: number;
      outcomes: Array<{ index: number; status: string }>;
    };
    expect(result.isError).toBeFalsy();
    // None lost: every child recorded as completed, in order.
    expect(body).toMatchObject({ total: SIZE, completed: SIZE, failed: 0, cancelled: 0 });
    expect(body.outcomes.map((o) => o.index)).toEqual(items.map((i) => i.n));
    expect(body.outcomes.every((o) => o.status === 'completed')).toBe(true);
    // None counted twice: the counter the records increment is the number of children, and one outcome each.
    expect(await done()).toBe(SIZE);
    expect(await stack.r.hlen(batch.outcomes)).toBe(SIZE);
    // The faults hit children mid-run, and each child a killed worker held ran again (and still counted once).
    const runs = new Map<number, number>();
    for (const l of trace()) if (l.what === 'start') runs.set(l.n, (runs.get(l.n) ?? 0) + 1);
    expect(runs.size).toBe(SIZE);
    expect(diedRunning.length).toBeGreaterThan(0);
    for (const n of diedRunning) expect(runs.get(n), `child ${n} ran again`).toBeGreaterThanOrEqual(2);
    await client.close();
  }, 240_000);
});

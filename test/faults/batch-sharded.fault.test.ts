/**
 * Fault suite, PROTOCOL.md §26.10 (and §26.8): a batch in the sharded layout on a 3-master Redis Cluster, its child
 * tool over three shards, survives the children's workers being SIGKILLed mid-run: no child is lost (every one is
 * recorded and the task completes with all of them) and none is counted twice (a child whose worker died running it
 * runs again, on its own shard, and its outcome is claimed there and counted once on the parent's shard).
 */
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster } from 'ioredis';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { waitFor } from '../helpers/wait-for.js';
import { ROOT } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { WorkerPool, startTask, taskResult, watchingClient } from '../helpers/faults.js';

const SIZE = 60;
const DIR = mkdtempSync(join(tmpdir(), 'f-batch-sharded-'));
const TRACE = join(DIR, 'trace.log');
/** Children done (recorded) when a busy children's worker is SIGKILLed. */
const KILLS = [12, 30];

const stack = useStack({
  name: 'f-batch-sharded',
  cluster: { braces: false },
  gateways: [{ LOG_LEVEL: 'warn' }],
  // The parent's worker serves the parent tool only.
  workers: [{ TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-parent.mjs`, WORKER_CONCURRENCY: '2' }],
  hookTimeoutMs: 180_000,
});
let workers: WorkerPool;
let redis: Cluster;

beforeAll(async () => {
  redis = new Cluster(stack.cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
  workers = new WorkerPool(
    {
      TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-children.mjs`,
      WORKER_LOCK_DURATION_MS: '1500',
      WORKER_CONCURRENCY: '4',
      LOG_LEVEL: 'info',
      BATCH_TRACE_FILE: TRACE,
    },
    (env) => stack.addWorker(env),
  );
  await workers.start(3);
});

afterAll(() => {
  redis?.disconnect();
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

describe('§26.10 batch crash safety in the sharded layout', () => {
  it('loses no child and counts none twice through SIGKILLs of the children’s workers', async () => {
    const watcher = await watchingClient(stack.gateway.url);
    await waitFor(async () => (await watcher.client.listTools()).tools.some((t) => t.name === 'fan_out'), {
      message: 'fan_out never reached the gateway',
    });
    const items = Array.from({ length: SIZE }, (_v, n) => ({ n, delayMs: 300 }));
    const taskId = await startTask(
      watcher.client,
      'fan_out',
      { items, concurrency: 12, tool: 'shard_child' },
      { ttl: 600_000 },
    );
    const keys = createKeys(stack.prefix, 'sharded');
    const batch = keys.forTask(taskId).batch(taskId);
    const done = async () => Number((await redis.hget(batch.hash, 'completed')) ?? 0);

    const diedRunning: number[] = [];
    for (const at of KILLS) {
      await waitFor(async () => (await done()) >= at, { timeoutMs: 60_000, message: `${at} children done` });
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

    const result = await taskResult(watcher.client, taskId, 120_000);
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
    expect(await redis.hlen(batch.outcomes)).toBe(SIZE);
    // The kills hit children mid-run, and each child a killed worker held ran again (and still counted once).
    const runs = new Map<number, number>();
    for (const l of trace()) if (l.what === 'start') runs.set(l.n, (runs.get(l.n) ?? 0) + 1);
    expect(runs.size).toBe(SIZE);
    expect(diedRunning.length).toBeGreaterThan(0);
    for (const n of diedRunning) expect(runs.get(n), `child ${n} ran again`).toBeGreaterThanOrEqual(2);
    // The child tool ran over three shards (child i on shard i mod 3, test/batch-sharded.e2e.test.ts).
    const registry = await redis.hgetall(keys.placement);
    const pool = toolQueue('default', 'shard_child');
    const codes = [0, 1, 2].map((i) => registry[`${pool}#${i}`] ?? '');
    expect(new Set(codes).size).toBe(3);
    await watcher.client.close();
  }, 240_000);
});

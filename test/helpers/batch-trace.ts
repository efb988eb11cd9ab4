/**
 * The batch fixtures' trace file (test/fixtures/*batch*.mjs, `BATCH_TRACE_FILE`): one line `<pid> <what> <n>` per
 * child run step, written synchronously, so a SIGKILL loses none. Read by the batch suites to count each child's runs.
 */
import { existsSync, readFileSync } from 'node:fs';
import { expect } from 'vitest';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { WorkerPool } from './faults.js';
import type { TestStack } from './stack.js';
import { waitFor } from './wait-for.js';

export interface TraceLine {
  pid: number;
  what: 'start' | 'done';
  n: number;
}

/** Every line of the trace so far. */
export function readTrace(file: string): TraceLine[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [pid, what, n] = l.split(' ');
      return { pid: Number(pid), what: what as TraceLine['what'], n: Number(n) };
    });
}

/** The children `n` in [from, to) of the lines saying `what`, in trace order. */
export function traced(file: string, what: string, from: number, to: number): number[] {
  return readTrace(file)
    .filter((l) => l.what === what && l.n >= from && l.n < to)
    .map((l) => l.n);
}

/** The children a worker process started and did not finish (it is running them, or it died running them). */
export function heldBy(pid: number, lines: TraceLine[]): number[] {
  const open = new Set<number>();
  for (const l of lines) {
    if (l.pid !== pid) continue;
    if (l.what === 'start') open.add(l.n);
    else open.delete(l.n);
  }
  return [...open];
}

/**
 * What a batch of `size` children that went through kills must show (PROTOCOL.md §26.8): none lost (every child
 * completed, in order), none counted twice (`counted`: the record counter and the stored outcomes, one per child),
 * and each child a killed worker died running (`diedRunning`) ran again, per the trace `file`.
 */
export function expectExactBatch(
  result: CallToolResult,
  size: number,
  counted: { done: number; outcomes: number },
  file: string,
  diedRunning: readonly number[],
): void {
  const body = result.structuredContent as {
    total: number;
    completed: number;
    failed: number;
    cancelled: number;
    outcomes: Array<{ index: number; status: string }>;
  };
  expect(result.isError).toBeFalsy();
  expect(body).toMatchObject({ total: size, completed: size, failed: 0, cancelled: 0 });
  expect(body.outcomes.map((o) => o.index)).toEqual(Array.from({ length: size }, (_v, n) => n));
  expect(body.outcomes.every((o) => o.status === 'completed')).toBe(true);
  expect(counted).toEqual({ done: size, outcomes: size });
  const runs = new Map<number, number>();
  for (const l of readTrace(file)) if (l.what === 'start') runs.set(l.n, (runs.get(l.n) ?? 0) + 1);
  expect(runs.size).toBe(size);
  expect(diedRunning.length).toBeGreaterThan(0);
  for (const n of diedRunning) expect(runs.get(n), `child ${n} ran again`).toBeGreaterThanOrEqual(2);
}

/**
 * SIGKILLs a worker of `pool` that is running children right now (per the trace `file`), starts a replacement, and
 * returns the children it died running (read after its exit: exactly what it held), each of which must run again.
 * With `over`, returns [] without a kill once it says the batch is over: a batch whose children nothing holds back
 * can finish before a busy worker is seen (a loaded machine polls late).
 */
export async function killBusyWorker(pool: WorkerPool, file: string, over?: () => Promise<boolean>): Promise<number[]> {
  let victim: number | undefined;
  let ended = false;
  await waitFor(
    async () => {
      victim = [...pool.procs.keys()].find((pid) => heldBy(pid, readTrace(file)).length > 0);
      if (victim === undefined && over !== undefined) ended = await over();
      return victim !== undefined || ended;
    },
    { timeoutMs: 10_000, message: 'a worker running a child' },
  );
  if (victim === undefined) return [];
  await pool.kill(victim);
  const died = heldBy(victim, readTrace(file));
  await pool.start(1);
  return died;
}

/**
 * Three workers of `tools` (more `env` besides) that trace their children into `file`, with a short lock so a killed
 * one's children come back quickly, started through `stack`: the pool the batch fault suites kill from.
 */
export async function tracedWorkers(
  stack: TestStack,
  tools: string,
  file: string,
  env: Record<string, string> = {},
): Promise<WorkerPool> {
  const pool = new WorkerPool(
    {
      TASKRELAY_TOOLS: tools,
      WORKER_LOCK_DURATION_MS: '1500',
      WORKER_CONCURRENCY: '4',
      LOG_LEVEL: 'info',
      BATCH_TRACE_FILE: file,
      ...env,
    },
    (workerEnv) => stack.addWorker(workerEnv),
  );
  await pool.start(3);
  return pool;
}

/**
 * PROTOCOL.md §26.3 step 4 (issue 30 item 1): a batch keeps releasing children while its parent's run is live but
 * not releasing (a slow replay) and while it is lost with its SIGKILLed worker, until BullMQ's stall check takes it
 * over. Before, no child was released in either case: the batch froze for the parent's run, or for the lock
 * duration. Read from the fixture's synchronous trace: children started between the parent's run starting and its
 * replay reaching `fanOut` (or its takeover), which, without children releasing, is at most the half window still
 * open.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const BATCH_TOOLS = `${ROOT}/test/fixtures/batch-tools.mjs`;
const DIR = mkdtempSync(join(tmpdir(), 'batch-takeover-'));
const CONCURRENCY = 4;

const stack = useStack({
  name: 'takeover',
  redis: { owned: true },
  gateways: [{ LOG_LEVEL: 'warn' }],
  workers: [],
  mcp: true,
});

interface Line {
  pid: number;
  what: string;
  n: number;
}

function trace(file: string): Line[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [pid, what, n] = l.split(' ');
      return { pid: Number(pid), what: what ?? '', n: Number(n) };
    });
}

const items = (count: number) => Array.from({ length: count }, (_v, n) => ({ n, delayMs: 100 }));

describe('§26.3 a batch whose parent is not releasing', () => {
  it('keeps releasing while the parent’s run is live and slow', async () => {
    const file = join(DIR, 'slow.log');
    const worker = await stack.addWorker({
      TASKRELAY_TOOLS: BATCH_TOOLS,
      WORKER_CONCURRENCY: '6',
      BATCH_TRACE_FILE: file,
    });
    const id = await startTask(
      stack.mcp,
      'fan_out',
      { items: items(40), concurrency: CONCURRENCY, replayMs: 3_000 },
      { ttl: 300_000 },
    );
    const result = await taskResult(stack.mcp, id, 120_000);
    expect(result.structuredContent).toMatchObject({ total: 40, completed: 40, failed: 0 });
    // The children each replay of the parent saw start while it slept: more than a window, so children released.
    const lines = trace(file);
    let during = 0;
    let most = 0;
    for (const l of lines) {
      if (l.what === 'parent-start') during = 0;
      else if (l.what === 'start') during += 1;
      else if (l.what === 'parent-slept') most = Math.max(most, during);
    }
    expect(most).toBeGreaterThan(CONCURRENCY);
    await worker.kill('SIGTERM');
  }, 150_000);

  it('keeps releasing while the parent’s run is lost with its SIGKILLed worker, and the takeover ends it', async () => {
    const file = join(DIR, 'lost.log');
    const workerEnv = (tools: string) => ({
      TASKRELAY_TOOLS: `${ROOT}/test/fixtures/${tools}`,
      WORKER_CONCURRENCY: '6',
      WORKER_LOCK_DURATION_MS: '6000',
      BATCH_TRACE_FILE: file,
    });
    // The parent runs on one worker, its children on another: the kill takes the parent's run, not theirs.
    const parentWorker = await stack.addWorker(workerEnv('batch-parent-only.mjs'));
    const childWorker = await stack.addWorker(workerEnv('batch-children-only.mjs'));
    const id = await startTask(
      stack.mcp,
      'fan_out',
      { items: items(60), concurrency: CONCURRENCY, replayMs: 5_000 },
      { ttl: 300_000 },
    );
    // The parent's first replay (woken by its children) sleeps: kill its worker then.
    await waitFor(() => trace(file).filter((l) => l.what === 'parent-start').length >= 2, {
      timeoutMs: 30_000,
      message: 'the parent replayed',
    });
    await parentWorker.kill('SIGKILL');
    const killedAt = trace(file).length;
    // No worker of the parent is left to take its run over: the children finish the batch by themselves.
    await waitFor(() => trace(file).filter((l) => l.what === 'done').length >= 60, {
      timeoutMs: 60_000,
      message: 'every child done while the parent was lost',
    });
    const after = trace(file).slice(killedAt);
    expect(after.filter((l) => l.what === 'start').length).toBeGreaterThan(CONCURRENCY);
    expect(after.every((l) => l.pid === childWorker.pid)).toBe(true);
    // A new worker of the parent takes its run over (BullMQ's stall check); its replay finds every child recorded.
    await stack.addWorker(workerEnv('batch-parent-only.mjs'));
    const result = await taskResult(stack.mcp, id, 60_000);
    expect(result.structuredContent).toMatchObject({ total: 60, completed: 60, failed: 0 });
  }, 150_000);
});

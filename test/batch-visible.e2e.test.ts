/**
 * PROTOCOL.md §26.9 (issue 23, item 8): a batch is visible like any task. The worker's metrics count its children
 * (released, and recorded by outcome) as they run, not only at the end; the `taskrelay` CLI shows a `batch_report`
 * task's progress off a TTY (plain and JSON lines) moving through its children's count. Its bar on a TTY is in
 * test/cli-tty.e2e.test.ts (the terminal project, which has tmux).
 */
import getPort from 'get-port';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { readMetric, type GatewayProcess } from './helpers/processes.js';
import { runCli } from './helpers/cli.js';
import { startTask, taskResult } from './helpers/tasks.js';

const metricsPort = await getPort({ host: '127.0.0.1' });
const stack = useStack({
  name: 'batch-visible',
  gateways: [{ LOG_LEVEL: 'warn' }],
  workers: [{ WORKER_CONCURRENCY: '4', WORKER_METRICS_PORT: String(metricsPort) }],
  mcp: true,
});
let gateway: GatewayProcess;
let client: Client;
/** readMetric() wants an `/mcp` URL and reads its sibling `/metrics`. */
const workerUrl = `http://127.0.0.1:${metricsPort}/mcp`;

beforeAll(() => {
  ({ gateway, mcp: client } = stack);
});

const w = (name: string, labels: Record<string, string> = {}) => readMetric(workerUrl, name, labels);
const CHILDREN = 'taskrelay_worker_batch_children_total';
const RELEASED = 'taskrelay_worker_batch_children_released_total';
const child = { tool: 'build_report' };
const reports = (n: number, tag: string) => Array.from({ length: n }, (_v, i) => `${tag}${i}`);

describe('§26.9 metrics count a batch’s children', () => {
  it('as they are recorded, each once, and the releases', async () => {
    const completedBefore = await w(CHILDREN, { ...child, outcome: 'completed' });
    const releasedBefore = await w(RELEASED, child);
    // 40 children of 5 × 40 ms on 4 slots: seconds of recording to watch the counter through.
    const taskId = await startTask(client, 'batch_report', { reports: reports(40, 'm'), items: 5, delayMs: 40 });
    const seen = new Set<number>();
    await waitFor(
      async () => {
        const counted = (await w(CHILDREN, { ...child, outcome: 'completed' })) - completedBefore;
        seen.add(counted);
        return counted === 40;
      },
      { timeoutMs: 60_000, intervalMs: 20, message: 'the children were not all counted' },
    );
    // The counter moved during the batch (not once at its end): values strictly between none and all were read.
    expect(
      [...seen].filter((n) => n > 0 && n < 40).length,
      `counter values read: ${[...seen].join(',')}`,
    ).toBeGreaterThan(1);
    const result = await taskResult(client, taskId, 30_000);
    expect(result.structuredContent).toMatchObject({ completed: 40, failed: 0 });
    expect((await w(CHILDREN, { ...child, outcome: 'completed' })) - completedBefore).toBe(40);
    expect(await w(CHILDREN, { ...child, outcome: 'failed' })).toBe(0);
    expect((await w(RELEASED, child)) - releasedBefore).toBe(40);
  }, 90_000);
});

describe('§26.9 the CLI shows a batch like any task', () => {
  it('off a TTY: plain and JSON progress lines through the children’s count, then the result', async () => {
    const env = { TASKRELAY_URL: gateway.url };
    const list = JSON.stringify(reports(12, 'p'));
    const plain = await runCli(['call', 'batch_report', `reports=${list}`, 'items=3', 'delayMs=30'], env);
    expect(plain.code, plain.stderr).toBe(0);
    const lines = plain.stdout.trim().split('\n');
    expect(lines.at(-1)).toMatch(/^completed: /);
    const values = lines.slice(0, -1).flatMap((line) => {
      const m = /^batch_report (\d+)\/12 \1 of 12 children done \(0 failed\)$/.exec(line);
      return m ? [Number(m[1])] : [];
    });
    expect(values.length, plain.stdout).toBeGreaterThan(1);
    expect(values.at(-1)).toBe(12);
    for (let i = 1; i < values.length; i++) expect(values[i]!).toBeGreaterThan(values[i - 1]!);

    const json = await runCli(['--json', 'call', 'batch_report', `reports=${list}`, 'items=3', 'delayMs=30'], env);
    expect(json.code, json.stderr).toBe(0);
    const progress = json.lines.filter((l) => l['type'] === 'progress');
    expect(progress.length).toBeGreaterThan(1);
    expect(progress.every((p) => p['total'] === 12 && p['tool'] === 'batch_report')).toBe(true);
    expect(progress.at(-1)).toMatchObject({ progress: 12, total: 12, message: '12 of 12 children done (0 failed)' });
    const result = json.lines.at(-1)!;
    expect(result['status']).toBe('completed');
    expect((result['result'] as { structuredContent: { completed: number } }).structuredContent.completed).toBe(12);
  }, 90_000);
});

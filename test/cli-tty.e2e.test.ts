/**
 * Issue 13, docs/CLI.md: `taskrelay call --parallel 3` on a real terminal (a tmux pane on a private tmux server):
 * one live bar per call, each moving on its own and never mixed; cancelling one leaves the others running; Ctrl-C
 * cancels the rest (tasks/cancel) and exits 130.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, existsSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import {
  ROOT,
  connectClient,
  startGatewayProcess,
  startWorkerProcess,
  stopAll,
  type GatewayProcess,
} from './helpers/processes.js';
import { CLI_MAIN, runCli } from './helpers/cli.js';

const socket = `taskrelay-test-${randomBytes(4).toString('hex')}`;
const tmux = (...args: string[]) => execFileSync('tmux', ['-u', '-L', socket, ...args], { encoding: 'utf8' });

let redis: TestRedis;
let gateway: GatewayProcess;
let client: Client;
let dir: string;

beforeAll(async () => {
  redis = await startRedis();
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('clitty') };
  gateway = await startGatewayProcess(env);
  await startWorkerProcess(env);
  client = await connectClient(gateway.url);
  dir = mkdtempSync(join(tmpdir(), 'taskrelay-cli-tty-'));
});

afterAll(async () => {
  try {
    tmux('kill-server');
  } catch {
    // already gone
  }
  await client?.close();
  await stopAll();
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

interface BarRow {
  call: number;
  value: number;
  total: number;
  status: string;
  message: string;
}

const BAR_ROW = /^#(\d) build_report\s+[█░]{30}\s+(\d+)\/(\d+)\s+\d+% (\w+) ?(.*)$/;

/** The screen as the user sees it, and its bar rows. */
function screen(): { text: string; bars: BarRow[]; taskIds: Map<number, string> } {
  const text = tmux('capture-pane', '-p', '-t', 'cli');
  const bars: BarRow[] = [];
  const taskIds = new Map<number, string>();
  for (const line of text.split('\n')) {
    const bar = BAR_ROW.exec(line.trimEnd());
    if (bar) {
      bars.push({
        call: Number(bar[1]),
        value: Number(bar[2]),
        total: Number(bar[3]),
        status: bar[4]!,
        message: bar[5]!,
      });
    }
    const task = /^#(\d) task ([0-9a-f]+)$/.exec(line.trimEnd());
    if (task) taskIds.set(Number(task[1]), task[2]!);
  }
  return { text, bars, taskIds };
}

function bar(rows: BarRow[], call: number): BarRow | undefined {
  return rows.find((r) => r.call === call);
}

describe('taskrelay CLI on a TTY', () => {
  it('shows three independent bars, one cancelled alone, the rest cancelled by Ctrl-C (exit 130)', async () => {
    const exitFile = join(dir, 'exit');
    // Call i waits i·10 ms per item: three speeds, so the bars cannot move together by accident.
    const command =
      `TASKRELAY_URL=${gateway.url} ${process.execPath} ${CLI_MAIN} call build_report 'report=r{i}' items=3000 ` +
      `'delayMs={i}0' --task --parallel 3; echo $? > ${exitFile}`;
    tmux('new-session', '-d', '-s', 'cli', '-x', '130', '-y', '16', '-c', ROOT, command);

    // Three bars, one row each, every row naming its own report.
    let shown = '';
    await waitFor(
      () => {
        const { bars, taskIds, text } = screen();
        shown = text;
        return taskIds.size === 3 && [1, 2, 3].every((n) => (bar(bars, n)?.value ?? 0) > 0);
      },
      { timeoutMs: 20_000, message: 'three moving bars never showed' },
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the screen:\n${shown}`);
    });
    const first = screen();
    expect(first.bars.map((b) => b.call)).toEqual([1, 2, 3]);
    for (const b of first.bars) {
      expect(b.total).toBe(3000);
      expect(b.status).toBe('working');
      expect(b.message).toMatch(new RegExp(`^Processed ${b.value} of 3000 items for r${b.call}$`));
    }

    // Cancel call 2 from another command: its bar stops at `cancelled`, the other two go on moving.
    const cancelled = await runCli(['cancel', first.taskIds.get(2)!], { TASKRELAY_URL: gateway.url });
    expect(cancelled.code).toBe(0);
    await waitFor(() => bar(screen().bars, 2)?.status === 'cancelled', {
      timeoutMs: 10_000,
      message: 'bar 2 never showed cancelled',
    });
    const afterCancel = screen();
    const stopped = bar(afterCancel.bars, 2)!;
    await waitFor(
      () => {
        const now = screen().bars;
        return [1, 3].every((n) => bar(now, n)!.value > bar(afterCancel.bars, n)!.value);
      },
      { timeoutMs: 10_000, message: 'bars 1 and 3 stopped moving after bar 2 was cancelled' },
    );
    const later = screen();
    expect(bar(later.bars, 2)).toEqual(stopped);
    expect([bar(later.bars, 1)!.status, bar(later.bars, 3)!.status]).toEqual(['working', 'working']);
    expect(later.bars).toHaveLength(3);
    saveCapture(tmux('capture-pane', '-p', '-e', '-t', 'cli'));

    // Ctrl-C: the two running tasks are cancelled before the CLI exits 130.
    tmux('send-keys', '-t', 'cli', 'C-c');
    await waitFor(() => existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '', {
      timeoutMs: 15_000,
      message: 'the CLI did not exit after Ctrl-C',
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('130');
    for (const n of [1, 2, 3]) {
      expect((await client.experimental.tasks.getTask(first.taskIds.get(n)!)).status).toBe('cancelled');
    }
  });
});

describe('taskrelay CLI answers a tool’s question on a TTY', () => {
  it('prompts for wait_for_approval, sends the answer, and the task completes approved (exit 0)', async () => {
    const exitFile = join(dir, 'exit-elicit');
    const outFile = join(dir, 'out-elicit');
    const command =
      `TASKRELAY_URL=${gateway.url} ${process.execPath} ${CLI_MAIN} call wait_for_approval 'question=Ship it?' ` +
      `--task; echo $? > ${exitFile}`;
    tmux('new-session', '-d', '-s', 'ask', '-x', '130', '-y', '16', '-c', ROOT, command);
    tmux('pipe-pane', '-t', 'ask', '-o', `cat >> ${outFile}`);
    let shown = '';
    await waitFor(
      () => {
        shown = tmux('capture-pane', '-p', '-t', 'ask');
        return /Ship it\?/.test(shown) && /Approve\? \[y\/n\]:/.test(shown);
      },
      { timeoutMs: 20_000, message: 'the question never showed' },
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the screen:\n${shown}`);
    });
    tmux('send-keys', '-t', 'ask', 'y', 'Enter');
    await waitFor(() => existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '', {
      timeoutMs: 20_000,
      message: 'the CLI did not exit after the answer',
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('0');
    const taskId = /task ([0-9a-f]{32})/.exec(readFileSync(outFile, 'utf8'))?.[1];
    expect(taskId).toBeDefined();
    const result = await client.experimental.tasks.getTaskResult(taskId!, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ approved: true });
  });
});

/** The coloured screen, for the README's terminal picture (`scripts/render-terminal.mjs`); not an assertion. */
function saveCapture(text: string): void {
  const out = resolve(ROOT, '.tmp');
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'cli-tty-capture.ansi'), text);
}

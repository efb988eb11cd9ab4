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
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { ROOT } from './helpers/processes.js';
import { CLI_MAIN, runCli } from './helpers/cli.js';
import { absenceWindow } from './helpers/load.js';

const CLI_TOOLS = resolve(ROOT, 'test/fixtures/cli-tools.mjs');
const socket = `taskrelay-test-${randomBytes(4).toString('hex')}`;
const tmux = (...args: string[]) => execFileSync('tmux', ['-u', '-L', socket, ...args], { encoding: 'utf8' });

const stack = useStack({
  name: 'clitty',
  workers: [{}, { TASKRELAY_TOOLS: CLI_TOOLS, TASKRELAY_QUEUE: 'cli-fixtures' }],
});
let client: Client;
let dir: string;

beforeAll(async () => {
  client = await stack.client();
  dir = mkdtempSync(join(tmpdir(), 'taskrelay-cli-tty-'));
});

afterAll(() => {
  try {
    tmux('kill-server');
  } catch {
    // already gone
  }
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
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call build_report 'report=r{i}' items=3000 ` +
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
    const cancelled = await runCli(['cancel', first.taskIds.get(2)!], { TASKRELAY_URL: stack.gateway.url });
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
    const goFile = join(dir, 'go-elicit');
    // The CLI starts once the pane's output is piped to the file (a CLI faster than pipe-pane printed its task line
    // before the pipe existed, seen once on a loaded machine).
    const command =
      `while [ ! -e ${goFile} ]; do sleep 0.05; done; ` +
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call wait_for_approval 'question=Ship it?' ` +
      `--task; echo $? > ${exitFile}`;
    tmux('new-session', '-d', '-s', 'ask', '-x', '130', '-y', '16', '-c', ROOT, command);
    tmux('pipe-pane', '-t', 'ask', '-o', `cat >> ${outFile}`);
    writeFileSync(goFile, '');
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
    // The pane's output reaches the file through tmux and `cat`, which may still be writing after the CLI exited.
    const taskId = await waitFor(() => /task ([0-9a-f]{32})/.exec(readFileSync(outFile, 'utf8'))?.[1], {
      timeoutMs: 10_000,
      message: "no task line in the pane's output",
    });
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ approved: true });
  });
});

describe('taskrelay CLI asks a question on a TTY with its bar on screen', () => {
  it('prints the question once, stops the bar while the answer is typed on the prompt line, then draws it again', async () => {
    const exitFile = join(dir, 'exit-ask-bar');
    const outFile = join(dir, 'out-ask-bar');
    // No --task: the tool requires one, so the CLI runs it as a task (and the question may come on two streams).
    const goFile = join(dir, 'go-ask-bar');
    const command =
      // The CLI starts once the pane's output is piped to the file.
      `while [ ! -e ${goFile} ]; do sleep 0.05; done; ` +
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call ask_after_progress 'question=Ship it?'; ` +
      // The pane stays open after the CLI exits, to read its last screen.
      `echo $? > ${exitFile}; sleep 120`;
    tmux('new-session', '-d', '-s', 'askbar', '-x', '130', '-y', '16', '-c', ROOT, command);
    tmux('pipe-pane', '-t', 'askbar', '-o', `cat >> ${outFile}`);
    writeFileSync(goFile, '');
    const lines = () =>
      tmux('capture-pane', '-p', '-t', 'askbar')
        .split('\n')
        .map((l) => l.trimEnd());
    let shown: string[] = [];
    await waitFor(
      () => {
        shown = lines();
        return shown.includes('Approve? [y/n]:');
      },
      { timeoutMs: 20_000, message: 'the question never showed' },
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the screen:\n${shown.join('\n')}`);
    });
    // The bar was on screen before the question came (the piped copy of the pane may lag the screen).
    await waitFor(() => /ask_after_progress\s+[█░]{30}\s+1\/3/.test(readFileSync(outFile, 'utf8')), {
      timeoutMs: 10_000,
      message: "the pane's output never showed the bar before the question",
    });
    tmux('send-keys', '-t', 'askbar', 'y');
    // Several redraws at 20 fps: the typed answer stays on the prompt line, and no bar is drawn over it.
    await absenceWindow(600);
    const asking = lines();
    expect(asking.filter((l) => l === 'Ship it?')).toHaveLength(1);
    expect(asking.filter((l) => l.startsWith('Approve?'))).toEqual(['Approve? [y/n]: y']);
    expect(asking.some((l) => /[█░]/.test(l))).toBe(false);
    tmux('send-keys', '-t', 'askbar', 'Enter');
    await waitFor(() => existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '', {
      timeoutMs: 20_000,
      message: 'the CLI did not exit after the answer',
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('0');
    const after = lines();
    const answered = after.indexOf('Approve? [y/n]: y');
    expect(answered).toBeGreaterThan(0);
    // The bar again, below the answer, at its end.
    expect(
      after.slice(answered + 1).some((l) => /^#1 ask_after_progress\s+█{30}\s+3\/3 100% completed Approved$/.test(l)),
    ).toBe(true);
    expect(after.filter((l) => l === 'Ship it?')).toHaveLength(1);
  });
});

describe('taskrelay CLI asks a question once', () => {
  it('when the question comes on two streams of its session (a plain call of a task-required tool)', async () => {
    const exitFile = join(dir, 'exit-once');
    const command =
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call wait_for_approval 'question=Once?'; ` +
      `echo $? > ${exitFile}; sleep 120`;
    tmux('new-session', '-d', '-s', 'once', '-x', '130', '-y', '16', '-c', ROOT, command);
    const lines = () =>
      tmux('capture-pane', '-p', '-t', 'once')
        .split('\n')
        .map((l) => l.trimEnd());
    await waitFor(() => lines().includes('Approve? [y/n]:'), {
      timeoutMs: 20_000,
      message: 'the question never showed',
    });
    // Both deliveries have arrived by now (they come together); a second prompt would show under the first.
    await absenceWindow(1_000);
    tmux('send-keys', '-t', 'once', 'y', 'Enter');
    await waitFor(() => existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '', {
      timeoutMs: 20_000,
      message: 'the CLI did not exit after the answer',
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('0');
    const screen = lines();
    expect(
      screen.filter((l) => l === 'Once?'),
      screen.join('\n'),
    ).toHaveLength(1);
    expect(screen.filter((l) => l.startsWith('Approve?'))).toEqual(['Approve? [y/n]: y']);
    expect(screen.some((l) => /completed Approved: Once\?$/.test(l))).toBe(true);
  });
});

describe('taskrelay CLI with more calls than the terminal has rows', () => {
  it('draws a bar for the calls that fit and one summary row for the rest, never more rows than the screen', async () => {
    const exitFile = join(dir, 'exit-many');
    const command =
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call build_report 'report=m{i}' items=3000 ` +
      `delayMs=20 --task --parallel 8; echo $? > ${exitFile}`;
    // 6 rows: 4 bars and the summary fit under one log line.
    tmux('new-session', '-d', '-s', 'many', '-x', '130', '-y', '6', '-c', ROOT, command);
    const rows = () =>
      tmux('capture-pane', '-p', '-t', 'many')
        .split('\n')
        .map((l) => l.trimEnd())
        .filter(Boolean);
    let shown: string[] = [];
    const settled = (screen: string[]) => {
      const bars = screen.map((l) => BAR_ROW.exec(l)).filter((m) => m !== null);
      return (
        bars.length === 4 && bars.every((m) => Number(m[2]) > 0) && /^\+4 more: 4 working$/.test(screen.at(-1) ?? '')
      );
    };
    await waitFor(
      () => {
        shown = rows();
        return settled(shown);
      },
      { timeoutMs: 25_000, message: 'four moving bars and a summary never showed' },
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the screen:\n${shown.join('\n')}`);
    });
    // A while later still the same layout, every bar row whole and in order: the redraw reaches every row it drew.
    await absenceWindow(1_000);
    const later = rows();
    expect(settled(later), later.join('\n')).toBe(true);
    const bars = later.map((l) => BAR_ROW.exec(l)).filter((m) => m !== null);
    expect(bars.map((m) => Number(m[1]))).toEqual([1, 2, 3, 4]);
    for (const line of later)
      expect(line, later.join('\n')).toMatch(/^(#\d task [0-9a-f]{32}|#\d build_report .*|\+4 more: .*)$/);
    tmux('send-keys', '-t', 'many', 'C-c');
    await waitFor(() => existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '', {
      timeoutMs: 20_000,
      message: 'the CLI did not exit after Ctrl-C',
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('130');
  });
});

/** The coloured screen, for the README's terminal picture (`scripts/render-terminal.mjs`); not an assertion. */
describe('taskrelay CLI shows a batch’s bar on a TTY (PROTOCOL.md §26.9)', () => {
  it('draws one live bar for batch_report that moves through the children’s count to its end', async () => {
    const exitFile = join(dir, 'exit-batch');
    // 30 children of 10 × 30 ms on 4 slots: a couple of seconds of bar.
    const list = JSON.stringify(Array.from({ length: 30 }, (_v, i) => `t${i}`));
    const command =
      `TASKRELAY_URL=${stack.gateway.url} ${process.execPath} ${CLI_MAIN} call batch_report 'reports=${list}' items=10 ` +
      `delayMs=30 --task; echo $? > ${exitFile}; sleep 120`;
    tmux('new-session', '-d', '-s', 'batch', '-x', '130', '-y', '16', '-c', ROOT, command);
    const BAR = /batch_report\s+[█░]{30}\s+(\d+)\/(\d+)\s+\d+% (\w+) ?(.*)$/;
    const values = new Set<number>();
    let shown = '';
    await waitFor(
      () => {
        shown = tmux('capture-pane', '-p', '-t', 'batch');
        for (const line of shown.split('\n')) {
          const bar = BAR.exec(line.trimEnd());
          if (!bar) continue;
          expect(Number(bar[2])).toBe(30);
          if (bar[3] === 'working') {
            expect(bar[4]).toMatch(new RegExp(`^${bar[1]} of 30 children done \\(0 failed\\)$`));
          }
          values.add(Number(bar[1]));
        }
        return existsSync(exitFile) && readFileSync(exitFile, 'utf8').trim() !== '';
      },
      { timeoutMs: 60_000, intervalMs: 50, message: 'the CLI did not finish the batch' },
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the screen:\n${shown}`);
    });
    expect(readFileSync(exitFile, 'utf8').trim()).toBe('0');
    // The bar was drawn part way (children done, not all), and ended with the result.
    expect([...values].filter((n) => n > 0 && n < 30).length, `bar values: ${[...values].join(',')}`).toBeGreaterThan(
      0,
    );
    expect(tmux('capture-pane', '-p', '-t', 'batch')).toMatch(/completed/);
  }, 90_000);
});

function saveCapture(text: string): void {
  const out = resolve(ROOT, '.tmp');
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'cli-tty-capture.ansi'), text);
}

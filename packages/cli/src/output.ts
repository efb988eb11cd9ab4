/**
 * The three ways the CLI shows running calls (docs/CLI.md): live bars on a TTY (one per call, each redrawn in its
 * own row, so concurrent calls never mix), one plain line per update otherwise, or one JSON object per line.
 */
import { MultiBar, type SingleBar } from 'cli-progress';
import type { CallToolResult, Task } from '@modelcontextprotocol/sdk/types.js';

export interface Progress {
  progress: number;
  total?: number;
  message?: string;
}

/** How a call or a watched task ended. */
export interface Outcome {
  /** `stopped`: `watch` stopped watching (Ctrl-C); the task itself goes on. */
  status: 'completed' | 'failed' | 'cancelled' | 'stopped';
  taskId?: string;
  result?: CallToolResult;
  /** Why it failed when there is no tool result (a JSON-RPC error, a lost connection). */
  error?: string;
}

/** One running call's view: its bar, its prefixed lines, or its JSON lines. */
export interface CallView {
  task(task: Task): void;
  progress(update: Progress): void;
  end(outcome: Outcome): void;
}

export interface Reporter {
  /** A view for call number `n` (1-based) of `label` (the tool name or the watched task id). */
  open(n: number, label: string): CallView;
  /** Ends live output (bars stop redrawing); prints nothing more after. */
  close(): void;
}

/** A view that shows nothing (`taskrelay result` prints only the ending). */
export const SILENT_VIEW: CallView = { task: () => undefined, progress: () => undefined, end: () => undefined };

export type OutputMode = 'tty' | 'plain' | 'json';

export function createReporter(mode: OutputMode, stream: NodeJS.WriteStream, calls: number): Reporter {
  if (mode === 'json') return new JsonReporter(stream);
  if (mode === 'plain') return new PlainReporter(stream, calls > 1);
  return new BarReporter(stream, calls);
}

/** The text a human reads from a tool result: its text blocks, else its structured content as JSON. */
export function resultText(result: CallToolResult | undefined): string {
  if (!result) return '';
  const texts = result.content.flatMap((block) => (block.type === 'text' ? [block.text] : []));
  if (texts.length > 0) return texts.join('\n');
  return result.structuredContent ? JSON.stringify(result.structuredContent) : '';
}

export function outcomeLine(outcome: Outcome): string {
  const detail = outcome.error ?? resultText(outcome.result);
  if (outcome.status === 'stopped') return detail || 'stopped watching';
  return detail ? `${outcome.status}: ${detail}` : outcome.status;
}

export function taskLine(task: Task): string {
  return [task.taskId, task.status, task.statusMessage ?? ''].join('  ').trimEnd();
}

class JsonReporter implements Reporter {
  constructor(private readonly out: NodeJS.WritableStream) {}

  open(n: number, label: string): CallView {
    const write = (line: Record<string, unknown>) => this.out.write(`${JSON.stringify({ ...line, call: n })}\n`);
    let taskId: string | undefined;
    return {
      task: (task) => {
        taskId = task.taskId;
        write({ type: 'task', task });
      },
      progress: (p) =>
        write({ type: 'progress', tool: label, taskId, progress: p.progress, total: p.total, message: p.message }),
      end: (o) => write({ type: 'result', status: o.status, taskId: o.taskId, result: o.result, error: o.error }),
    };
  }

  close(): void {}
}

class PlainReporter implements Reporter {
  constructor(
    private readonly out: NodeJS.WritableStream,
    private readonly numbered: boolean,
  ) {}

  open(n: number, label: string): CallView {
    const prefix = this.numbered ? `[${n}] ` : '';
    const write = (text: string) => this.out.write(`${prefix}${text}\n`);
    let lastStatus: string | undefined;
    return {
      task: (task) => {
        if (lastStatus === undefined) write(`task ${task.taskId} ${task.status}`);
        else if (task.status !== lastStatus) write(`status ${task.status}`);
        lastStatus = task.status;
      },
      progress: (p) => write(`${label} ${fraction(p)}${p.message ? ` ${p.message}` : ''}`),
      end: (o) => write(outcomeLine(o)),
    };
  }

  close(): void {}
}

const BAR_WIDTH = 30;
const COLOURS: Record<string, string> = {
  completed: '\u001b[32m',
  failed: '\u001b[31m',
  cancelled: '\u001b[33m',
  input_required: '\u001b[36m',
};
const RESET = '\u001b[0m';
const ERASE_TO_END = '\u001b[0K';

interface BarPayload {
  label: string;
  status: string;
  message: string;
  /** The server gave no total: show a count, not a fraction of an invented total. */
  unknownTotal: boolean;
  /** The summary row: `label` alone, no bar. */
  plain?: boolean;
}

/**
 * While live bars are drawn they redraw their rows many times a second, over whatever the terminal shows there: a
 * tool's question (elicit.ts) stops them first. `pauseBars()` erases the bars and stops their redraw, so the question
 * and its typed answer get ordinary lines below what was printed; the function it returns draws the bars again, below
 * the answer. Undefined when no bars are shown.
 */
export let pauseBars: (() => () => void) | undefined;

/** One call's row: what its bar shows, kept here so the bars can be drawn again after a pause. */
interface Row {
  payload: BarPayload;
  value: number;
  total: number;
  bar: SingleBar | undefined;
}

/**
 * Rows the bars may use: a terminal shorter than the bars scrolls, and the redraw can no longer reach the top ones.
 * Some terminals report 0 rows (a pty made by `script`, some IDE terminals): then `LINES`, else 24.
 */
export function barRows(stream: { rows?: number }, env: NodeJS.ProcessEnv = process.env): number {
  const lines = Number(env['LINES']);
  const rows = stream.rows !== undefined && stream.rows > 0 ? stream.rows : lines > 0 ? lines : 24;
  return Math.max(2, rows - 1);
}

class BarReporter implements Reporter {
  private bars: MultiBar;
  private readonly rows: Row[] = [];
  /** Calls past the terminal's rows: counted on one summary row instead of a bar each. */
  private readonly hidden: Row[] = [];
  private summary: SingleBar | undefined;
  private paused = false;
  /** Lines logged while paused, printed when the bars come back. */
  private readonly held: string[] = [];
  private readonly shownBars: number;

  constructor(
    private readonly out: NodeJS.WriteStream,
    calls: number,
  ) {
    const room = barRows(out);
    // All bars when they fit; else one row less, for the summary of the rest.
    this.shownBars = calls <= room ? calls : room - 1;
    this.bars = this.multiBar();
    pauseBars = () => this.pause();
  }

  private multiBar(): MultiBar {
    return new MultiBar({
      stream: this.out,
      hideCursor: true,
      clearOnComplete: false,
      stopOnComplete: false,
      gracefulExit: false,
      // Redraw on every update (throttled to fps), so each bar follows its own call.
      fps: 20,
      format: (_options, params, payload: BarPayload) =>
        renderBar(params.value, params.total, payload, this.out.columns),
    });
  }

  private log(text: string): void {
    // cli-progress clears only the first row it logs over: end each line with erase-to-end-of-line, or what is left
    // of the bar drawn there before shows after the text.
    if (this.paused) this.held.push(text);
    else this.bars.log(`${text}${ERASE_TO_END}\n`);
  }

  open(n: number, label: string): CallView {
    const payload: BarPayload = { label: `#${n} ${label}`, status: 'starting', message: '', unknownTotal: true };
    const row: Row = { payload, value: 0, total: 1, bar: undefined };
    if (this.rows.length < this.shownBars) {
      this.rows.push(row);
      if (!this.paused) row.bar = this.bars.create(row.total, row.value, payload);
    } else {
      this.hidden.push(row);
      this.drawSummary();
    }
    const visible = this.rows.includes(row);
    const redraw = () => (visible ? row.bar?.update(row.value, payload) : this.drawSummary());
    const log = (text: string) => {
      if (visible) this.log(`#${n} ${text}`);
    };
    let ended = false;
    return {
      task: (task) => {
        if (payload.status === 'starting') log(`task ${task.taskId}`);
        payload.status = task.status;
        redraw();
      },
      progress: (p) => {
        if (ended) return;
        payload.message = p.message ?? '';
        payload.unknownTotal = p.total === undefined;
        if (payload.status === 'starting') payload.status = 'working';
        row.total = p.total ?? Math.max(p.progress, 1);
        row.value = p.progress;
        row.bar?.setTotal(row.total);
        redraw();
      },
      end: (o) => {
        ended = true;
        payload.status = o.status;
        payload.message = o.error ?? (oneLineOf(resultText(o.result)) || payload.message);
        if (o.status === 'completed' && !o.result?.isError) row.value = row.total;
        redraw();
      },
    };
  }

  /** The row under the bars for the calls that have none: how many, and where they are. */
  private drawSummary(): void {
    if (this.hidden.length === 0) return;
    const counts = new Map<string, number>();
    for (const row of this.hidden) counts.set(row.payload.status, (counts.get(row.payload.status) ?? 0) + 1);
    const text = `+${this.hidden.length} more: ${[...counts].map(([status, n]) => `${n} ${status}`).join(', ')}`;
    const payload: BarPayload = { label: text, status: '', message: '', unknownTotal: true, plain: true };
    if (this.paused) return;
    if (this.summary) this.summary.update(0, payload);
    else this.summary = this.bars.create(1, 0, payload);
  }

  private pause(): () => void {
    if (this.paused) return () => undefined;
    this.paused = true;
    // Print what was logged, then erase the bars and stop the redraw; the cursor is left where they began.
    this.bars.update();
    const options = (this.bars as unknown as { options: { clearOnComplete: boolean } }).options;
    options.clearOnComplete = true;
    this.bars.stop();
    for (const row of this.rows) row.bar = undefined;
    this.summary = undefined;
    let resumed = false;
    return () => {
      if (resumed) return;
      resumed = true;
      this.paused = false;
      this.bars = this.multiBar();
      for (const text of this.held.splice(0)) this.log(text);
      for (const row of this.rows) row.bar = this.bars.create(row.total, row.value, row.payload);
      this.drawSummary();
    };
  }

  close(): void {
    pauseBars = undefined;
    if (!this.paused) this.bars.stop();
  }
}

function renderBar(value: number, total: number, p: BarPayload, columns: number | undefined): string {
  if (p.plain) return [...p.label].slice(0, (columns ?? 120) - 1).join('');
  const share = p.unknownTotal || total <= 0 ? 0 : Math.min(1, value / total);
  const filled = Math.round(share * BAR_WIDTH);
  const bar = '█'.repeat(filled) + '░'.repeat(BAR_WIDTH - filled);
  const count = p.unknownTotal ? `${value}` : `${value}/${total} ${Math.floor(share * 100)}%`;
  const colour = COLOURS[p.status];
  const status = colour ? `${colour}${p.status}${RESET}` : p.status;
  const line = `${p.label.padEnd(20)} ${bar} ${count.padStart(13)} ${status} ${p.message}`;
  // A line wider than the terminal wraps and breaks the row-per-bar redraw: cut it (by code points; ANSI adds 9).
  const width = (columns ?? 120) - 1 + (colour ? COLOURS[p.status]!.length + RESET.length : 0);
  return [...line].slice(0, width).join('');
}

function fraction(p: Progress): string {
  return p.total === undefined ? `${p.progress}` : `${p.progress}/${p.total}`;
}

function oneLineOf(text: string): string {
  return text.split('\n')[0] ?? '';
}

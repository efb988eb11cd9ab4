import type { StoreRunner } from './store-runner.js';
import { SCRIPTS } from '../protocol/scripts.js';

/** The most log lines a task keeps (PROTOCOL.md §30.4), and the longest one, in bytes (a longer one is cut). */
export const MAX_KEPT_LOG_LINES = 1_000;
export const MAX_KEPT_LOG_LINE_BYTES = 2_048;

/** A kept log line as readers get it: its stream id and time, then the line's own fields. */
export type KeptLogLine = Record<string, unknown> & { id: string; time: string };

/** A task's kept log lines (PROTOCOL.md §30.4): a run's output beside its result. */
export class RunLogs {
  constructor(private readonly runner: StoreRunner) {}

  /**
   * Keeps a run's log lines (each a JSON object as text) with its task (PROTOCOL.md §30.4): at most `MAX_KEPT_LOG_LINES`
   * per task. Nothing is written for a task that is gone.
   */
  async keep(taskId: string, lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    await this.runner.call(SCRIPTS.logKeep, {
      keys: { task: this.runner.forTask(taskId).task(taskId), logs: this.runner.forTask(taskId).taskLogs(taskId) },
      args: { maxLen: MAX_KEPT_LOG_LINES, lines: JSON.stringify(lines) },
    });
  }

  /** Up to `limit` kept log lines of a task after the line `after` (oldest first), each with its stream id. */
  async read(taskId: string, after: string | undefined, limit: number): Promise<KeptLogLine[]> {
    const start = after === undefined ? '-' : `(${after}`;
    const entries = await this.runner.redis.xrange(
      this.runner.forTask(taskId).taskLogs(taskId),
      start,
      '+',
      'COUNT',
      limit,
    );
    return entries.map(([id, fields]) => {
      const text = fields[fields.indexOf('line') + 1] ?? '{}';
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text) as Record<string, unknown>;
      } catch {
        line = { msg: text };
      }
      return { id, time: new Date(Number(id.split('-')[0])).toISOString(), ...line };
    });
  }
}

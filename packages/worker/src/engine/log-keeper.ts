/**
 * Keeps a run's `ctx.log` lines with its task (PROTOCOL.md §30.4), beside stdout: operators and the task's own
 * principal read them later (`taskrelay logs ID`). pino has no per-call hook that sees each line's level, fields and
 * message once it is enabled, and a destination stream would see every task's lines at once, so the tool's logger is
 * wrapped: each enabled call is also buffered, and the buffer is flushed at most every 100 ms in one script call.
 */
import { format } from 'node:util';
import { MAX_KEPT_LOG_LINE_BYTES, type Logger, type RunLogs } from '@taskrelay/shared';

const LEVELS = new Set(['trace', 'debug', 'info', 'warn', 'error', 'fatal']);
const FLUSH_MS = 100;
/** A burst this long is flushed at once instead of waiting for the timer. */
const FLUSH_LINES = 100;

/** One line as kept: its own fields, then its level, message, time and attempt; cut when over the byte bound. */
export function keptLine(level: string, args: unknown[], attempt: number, now = new Date()): string {
  const [first, ...rest] = args;
  let fields: Record<string, unknown> = {};
  let msg: string;
  if (first instanceof Error) {
    fields = { err: first.message };
    msg = typeof rest[0] === 'string' ? format(...rest) : first.message;
  } else if (typeof first === 'object' && first !== null) {
    fields = { ...(first as Record<string, unknown>) };
    if (fields['err'] instanceof Error) fields['err'] = fields['err'].message;
    msg = typeof rest[0] === 'string' ? format(...rest) : '';
  } else {
    msg = format(first, ...rest);
  }
  const base = { level, msg, time: now.toISOString(), attempt };
  // A field named like one of the line's own keys is kept as `<name>_`, never dropped (the Python worker does the same).
  const own = Object.fromEntries(Object.entries(fields).map(([k, v]) => [k in base ? `${k}_` : k, v]));
  let text: string;
  try {
    text = JSON.stringify({ ...own, ...base });
  } catch {
    text = JSON.stringify(base);
  }
  if (Buffer.byteLength(text) <= MAX_KEPT_LOG_LINE_BYTES) return text;
  const room = Math.max(0, MAX_KEPT_LOG_LINE_BYTES - 300);
  return JSON.stringify({
    ...base,
    msg: `${msg.slice(0, room)}… (cut: the line was over ${MAX_KEPT_LOG_LINE_BYTES} bytes)`,
  });
}

export class TaskLogKeeper {
  private buffer: string[] = [];
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    private readonly store: Pick<RunLogs, 'keep'>,
    private readonly taskId: string,
    private readonly attempt: number,
    /** Where a failed write is said (debug: the line is on stdout anyway). */
    private readonly log: Logger,
  ) {}

  /** `logger`, whose enabled lines (and its children's) are also kept with the task. */
  wrap(logger: Logger): Logger {
    return new Proxy(logger, {
      get: (target, prop, receiver) => {
        if (typeof prop === 'string' && LEVELS.has(prop)) {
          const method = (target as unknown as Record<string, (...a: unknown[]) => void>)[prop]!.bind(target);
          return (...args: unknown[]) => {
            method(...args);
            if (target.isLevelEnabled(prop)) this.keep(keptLine(prop, args, this.attempt));
          };
        }
        if (prop === 'child') {
          return (...a: Parameters<Logger['child']>) => this.wrap(target.child(...a) as unknown as Logger);
        }
        return Reflect.get(target, prop, receiver) as unknown;
      },
    });
  }

  /** Writes what is buffered now; resolves when written (or dropped). Never rejects. */
  flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.buffer.length === 0) return this.flushing;
    const lines = this.buffer;
    this.buffer = [];
    // In order: one write at a time.
    this.flushing = this.flushing.then(() =>
      this.store.keep(this.taskId, lines).catch((error: unknown) => {
        this.log.debug({ err: error, lines: lines.length }, 'log lines not kept with the task');
      }),
    );
    return this.flushing;
  }

  private keep(line: string): void {
    this.buffer.push(line);
    if (this.buffer.length >= FLUSH_LINES) {
      void this.flush();
      return;
    }
    this.timer ??= setTimeout(() => void this.flush(), FLUSH_MS).unref();
  }
}

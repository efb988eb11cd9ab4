import { pino, type Logger, type LoggerOptions } from 'pino';

export type { Logger } from 'pino';

/**
 * Fields never written as they are: bearer tokens and credentials, wherever a request, config or job-API header set
 * is logged.
 */
export const REDACTED_PATHS = [
  'authorization',
  'Authorization',
  'token',
  'authTokens',
  'password',
  'headers.authorization',
  'headers.Authorization',
  'headers.cookie',
  'req.headers.authorization',
  'req.headers.cookie',
  '*.authorization',
  '*.Authorization',
  '*.token',
  '*.authTokens',
  '*.password',
  '*.headers.authorization',
  '*.headers.Authorization',
];

/**
 * The one logger factory: JSON lines on stdout, `LOG_LEVEL` as the level, `component` on every line so logs of the
 * gateway and workers can be told apart and correlated by `taskId`.
 */
export function createLogger(
  component: string,
  options: { level?: string; destination?: NodeJS.WritableStream } = {},
): Logger {
  const opts: LoggerOptions = {
    level: options.level ?? process.env['LOG_LEVEL'] ?? 'info',
    base: { component, pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: { paths: REDACTED_PATHS, censor: '[redacted]' },
  };
  return options.destination ? pino(opts, options.destination) : pino(opts);
}

/**
 * Ends the logger's stdout stream and resolves once every line it took is written (or after `timeoutMs`), for a
 * process about to `process.exit`. Hand-written because pino's own exit hook is not enough: its default destination
 * (sonic-boom, asynchronous) flushes on `exit` with `flushSync`, which writes the lines buffered behind a write still in
 * flight first; under a pipe's back-pressure (a slow log collector) a process's last lines came out of order, or cut.
 * `end()` instead waits for the write in flight, then writes the rest in order and closes. Log nothing after this.
 */
export function endLogs(logger: Logger, timeoutMs = 5_000): Promise<void> {
  const stream = (logger as unknown as Record<symbol, unknown>)[pino.symbols.streamSym];
  if (!isSonicBoom(stream) || stream.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    timer.unref();
    stream.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    stream.end();
  });
}

interface EndableStream {
  destroyed: boolean;
  end(): void;
  once(event: 'close', listener: () => void): void;
}

function isSonicBoom(stream: unknown): stream is EndableStream {
  return (
    typeof stream === 'object' &&
    stream !== null &&
    stream.constructor.name === 'SonicBoom' &&
    typeof (stream as EndableStream).end === 'function'
  );
}

import { pino, type Logger, type LoggerOptions } from 'pino';

export type { Logger } from 'pino';

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
  };
  return options.destination ? pino(opts, options.destination) : pino(opts);
}

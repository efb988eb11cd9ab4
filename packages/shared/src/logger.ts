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

/**
 * `endLogs` (logger.ts): a process that logs into a pipe its reader is not draining, then exits, still delivers every
 * line, whole and in order. Without it pino's exit hook (`flushSync`) wrote the lines queued behind a write in flight
 * first: a worker's lifecycle lines came out `stopped`, `stopping` under a loaded run. Needs the build (`pnpm build`).
 * An integration test only because it spawns a built process; it needs no Redis.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SHARED = fileURLToPath(new URL('../dist/index.js', import.meta.url));
const LINES = 400;

/** A process that logs LINES lines of 4 KB into a pipe nobody reads yet, one more late, then exits (`endLogs` first if `end`). */
function script(end: boolean): string {
  return `
import { createLogger, endLogs } from ${JSON.stringify(SHARED)};
const log = createLogger('t', { level: 'info' });
const pad = 'x'.repeat(4000);
for (let i = 0; i < ${LINES}; i++) log.info({ i, pad }, 'line');
setTimeout(async () => {
  log.info({ i: ${LINES} }, 'line');
  ${end ? 'await endLogs(log);' : ''}
  process.exit(0);
}, 200);
`;
}

async function linesOf(end: boolean): Promise<number[]> {
  const child = spawn(process.execPath, ['--input-type=module', '-e', script(end)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  // Nobody reads the pipe for a while: it fills, and the logger's writes wait on it.
  child.stdout.pause();
  await new Promise((resolve) => setTimeout(resolve, 800));
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stdout.resume();
  await new Promise((resolve) => child.stdout.once('close', resolve));
  return out
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      try {
        return (JSON.parse(l) as { i: number }).i;
      } catch {
        return -1;
      }
    });
}

describe('endLogs', () => {
  it('every line a process logged before its exit is written, whole and in order, though its pipe was full', async () => {
    const seen = await linesOf(true);
    expect(seen).toEqual(Array.from({ length: LINES + 1 }, (_v, i) => i));
  });
});

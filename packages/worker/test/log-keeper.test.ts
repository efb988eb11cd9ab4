/**
 * PROTOCOL.md §30.4: what a run's `ctx.log` keeps with its task. Each enabled line (and its children's) is kept once,
 * with its level, message, fields and attempt; a disabled level is not; a line over the byte bound is cut and says so;
 * lines are flushed together.
 */
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { MAX_KEPT_LOG_LINE_BYTES, createLogger } from '@taskrelay/shared';
import { TaskLogKeeper, keptLine } from '../src/engine/log-keeper.js';

function setup() {
  const printed: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      printed.push(chunk.toString());
      done();
    },
  });
  const logger = createLogger('worker', { level: 'info', destination: sink });
  const kept: Array<{ taskId: string; lines: readonly string[] }> = [];
  const store = {
    keep: (taskId: string, lines: readonly string[]) => {
      kept.push({ taskId, lines });
      return Promise.resolve();
    },
  };
  const keeper = new TaskLogKeeper(store, 't1', 2, logger);
  return { keeper, logger, kept, printed };
}

describe('§30.4 the log keeper', () => {
  it('keeps each enabled line of the tool’s logger and its children, once, and still prints them', async () => {
    const { keeper, logger, kept, printed } = setup();
    const log = keeper.wrap(logger);
    log.info({ report: 'q3' }, 'publishing %s', 'q3');
    log.debug('not enabled');
    log.child({ step: 'fetch' }).warn(new Error('upstream down'));
    await keeper.flush();
    expect(kept).toHaveLength(1);
    const lines = kept[0]!.lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines).toMatchObject([
      { report: 'q3', level: 'info', msg: 'publishing q3', attempt: 2 },
      { err: 'upstream down', level: 'warn', msg: 'upstream down', attempt: 2 },
    ]);
    expect(printed).toHaveLength(2);
    expect(log.isLevelEnabled('info')).toBe(true);
  });

  it("keeps a field named like one of the line's own keys as `<name>_` (a field `attempt` was dropped before)", () => {
    const line = JSON.parse(keptLine('info', [{ attempt: 7, msg: 'mine', n: 1 }, 'step'], 2)) as Record<
      string,
      unknown
    >;
    expect(line).toMatchObject({ attempt: 2, attempt_: 7, msg: 'step', msg_: 'mine', n: 1 });
  });

  it('cuts a line over the byte bound and says so', () => {
    const line = JSON.parse(keptLine('info', ['x'.repeat(10_000)], 1)) as { msg: string };
    expect(Buffer.byteLength(JSON.stringify(line))).toBeLessThanOrEqual(MAX_KEPT_LOG_LINE_BYTES);
    expect(line.msg).toMatch(/cut: the line was over 2048 bytes/);
  });
});

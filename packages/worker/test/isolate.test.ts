/**
 * PROTOCOL.md §31 without a child: the options `defineTool` takes for an isolated tool, errors across the boundary
 * (each decides in `settle` as the original would), and the child's `ctx` proxy against a recorded channel. The runs in
 * real children are in test/isolate.e2e.test.ts.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UnrecoverableError } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, NonRetryableError, ProtocolError, TaskrelayError, serializeError } from '@taskrelay/shared';
import { defineTool } from '../src/define-tool.js';
import { CancelledError, RetryAfterError, SuspendedError } from '../src/errors.js';
import { ChildContext } from '../src/engine/isolate-context.js';
import { fromWireError, toWireError, type ChildMessage } from '../src/engine/isolate-messages.js';
import { checkIsolatedTools, invokeMember, type HostContext } from '../src/engine/isolated-run.js';
import { CONTEXT_SURFACE, ISOLATE_CALLS } from '../src/context-surface.js';
import { settle } from '../src/engine/stages/settle.js';

const base = { name: 'crunch', description: 'Crunches.', inputSchema: z.object({}), run: () => 'ok' };
const here = import.meta.url;

describe('§31.1 defineTool options of an isolated tool', () => {
  it('resolves isolate, module, maxMemoryMb and the kill grace default of 5 s', () => {
    expect(defineTool({ ...base, isolate: 'thread', module: here, maxMemoryMb: 256 }).isolation).toEqual({
      mode: 'thread',
      moduleUrl: here,
      maxMemoryMb: 256,
      killGraceMs: 5_000,
    });
    expect(defineTool({ ...base, isolate: 'process', module: '/srv/tools.js', killGraceMs: 0 }).isolation).toEqual({
      mode: 'process',
      moduleUrl: 'file:///srv/tools.js',
      maxMemoryMb: undefined,
      killGraceMs: 0,
    });
    expect(defineTool(base).isolation).toBeUndefined();
  });

  it('refuses at definition what cannot work, naming the option', () => {
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ isolate: 'process' }, /isolate needs module, the file that defines the tool \(module: import.meta.url\)/],
      [{ isolate: 'fork', module: here }, /isolate /],
      [
        { isolate: 'thread', module: './tools.js' },
        /module must be a file: URL \(import.meta.url\) or an absolute path/,
      ],
      [{ isolate: 'thread', module: here, maxMemoryMb: 32 }, /maxMemoryMb Too small/],
      [{ maxMemoryMb: 256 }, /maxMemoryMb need\(s\) isolate/],
      [{ module: here, killGraceMs: 10 }, /module, killGraceMs need\(s\) isolate/],
      [{ isolate: 'thread', module: here, maxMemoryMB: 256 }, /unknown option 'maxMemoryMB'/],
    ];
    for (const [options, message] of cases) {
      expect(() => defineTool({ ...base, ...options } as never), JSON.stringify(options)).toThrow(message);
    }
  });
});

describe('§31.1 the start check of isolated tools', () => {
  it('refuses a tool whose module does not export it, and passes one that does', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'taskrelay-isolate-'));
    const file = join(dir, 'other.mjs');
    writeFileSync(file, 'export const nothing = 1;\n');
    const lost = defineTool({ ...base, isolate: 'process', module: pathToFileURL(file).href });
    await expect(checkIsolatedTools([lost])).rejects.toThrow(ConfigError);
    await expect(checkIsolatedTools([lost])).rejects.toThrow(
      /Tool crunch is isolated, but its module .* exports no tool/,
    );
    await expect(checkIsolatedTools([exported])).resolves.toBeUndefined();
  });
});

export const exported = defineTool({ ...base, name: 'exported', isolate: 'thread', module: here });

describe('§31.2 errors cross the boundary as the worker decides on them', () => {
  const run = { attemptsMade: 0, attempts: 3, reason: undefined, suspended: false };
  const across = (error: unknown) => fromWireError(structuredClone(toWireError(error)));

  it('each kind of error settles the same after the crossing', () => {
    const errors: unknown[] = [
      new NonRetryableError('no', { data: { why: 1 } }),
      new RetryAfterError(1_500, 'later'),
      new ProtocolError(-32602, 'bad params', { field: 'x' }),
      new TaskrelayError('MEMORY_LIMIT', 'too big', { data: { maxMemoryMb: 64 } }),
      new TaskrelayError('UPSTREAM_UNAVAILABLE', 'down'),
      new UnrecoverableError('stop'),
      new TypeError('plain'),
      'a string',
    ];
    for (const error of errors) {
      const crossed = across(error);
      const { error: _after, ...decided } = settle({ ...run, outcome: { ok: false, error: crossed } }) as {
        error?: unknown;
      };
      const { error: _before, ...expected } = settle({ ...run, outcome: { ok: false, error } }) as { error?: unknown };
      expect(decided, String(error)).toEqual(expected);
      expect(serializeError(crossed)).toEqual(serializeError(error));
    }
  });

  it('a run killed for its memory fails at once, attempts left or not', () => {
    const error = new TaskrelayError('MEMORY_LIMIT', 'too big');
    expect(settle({ ...run, outcome: { ok: false, error } })).toEqual({ kind: 'fail', error });
  });

  it('a suspension, a cancel and an error’s name and stack come back as themselves', () => {
    expect(across(new SuspendedError())).toBeInstanceOf(SuspendedError);
    const cancelled = across(new CancelledError('TIMEOUT'));
    expect(cancelled).toBeInstanceOf(CancelledError);
    expect((cancelled as CancelledError).reason).toBe('TIMEOUT');
    const range = new RangeError('out');
    expect(across(range)).toMatchObject({ name: 'RangeError', message: 'out', stack: range.stack });
  });
});

describe('§31.2 the child’s ctx', () => {
  const start = {
    moduleUrl: here,
    tool: 'crunch',
    input: {},
    taskId: 't1',
    attempt: 2,
    state: { n: 1 },
    answers: { '1': 'a' },
    logLevel: 'info',
  };
  const child = () => {
    const sent: ChildMessage[] = [];
    return { ctx: new ChildContext(start, (m) => sent.push(m)), sent };
  };

  it('sends progress, notify and log lines at once, and checks their arguments as the worker does', () => {
    const { ctx, sent } = child();
    ctx.progress(1, 10, 'one');
    ctx.notify('info', { a: 1 });
    ctx.log.info({ k: 1 }, 'hello');
    ctx.log.debug('below the level');
    expect(sent.map((m) => m.t)).toEqual(['progress', 'notify', 'log']);
    expect(JSON.parse((sent[2] as { line: string }).line)).toMatchObject({ k: 1, msg: 'hello', level: 30 });
    expect(() => ctx.progress(Number.NaN)).toThrow(RangeError);
    expect(() => ctx.notify('loud' as never, 1)).toThrow(TypeError);
    expect([ctx.taskId, ctx.attempt, ctx.state.get(), ctx.answers]).toEqual(['t1', 2, { n: 1 }, { '1': 'a' }]);
  });

  it('a tight loop of progress sends the newest value at most every 25 ms, and the last one before the end', () => {
    const { ctx, sent } = child();
    const started = Date.now();
    for (let i = 1; i <= 100_000; i++) ctx.progress(i, 100_000);
    const elapsed = Date.now() - started;
    const progress = () => sent.filter((m) => m.t === 'progress');
    expect(progress().length).toBeLessThanOrEqual(2 + elapsed / 25);
    ctx.end({ ok: true, value: 'done' });
    expect(progress().at(-1)).toEqual({ t: 'progress', progress: 100_000, total: 100_000 });
    expect(sent.at(-1)).toEqual({ t: 'end', settled: { ok: true, value: 'done' } });
  });

  it('sends the questions of one turn together, and rebuilds the error an answer carries', async () => {
    const { ctx, sent } = child();
    const params = { message: 'x', requestedSchema: { type: 'object' as const, properties: {} } };
    const both = Promise.allSettled([ctx.elicit(params), ctx.elicit(params, { key: 'b' })]);
    expect(sent).toEqual([]);
    await Promise.resolve();
    expect(sent.map((m) => (m.t === 'call' ? m.method : m.t))).toEqual(['elicit', 'elicit']);
    ctx.receive({ t: 'reply', id: 1, settled: { ok: true, value: { action: 'accept' } }, answers: { '2': 'b' } });
    ctx.receive({ t: 'reply', id: 2, settled: { ok: false, error: toWireError(new SuspendedError()) } });
    const [first, second] = await both;
    expect(first).toEqual({ status: 'fulfilled', value: { action: 'accept' } });
    expect((second as PromiseRejectedResult).reason).toBeInstanceOf(SuspendedError);
    expect(ctx.answers).toEqual({ '2': 'b' });
  });

  it('opens a waitpoint through the worker, and its wait() is a call by the waitpoint’s name', async () => {
    const { ctx, sent } = child();
    const opening = ctx.waitpoint('ci', { timeoutMs: 60_000 });
    await Promise.resolve();
    expect(sent.at(-1)).toEqual({ t: 'call', id: 1, method: 'waitpoint', args: ['ci', { timeoutMs: 60_000 }] });
    const timeoutAt = new Date(Date.now() + 60_000);
    ctx.receive({ t: 'reply', id: 1, settled: { ok: true, value: { name: 'ci', url: 'https://x/w/1', timeoutAt } } });
    const waitpoint = await opening;
    expect(waitpoint).toMatchObject({ name: 'ci', url: 'https://x/w/1', timeoutAt });
    const waiting = waitpoint.wait();
    await Promise.resolve();
    expect(sent.at(-1)).toEqual({ t: 'call', id: 2, method: 'waitpoint.wait', args: ['ci'] });
    ctx.receive({ t: 'reply', id: 2, settled: { ok: true, value: { ok: true, value: { green: true } } } });
    expect(await waiting).toEqual({ ok: true, value: { green: true } });
  });

  it('writes output and attaches artifacts through the worker, a stream joined first (it cannot cross)', async () => {
    const { ctx, sent } = child();
    const writing = ctx.output.write('line 1\n');
    await Promise.resolve();
    expect(sent.at(-1)).toEqual({ t: 'call', id: 1, method: 'output.write', args: ['line 1\n'] });
    ctx.receive({ t: 'reply', id: 1, settled: { ok: true, value: undefined } });
    await writing;
    async function* chunks() {
      yield 'a,b\n';
      yield new TextEncoder().encode('1,2\n');
    }
    const attaching = ctx.artifact('table.csv', chunks(), 'text/csv');
    await new Promise((resolve) => setImmediate(resolve));
    const call = sent.at(-1) as unknown as { method: string; args: [string, Uint8Array, string] };
    expect([call.method, call.args[0], Buffer.from(call.args[1]).toString(), call.args[2]]).toEqual([
      'artifact',
      'table.csv',
      'a,b\n1,2\n',
      'text/csv',
    ]);
    const link = { type: 'resource_link', uri: 'taskrelay://tasks/t/blobs/b', name: 'table.csv' };
    ctx.receive({ t: 'reply', id: 2, settled: { ok: true, value: link } });
    expect(await attaching).toEqual(link);
  });

  it('runs a step’s function when the worker asks, and its signal aborts with the worker’s reason', async () => {
    const { ctx, sent } = child();
    const step = ctx.step('s', () => 41 + 1);
    await Promise.resolve();
    ctx.receive({ t: 'invoke', id: 1 });
    await new Promise((resolve) => setImmediate(resolve));
    expect(sent.at(-1)).toEqual({ t: 'invoked', id: 1, settled: { ok: true, value: 42 } });
    ctx.receive({ t: 'reply', id: 1, settled: { ok: true, value: 42 } });
    expect(await step).toBe(42);

    const sleeping = ctx.sleep(60_000);
    ctx.receive({ t: 'abort', reason: 'CLIENT_CANCELLED' });
    await expect(sleeping).rejects.toBeInstanceOf(CancelledError);
    expect(ctx.signal.reason).toBe('CLIENT_CANCELLED');
    expect(() => ctx.throwIfCancelled()).toThrow(CancelledError);
  });
});

describe('§31.5 the ctx surface, declared once', () => {
  /** The calls the child and the worker each serve by hand (a function or a stream stays where it is). */
  const own = new Set(['state.set', 'step', 'waitpoint', 'waitpoint.wait', 'artifact']);
  const at = (root: object, path: string) => path.split('.').reduce<any>((owner, part) => owner?.[part], root);

  it('every call of the declaration is a member of the child’s ctx that sends it with its arguments', async () => {
    expect(ISOLATE_CALLS).toEqual(
      Object.keys(CONTEXT_SURFACE).filter((name) => (CONTEXT_SURFACE as any)[name].isolate === 'call'),
    );
    for (const method of ISOLATE_CALLS.filter((name) => !own.has(name))) {
      const sent: ChildMessage[] = [];
      const ctx = new ChildContext(
        { moduleUrl: here, tool: 'x', input: {}, taskId: 't', attempt: 1, state: null, answers: {}, logLevel: 'info' },
        (m) => sent.push(m),
      );
      const member = at(ctx, method) as (...args: unknown[]) => Promise<unknown>;
      expect(typeof member, method).toBe('function');
      const answered = member('a', 2);
      await Promise.resolve();
      expect(sent, method).toEqual([{ t: 'call', id: 1, method, args: ['a', 2] }]);
      ctx.receive({ t: 'reply', id: 1, settled: { ok: true, value: `${method} done` } });
      await expect(answered).resolves.toBe(`${method} done`);
    }
  });

  it('the worker carries every call of the declaration to the real ctx member at its path, on its owner', () => {
    const calls: Array<[string, unknown[], unknown]> = [];
    const ctx: Record<string, any> = {};
    for (const method of ISOLATE_CALLS) {
      const path = method.split('.');
      let owner = ctx;
      for (const part of path.slice(0, -1)) owner = owner[part] ??= {};
      const last = path.at(-1)!;
      owner[last] = function (this: unknown, ...args: unknown[]) {
        calls.push([method, args, this]);
        return method;
      };
    }
    for (const method of ISOLATE_CALLS.filter((name) => name !== 'waitpoint.wait')) {
      expect(invokeMember(ctx as HostContext, method, [1, 'b']), method).toBe(method);
      const [name, args, self] = calls.at(-1)!;
      const owner = method.includes('.') ? ctx[method.split('.')[0]!] : ctx;
      expect([name, args, self === owner], method).toEqual([method, [1, 'b'], true]);
    }
    expect(() => invokeMember({} as HostContext, 'fanOut', [])).toThrow(/ctx.fanOut is not available/);
  });
});

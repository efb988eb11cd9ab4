/**
 * The worker's side of an isolated run (PROTOCOL.md §31): the child is started, its `ctx` messages are carried out on
 * the run's real context, an abort is sent on and the child killed when it does not end within `killGraceMs`, and its
 * memory is bounded. The run's outcome is what the handler returned or threw in the child, or the error its child's end
 * stands for; `settle` decides from it as for a handler run in the worker's own thread.
 */
import { fork } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { ConfigError, TaskrelayError, oneLine, type CancelReason, type Logger } from '@taskrelay/shared';
import { suspends, type IsolateCall } from '../context-surface.js';
import type { ToolContext, Waitpoint } from '../context-types.js';
import { isToolDefinition, type ToolDefinition, type ToolIsolation } from '../define-tool.js';
import { CancelledError, SuspendedError, cancelReasonOf } from '../errors.js';
import {
  ChildMessageSchema,
  ISOLATED_CHILD,
  fromWireError,
  toWireError,
  type ChildMessage,
  type IsolateStart,
  type ParentMessage,
  type Settled,
} from './isolate-messages.js';

/** The run's real context: the members the child's calls reach, and whether it suspended. */
export type HostContext = ToolContext & { readonly suspension?: unknown };

/** How often a forked child's resident set is read against `maxMemoryMb`. */
const MEMORY_WATCH_MS = 250;
/** How much of a forked child's stderr is kept to tell a heap cap from another crash. */
const STDERR_TAIL_BYTES = 8_192;
/** What V8 prints when a heap cap (`--max-old-space-size`) is reached. */
const HEAP_OUT_OF_MEMORY = /heap out of memory|Reached heap limit/;
/** The child's entry, beside this file (`.js` in dist; `.ts` when the worker itself runs from its sources). */
const CHILD_ENTRY = new URL(`./isolate-child${extname(fileURLToPath(import.meta.url))}`, import.meta.url);
/** pino's numeric levels, for the child's log lines. */
const LEVEL_NAMES: Record<number, 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'> = {
  10: 'trace',
  20: 'debug',
  30: 'info',
  40: 'warn',
  50: 'error',
  60: 'fatal',
};

/**
 * The forked children alive now. A worker that exits (a second signal, a crash it can see) kills them on its way out:
 * a child busy in a loop would not see its channel close until its handler ends. Only a SIGKILL of the worker leaves
 * such a child running to its end (PROTOCOL.md §31.3).
 */
const liveChildren = new Set<{ kill(signal: NodeJS.Signals): boolean }>();
let exitHookSet = false;

function trackChild(child: {
  kill(signal: NodeJS.Signals): boolean;
  once(event: 'close', f: () => void): unknown;
}): void {
  liveChildren.add(child);
  child.once('close', () => liveChildren.delete(child));
  if (exitHookSet) return;
  exitHookSet = true;
  process.once('exit', () => {
    for (const live of liveChildren) live.kill('SIGKILL');
  });
}

/** Calls the tool: in the worker's thread, or in a child when the tool is isolated. */
export function callTool(tool: ToolDefinition, input: Record<string, unknown>, ctx: HostContext, log: Logger): unknown {
  if (tool.isolation === undefined) return tool.run(input, ctx);
  return new IsolatedRun(tool, tool.isolation, ctx, log).run(input);
}

/**
 * The start check of isolated tools (PROTOCOL.md §31.1): each one's module exports it, so its child can load it; and
 * this is no isolated run's child (a tools module that starts a worker at its top level would start one there).
 *
 * @throws ConfigError naming the tool and its module.
 */
export async function checkIsolatedTools(tools: readonly ToolDefinition[]): Promise<void> {
  if ((globalThis as Record<symbol, unknown>)[ISOLATED_CHILD] === true) {
    throw new ConfigError(
      'startWorker cannot run in the child of an isolated run: a module with isolated tools must not start a worker ' +
        'at its top level (PROTOCOL.md §31.4)',
    );
  }
  for (const tool of tools) {
    if (tool.isolation === undefined) continue;
    const { moduleUrl } = tool.isolation;
    let exports: Record<string, unknown>;
    try {
      exports = (await import(moduleUrl)) as Record<string, unknown>;
    } catch (error) {
      throw new ConfigError(
        `Tool ${tool.name} is isolated, but its module ${moduleUrl} cannot be loaded: ${oneLine(error)}`,
      );
    }
    const found = Object.values(exports)
      .flatMap((value) => (Array.isArray(value) ? (value as unknown[]) : [value]))
      .some((item) => isToolDefinition(item) && item.name === tool.name);
    if (!found) {
      throw new ConfigError(
        `Tool ${tool.name} is isolated, but its module ${moduleUrl} exports no tool of that name (export it, or give ` +
          'the module that does as module)',
      );
    }
  }
}

/** Calls the member of `ctx` at `path` (`state.set`: `ctx.state.set`) on its owner, with `args`. */
export function invokeMember(ctx: HostContext, path: string, args: unknown[]): unknown {
  const parts = path.split('.');
  let owner = ctx as unknown as Record<string, unknown>;
  for (const part of parts.slice(0, -1)) owner = owner[part] as Record<string, unknown>;
  const member = owner[parts[parts.length - 1] ?? path];
  if (typeof member !== 'function') throw new TypeError(`ctx.${path} is not available in this context`);
  return (member as (...a: unknown[]) => unknown).apply(owner, args);
}

/** A child of either kind, as the run drives it. */
interface ChildHandle {
  readonly pid: number | undefined;
  post(message: ParentMessage): void;
  kill(): void;
}

/** Why the child is being killed: its abort, its suspension, or its memory. */
type KillCause = { kind: 'abort'; reason: CancelReason } | { kind: 'suspended' } | { kind: 'memory'; detail: string };

export class IsolatedRun {
  private child: ChildHandle | undefined;
  private ended = false;
  /** The child has exited (its `close` or `exit`). */
  private gone = false;
  /** A thread's uncaught error, for the message of a run that ended without a result. */
  private threadError: string | undefined;
  private killCause: KillCause | undefined;
  private killTimer: NodeJS.Timeout | undefined;
  private memoryTimer: NodeJS.Timeout | undefined;
  private stderrTail = '';
  private outOfMemory = false;
  /** The waitpoints the child opened, whose `wait()` it calls by name. */
  private readonly waitpoints = new Map<string, Waitpoint>();
  /** The worker's real `ctx.step` waits here for the child to run a step's function. */
  private readonly steps = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  private resolveEnd: (settled: Settled) => void = () => undefined;

  constructor(
    private readonly tool: ToolDefinition,
    private readonly isolation: ToolIsolation,
    private readonly ctx: HostContext,
    private readonly log: Logger,
  ) {}

  async run(input: Record<string, unknown>): Promise<unknown> {
    const { ctx } = this;
    const ended = new Promise<Settled>((resolve) => (this.resolveEnd = resolve));
    const onAbort = () => this.aborted();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    try {
      this.child = this.isolation.mode === 'process' ? this.forkProcess() : this.startThread();
      this.log.debug({ isolate: this.isolation.mode, childPid: this.child.pid }, 'isolated run started');
      const start: IsolateStart = {
        moduleUrl: this.isolation.moduleUrl,
        tool: this.tool.name,
        input,
        taskId: ctx.taskId,
        attempt: ctx.attempt,
        state: ctx.state.get(),
        answers: { ...ctx.answers },
        logLevel: ctx.log.level,
      };
      this.child.post({ t: 'start', start });
      if (ctx.signal.aborted) this.aborted();
      const settled = await ended;
      if (settled.ok) return settled.value;
      throw fromWireError(settled.error);
    } finally {
      // The kill timer stays: a child that has not exited yet is still killed when its grace is up.
      ctx.signal.removeEventListener('abort', onAbort);
      clearInterval(this.memoryTimer);
    }
  }

  private forkProcess(): ChildHandle {
    const { maxMemoryMb } = this.isolation;
    // The worker's flags (a loader, say) apply to its child too, but not its inspector (one port, one process) nor,
    // when the tool sets its own, its heap size.
    const execArgv = process.execArgv.filter(
      (arg) =>
        !/^--(inspect|debug)/.test(arg) && !(maxMemoryMb !== undefined && arg.startsWith('--max-old-space-size')),
    );
    if (maxMemoryMb !== undefined) execArgv.push(`--max-old-space-size=${maxMemoryMb}`);
    const child = fork(fileURLToPath(CHILD_ENTRY), [], {
      execArgv,
      serialization: 'advanced',
      stdio: ['ignore', 'inherit', 'pipe', 'ipc'],
    });
    // Passed through as `inherit` would, and its tail kept: V8's "heap out of memory" is how a heap cap shows.
    child.stderr?.on('data', (chunk: Buffer) => {
      process.stderr.write(chunk);
      this.stderrTail = (this.stderrTail + chunk.toString()).slice(-STDERR_TAIL_BYTES);
    });
    child.on('message', (message) => this.receive(message));
    child.on('error', (error) => {
      this.log.warn({ err: error }, 'isolated run: child process error');
      // A fork that never started emits no `close`: the run ends here.
      if (child.pid === undefined) this.childEnded(`not started: ${error.message}`);
    });
    // `close`, not `exit`: every message the child sent has been read by then.
    child.on('close', (code, signal) =>
      this.childEnded(code === null ? `signal ${signal ?? '?'}` : `exit code ${code}`),
    );
    if (maxMemoryMb !== undefined && child.pid !== undefined) this.watchMemory(child.pid, maxMemoryMb);
    trackChild(child);
    return {
      pid: child.pid,
      post: (message) => {
        if (child.connected) child.send(message);
      },
      kill: () => child.kill('SIGKILL'),
    };
  }

  private startThread(): ChildHandle {
    const { maxMemoryMb } = this.isolation;
    const worker = new Worker(
      CHILD_ENTRY,
      maxMemoryMb === undefined ? {} : { resourceLimits: { maxOldGenerationSizeMb: maxMemoryMb } },
    );
    worker.on('message', (message) => this.receive(message));
    worker.on('error', (error: Error & { code?: unknown }) => {
      if (error.code === 'ERR_WORKER_OUT_OF_MEMORY') this.outOfMemory = true;
      else this.threadError = error.message;
    });
    worker.on('exit', (code) => this.childEnded(`exit code ${code}`));
    return {
      pid: undefined,
      post: (message) => worker.postMessage(message),
      kill: () => void worker.terminate(),
    };
  }

  /**
   * Reads the forked child's resident set (Linux `/proc`; elsewhere the heap cap alone bounds it) and kills the child
   * past `maxMemoryMb`. Read here, not reported by the child: a child busy in a loop reports nothing.
   */
  private watchMemory(pid: number, maxMemoryMb: number): void {
    const path = `/proc/${pid}/status`;
    this.memoryTimer = setInterval(() => {
      readFile(path, 'utf8').then(
        (status) => {
          const kb = Number(/VmRSS:\s+(\d+)\s+kB/.exec(status)?.[1] ?? 0);
          if (kb > maxMemoryMb * 1024 && !this.ended) {
            this.kill({ kind: 'memory', detail: `resident set ${Math.round(kb / 1024)} MB` });
          }
        },
        // Gone (it ended), or no /proc here: the heap cap still holds.
        () => clearInterval(this.memoryTimer),
      );
    }, MEMORY_WATCH_MS).unref();
  }

  private receive(raw: unknown): void {
    const parsed = ChildMessageSchema.safeParse(raw);
    if (!parsed.success) {
      this.log.debug('isolated run: a message that is not the protocol’s ignored');
      return;
    }
    const message = parsed.data;
    switch (message.t) {
      case 'progress':
        return this.quietly(() => this.ctx.progress(message.progress, message.total, message.message));
      case 'notify':
        return this.quietly(() => this.ctx.notify(message.level, message.data, message.logger));
      case 'log':
        return this.logLine(message.line);
      case 'call':
        return void this.call(message);
      case 'invoked': {
        const waiter = this.steps.get(message.id);
        this.steps.delete(message.id);
        if (message.settled.ok) waiter?.resolve(message.settled.value);
        else waiter?.reject(fromWireError(message.settled.error));
        return;
      }
      case 'end':
        return this.end(message.settled);
    }
  }

  /** A `ctx` call of the child, carried out on the real context; its answer (or error) goes back under its id. */
  private async call(message: Extract<ChildMessage, { t: 'call' }>): Promise<void> {
    const { ctx } = this;
    let settled: Settled;
    try {
      settled = { ok: true, value: await this.dispatch(message.method, message.id, message.args) };
    } catch (error) {
      settled = { ok: false, error: toWireError(error) };
    }
    // A call that may suspend may have asked: the child's copy of the answers is brought up to date.
    const asked = suspends(message.method);
    this.post({ t: 'reply', id: message.id, settled, ...(asked ? { answers: { ...ctx.answers } } : {}) });
    // The run suspended (§12.7): what the handler does after it is discarded, so the child gets its grace, no more.
    if (ctx.suspension !== undefined) this.kill({ kind: 'suspended' });
  }

  /**
   * Carries out a call on the real context, at the member's path in the declaration (context-surface.ts), with the
   * child's arguments. Unchecked here: the real context checks every argument, as it does for a handler in the worker's
   * thread. A step's function and a waitpoint's `wait` stay in the process that holds them, so those calls differ.
   */
  private dispatch(method: IsolateCall, id: number, args: unknown[]): unknown {
    switch (method) {
      case 'step':
        return this.ctx.step(args[0] as string, () => this.runStep(id), args[1] as { version?: string } | undefined);
      case 'waitpoint':
        return this.openWaitpoint(args[0] as string, args[1] as { timeoutMs?: number } | undefined);
      case 'waitpoint.wait': {
        const waitpoint = this.waitpoints.get(args[0] as string);
        if (!waitpoint) throw new TypeError(`ctx.waitpoint ${String(args[0])} was not opened in this run`);
        return waitpoint.wait();
      }
      default:
        return invokeMember(this.ctx, method, args);
    }
  }

  /** Opens a waitpoint on the real context; the child gets its fields, and its `wait()` comes back by name. */
  private async openWaitpoint(name: string, options: { timeoutMs?: number } | undefined): Promise<unknown> {
    const waitpoint = await this.ctx.waitpoint(name, options);
    this.waitpoints.set(waitpoint.name, waitpoint);
    return { name: waitpoint.name, url: waitpoint.url, timeoutAt: waitpoint.timeoutAt };
  }

  /** Asks the child to run step call `id`'s function; its value (or error) comes back as `invoked`. */
  private runStep(id: number): Promise<unknown> {
    return new Promise((resolve, reject) => {
      this.steps.set(id, { resolve, reject });
      this.post({ t: 'invoke', id });
    });
  }

  /** A pino line of the child's `ctx.log`, written by the run's own logger (stdout and the task's kept lines). */
  private logLine(line: string): void {
    if (line.trim() === '') return;
    let fields: Record<string, unknown>;
    try {
      fields = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.log.info({ line }, 'isolated run: log line');
      return;
    }
    const { level, msg, time: _time, pid: _pid, hostname: _host, component: _component, ...rest } = fields;
    const name = LEVEL_NAMES[Number(level)] ?? 'info';
    this.ctx.log[name](rest, typeof msg === 'string' ? msg : '');
  }

  private aborted(): void {
    const reason = cancelReasonOf(this.ctx.signal);
    this.post({ t: 'abort', reason });
    this.kill({ kind: 'abort', reason });
  }

  /**
   * Ends the child: at once for its memory, after `killGraceMs` for an abort or a suspension (the child may end by
   * itself meanwhile, which clears the timer).
   */
  private kill(cause: KillCause): void {
    if (this.ended || (this.killCause !== undefined && cause.kind !== 'memory')) return;
    this.killCause = cause;
    if (cause.kind === 'memory') {
      this.log.warn(
        { maxMemoryMb: this.isolation.maxMemoryMb, detail: cause.detail },
        'isolated run over its memory limit; killing it',
      );
      clearTimeout(this.killTimer);
      this.child?.kill();
      return;
    }
    const { killGraceMs } = this.isolation;
    this.killTimer = setTimeout(() => {
      if (this.gone) return;
      this.log.warn(
        { killGraceMs, cause: cause.kind },
        'isolated run did not end within killGraceMs; killing its child',
      );
      this.child?.kill();
    }, killGraceMs);
  }

  private end(settled: Settled): void {
    if (this.ended) return;
    this.ended = true;
    this.failSteps(settled);
    this.resolveEnd(settled);
    // A thread waits to be ended; a process exits by itself once its end is flushed (killed if it does not).
    clearTimeout(this.killTimer);
    if (this.isolation.mode === 'thread') this.child?.kill();
    else this.killTimer = setTimeout(() => this.gone || this.child?.kill(), this.isolation.killGraceMs).unref();
  }

  /** The child is gone. Without an end of its own, the run ends with what its going stands for. */
  private childEnded(how: string): void {
    this.gone = true;
    clearInterval(this.memoryTimer);
    clearTimeout(this.killTimer);
    if (this.ended) return;
    const error = this.errorOfEnd(how);
    this.log.info({ how, code: (error as { code?: unknown }).code }, 'isolated run ended without a result of its own');
    this.end({ ok: false, error: toWireError(error) });
  }

  private errorOfEnd(how: string): Error {
    const cause = this.killCause;
    const { maxMemoryMb } = this.isolation;
    if (cause?.kind === 'memory' || this.outOfMemory || HEAP_OUT_OF_MEMORY.test(this.stderrTail)) {
      return new TaskrelayError(
        'MEMORY_LIMIT',
        `Tool ${this.tool.name} ran out of memory: its run used more than maxMemoryMb ${maxMemoryMb ?? '?'} MB and was stopped`,
        { data: { maxMemoryMb } },
      );
    }
    if (cause?.kind === 'abort') return new CancelledError(cause.reason);
    if (cause?.kind === 'suspended') return new SuspendedError();
    const detail = this.threadError === undefined ? how : `${how}: ${this.threadError}`;
    return new TaskrelayError(
      'TOOL_FAILED',
      `Tool ${this.tool.name}'s isolated run ended without a result (${detail})`,
    );
  }

  /** Step functions the child can no longer run end with the run. */
  private failSteps(settled: Settled): void {
    const error = settled.ok ? new Error('the isolated run ended') : fromWireError(settled.error);
    for (const waiter of this.steps.values()) waiter.reject(error);
    this.steps.clear();
  }

  private post(message: ParentMessage): void {
    if (this.ended) return;
    try {
      this.child?.post(message);
    } catch (error) {
      this.log.debug({ err: error }, 'isolated run: message to the child not sent');
    }
  }

  /** A progress or log message the real context refuses (a bad value) is the child's mistake, logged, never thrown. */
  private quietly(fn: () => void): void {
    try {
      fn();
    } catch (error) {
      this.log.debug({ err: error }, 'isolated run: ctx message refused');
    }
  }
}

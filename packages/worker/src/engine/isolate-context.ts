/**
 * The `ctx` of an isolated run, in its child (PROTOCOL.md §31.2): a proxy whose members are messages to the worker,
 * where the run's real `TaskContext` does the work. `signal`, `sleep` and `throwIfCancelled` are the child's own (the
 * worker sends `abort`); `state.get`, `answers` and the run's names are copies.
 */
import { Writable } from 'node:stream';
import { createLogger, type CancelReason, type LogLevel, type Logger } from '@taskrelay/shared';
import { abortableSleep, checkNotifyArgs, checkProgressArgs } from '../context-checks.js';
import { ISOLATE_CALLS, type IsolateCall, type TopOf } from '../context-surface.js';
import type { StepOptions, ToolContext, ToolState, Waitpoint, WaitpointOutcome } from '../context-types.js';
import { CancelledError, cancelReasonOf } from '../errors.js';
import type { ArtifactData, ResourceLink } from '../output.js';
import {
  fromWireError,
  toWireError,
  type ChildMessage,
  type IsolateStart,
  type ParentMessage,
  type Settled,
} from './isolate-messages.js';

/**
 * At most one progress message per this many ms leaves the child (the newest value wins; the worker's own throttle,
 * PROTOCOL.md §8, applies after it): a handler reporting in a tight loop must not flood the worker's event loop.
 */
const PROGRESS_MESSAGE_MS = 25;

/** Sends a message to the worker; throws when the value cannot be cloned. */
export type PostToParent = (message: ChildMessage) => void;

interface Pending {
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
}

/** The calls the child does more for than send them: a function stays here, a copy is kept, a stream is read. */
const OWN_CALLS = ['state.set', 'step', 'waitpoint', 'waitpoint.wait', 'artifact'] as const satisfies IsolateCall[];
type OwnCall = (typeof OWN_CALLS)[number];
/** The members made from the declaration: every call's, but the child's own (`ctx.output` is made; `ctx.state` is not). */
type ProxiedMember = Exclude<TopOf<IsolateCall>, TopOf<OwnCall>>;

/**
 * The proxy of every call the declaration names (context-surface.ts) that is no `OWN_CALLS` entry: a member that
 * sends its arguments and resolves with the worker's answer, at its path (`output.write` at `output.write`).
 */
function proxyCalls(
  call: (method: IsolateCall, args: unknown[]) => Promise<unknown>,
): Pick<ToolContext, ProxiedMember> {
  const members: Record<string, unknown> = {};
  for (const method of ISOLATE_CALLS) {
    if ((OWN_CALLS as readonly string[]).includes(method)) continue;
    const path = method.split('.');
    let owner = members;
    for (const part of path.slice(0, -1)) owner = (owner[part] ??= {}) as Record<string, unknown>;
    owner[path[path.length - 1] ?? method] = (...args: unknown[]) => call(method, args);
  }
  return members as unknown as Pick<ToolContext, ProxiedMember>;
}

// The generated members (`proxyCalls`, assigned in the constructor) are typed by this merge, not written out by hand.
// eslint-disable-next-line @typescript-eslint/no-unsafe-declaration-merging, @typescript-eslint/no-empty-object-type
export interface ChildContext extends Pick<ToolContext, ProxiedMember> {}

// eslint-disable-next-line @typescript-eslint/no-unsafe-declaration-merging
export class ChildContext implements ToolContext {
  readonly taskId: string;
  readonly tool: string;
  readonly attempt: number;
  readonly log: Logger;
  private readonly controller = new AbortController();
  private stateValue: unknown;
  private answered: Record<string, unknown>;
  private nextId = 0;
  private readonly pending = new Map<number, Pending>();
  /** Step functions the worker may ask to run, by the id of their `step` call. */
  private readonly stepFns = new Map<number, () => unknown>();
  /** Calls of this turn not yet sent: questions asked together are sent together (§12.2). */
  private queued: ChildMessage[] = [];
  private progressSentAt = 0;
  /** The newest progress not sent yet (within `PROGRESS_MESSAGE_MS` of the last one), and its timer. */
  private progressPending: ChildMessage | undefined;
  private progressTimer: NodeJS.Timeout | undefined;

  constructor(
    start: IsolateStart,
    private readonly post: PostToParent,
  ) {
    this.taskId = start.taskId;
    this.tool = start.tool;
    this.attempt = start.attempt;
    this.stateValue = start.state;
    this.answered = { ...start.answers };
    // Each line goes to the worker as it is written: a handler that never yields still logs.
    const destination = new Writable({
      write: (chunk: Buffer | string, _encoding, done) => {
        this.send({ t: 'log', line: String(chunk) });
        done();
      },
    });
    this.log = createLogger('worker', { level: start.logLevel, destination });
    Object.assign(
      this,
      proxyCalls((method, args) => this.call(method, args)),
    );
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get answers(): Readonly<Record<string, unknown>> {
    return { ...this.answered };
  }

  /** A message from the worker. */
  receive(message: ParentMessage): void {
    if (message.t === 'abort') {
      if (!this.controller.signal.aborted) this.controller.abort(message.reason);
      return;
    }
    if (message.t === 'invoke') {
      void this.invoke(message.id);
      return;
    }
    if (message.t !== 'reply') return;
    const pending = this.pending.get(message.id);
    if (!pending) return;
    this.pending.delete(message.id);
    this.stepFns.delete(message.id);
    if (message.answers !== undefined) this.answered = { ...message.answers };
    if (message.settled.ok) pending.resolve(message.settled.value);
    else pending.reject(fromWireError(message.settled.error));
  }

  readonly progress = (progress: number, total?: number, message?: string): void => {
    checkProgressArgs(progress, total);
    this.progressPending = {
      t: 'progress',
      progress,
      ...(total === undefined ? {} : { total }),
      ...(message === undefined ? {} : { message: String(message) }),
    };
    // Read at each call, not by a timer alone: a handler that never yields runs no timer, and still reports.
    const waitMs = this.progressSentAt + PROGRESS_MESSAGE_MS - Date.now();
    if (waitMs <= 0) this.flushProgress();
    else this.progressTimer ??= setTimeout(() => this.flushProgress(), waitMs);
  };

  readonly notify = (level: LogLevel, data: unknown, logger?: string): void => {
    checkNotifyArgs(level, data);
    this.send({ t: 'notify', level, data, ...(logger === undefined ? {} : { logger: String(logger) }) });
  };

  readonly sleep = (ms: number): Promise<void> => abortableSleep(this.signal, ms);

  readonly throwIfCancelled = (): void => {
    if (this.signal.aborted) throw new CancelledError(cancelReasonOf(this.signal));
  };

  readonly state: ToolState = {
    get: <T = unknown>(): T | undefined => this.stateValue as T | undefined,
    set: async (value: unknown): Promise<void> => {
      await this.call('state.set', [value]);
      this.stateValue = structuredClone(value);
    },
  };

  readonly step = <T>(name: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<T> => {
    if (typeof fn !== 'function') return Promise.reject(new TypeError('ctx.step needs a function'));
    return this.call('step', [name, options], fn) as Promise<T>;
  };

  /** Opened by the worker; `wait()` is a call of its own (a function cannot cross). */
  readonly waitpoint = async (name: string, options?: { timeoutMs?: number }): Promise<Waitpoint> => {
    const opened = (await this.call('waitpoint', [name, options])) as Omit<Waitpoint, 'wait'>;
    return { ...opened, wait: () => this.call('waitpoint.wait', [opened.name]) as Promise<WaitpointOutcome> };
  };

  readonly artifact = async (name: string, data: ArtifactData, mimeType: string): Promise<ResourceLink> => {
    // A stream cannot cross to the worker: its chunks are joined here (the task's bound still applies there).
    let bytes: Uint8Array | string;
    if (typeof data === 'string' || data instanceof Uint8Array) {
      bytes = data;
    } else {
      const parts: Buffer[] = [];
      for await (const chunk of data) parts.push(typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.from(chunk));
      bytes = Buffer.concat(parts);
    }
    return (await this.call('artifact', [name, bytes, mimeType])) as ResourceLink;
  };

  /** The handler's end: its value, or its error. */
  end(settled: Settled): void {
    this.flush();
    this.flushProgress();
    this.post({ t: 'end', settled });
  }

  /** The reason the run aborted with, once it did. */
  get abortReason(): CancelReason | undefined {
    return this.signal.aborted ? cancelReasonOf(this.signal) : undefined;
  }

  /**
   * A call answered by the worker. Calls of one turn go in one flush (a microtask later), so `Promise.all` of two
   * questions reaches the real context in one turn there too and asks them together.
   */
  private call(method: IsolateCall, args: unknown[], stepFn?: () => unknown): Promise<unknown> {
    const id = ++this.nextId;
    return new Promise<unknown>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      if (stepFn) this.stepFns.set(id, stepFn);
      this.queued.push({ t: 'call', id, method, args });
      if (this.queued.length === 1) queueMicrotask(() => this.flush());
    });
  }

  private flush(): void {
    const queued = this.queued;
    this.queued = [];
    for (const message of queued) {
      try {
        this.post(message);
      } catch (error) {
        // Arguments that cannot be cloned (a function in them) fail their own call, as a bad argument would.
        if (message.t !== 'call') continue;
        const pending = this.pending.get(message.id);
        this.pending.delete(message.id);
        pending?.reject(error);
      }
    }
  }

  /** Sends at once, after what was made before it, so the worker sees everything in the order it was made. */
  private send(message: ChildMessage): void {
    if (this.queued.length > 0) this.flush();
    this.flushProgress();
    this.post(message);
  }

  private flushProgress(): void {
    clearTimeout(this.progressTimer);
    this.progressTimer = undefined;
    const pending = this.progressPending;
    if (pending === undefined) return;
    this.progressPending = undefined;
    this.progressSentAt = Date.now();
    this.post(pending);
  }

  /** Runs a step's function for the worker's real `ctx.step`, and sends its value or error back. */
  private async invoke(id: number): Promise<void> {
    const fn = this.stepFns.get(id);
    let settled: Settled;
    try {
      if (!fn) throw new Error(`no step function for call ${id}`);
      settled = { ok: true, value: await fn() };
    } catch (error) {
      settled = { ok: false, error: toWireError(error) };
    }
    try {
      this.send({ t: 'invoked', id, settled });
    } catch (error) {
      this.send({ t: 'invoked', id, settled: { ok: false, error: toWireError(error) } });
    }
  }
}

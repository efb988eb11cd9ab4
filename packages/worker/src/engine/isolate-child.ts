/**
 * The entry point of an isolated run's child (PROTOCOL.md §31): a process forked by the worker, or a worker thread. It
 * waits for `start`, imports the tool's module, runs the handler with a `ChildContext` and sends its end. Nothing here
 * talks to Redis: every write is the worker's.
 */
import { parentPort } from 'node:worker_threads';
import { NonRetryableError } from '@taskrelay/shared';
import { isToolDefinition, type ToolDefinition } from '../define-tool.js';
import { ChildContext, type PostToParent } from './isolate-context.js';
import {
  ISOLATED_CHILD,
  toWireError,
  type ChildMessage,
  type IsolateStart,
  type ParentMessage,
  type Settled,
} from './isolate-messages.js';

(globalThis as Record<symbol, unknown>)[ISOLATED_CHILD] = true;

/** The channel to the worker: the thread's port, or the forked process's IPC channel. */
interface Channel {
  post: PostToParent;
  onMessage(listener: (message: ParentMessage) => void): void;
}

function threadChannel(port: NonNullable<typeof parentPort>): Channel {
  return {
    post: (message) => port.postMessage(message),
    // After its end, a thread is terminated by the worker.
    onMessage: (listener) => port.on('message', listener),
  };
}

function processChannel(): Channel {
  const send = process.send?.bind(process);
  if (!send) throw new Error('isolate-child runs only as a child of a taskrelay worker');
  // The worker is gone (it crashed, or was killed): nobody can record this run any more.
  process.on('disconnect', () => process.exit(0));
  return {
    // After its end is flushed, the process exits: whatever the tool left open (timers, sockets) is not waited for.
    post: (message: ChildMessage) => {
      send(message, undefined, undefined, message.t === 'end' ? () => process.exit(0) : undefined);
    },
    onMessage: (listener) => process.on('message', (message) => listener(message as ParentMessage)),
  };
}

/** The tool definition named `tool` among the module's exports (named, default, or in an array), as main.ts finds it. */
async function findTool(moduleUrl: string, tool: string): Promise<ToolDefinition> {
  const exports = (await import(moduleUrl)) as Record<string, unknown>;
  for (const value of Object.values(exports)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (isToolDefinition(item) && item.name === tool) return item;
    }
  }
  throw new NonRetryableError(`Module ${moduleUrl} exports no tool named ${tool}: its isolated run cannot start`);
}

async function run(start: IsolateStart, ctx: ChildContext): Promise<void> {
  let settled: Settled;
  try {
    const definition = await findTool(start.moduleUrl, start.tool);
    settled = { ok: true, value: await definition.run(start.input, ctx) };
  } catch (error) {
    settled = { ok: false, error: toWireError(error) };
  }
  try {
    ctx.end(settled);
  } catch (error) {
    // The value cannot be cloned (a function, a class instance with private state): no retry would change that.
    const message = `Tool ${start.tool} returned a value that cannot leave its isolated run: ${String(error)}`;
    ctx.end({ ok: false, error: toWireError(new NonRetryableError(message)) });
  }
}

const channel = parentPort ? threadChannel(parentPort) : processChannel();
let ctx: ChildContext | undefined;
channel.onMessage((message) => {
  if (message.t !== 'start') {
    ctx?.receive(message);
    return;
  }
  if (ctx) return;
  // Made before the module loads, so an abort that comes meanwhile is not lost.
  ctx = new ChildContext(message.start, channel.post);
  void run(message.start, ctx);
});

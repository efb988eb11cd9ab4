/**
 * ctx.signal is a standard AbortSignal: the APIs tool authors pass it to (fetch, timers, child processes) stop when a
 * cancel reaches the worker.
 */
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startRedis, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { defineTool } from '../src/define-tool.js';
import { Harness } from './harness.js';

let redis: TestRedis;
let h: Harness;
let slowServer: Server;
let slowUrl: string;
const started = new Set<string>();
const outcomes = new Map<string, string>();
let childPid: number | undefined;

function record(taskId: string, error: unknown): never {
  outcomes.set(taskId, error instanceof Error ? error.name : String(error));
  throw error;
}

const viaFetch = defineTool({
  name: 'via_fetch',
  description: 'Fetches a URL that never answers.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    started.add(ctx.taskId);
    try {
      await fetch(slowUrl, { signal: ctx.signal });
    } catch (error) {
      record(ctx.taskId, error);
    }
    return 'answered';
  },
});

const viaTimer = defineTool({
  name: 'via_timer',
  description: 'Waits on a node timer.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    started.add(ctx.taskId);
    try {
      await delay(60_000, undefined, { signal: ctx.signal });
    } catch (error) {
      record(ctx.taskId, error);
    }
    return 'slept';
  },
});

const viaChild = defineTool({
  name: 'via_child',
  description: 'Runs a long child process.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { signal: ctx.signal });
    childPid = child.pid;
    started.add(ctx.taskId);
    const exit = await new Promise<string>((resolve) => {
      child.on('error', (error) => outcomes.set(ctx.taskId, error.name));
      child.on('exit', (_code, signal) => resolve(String(signal)));
    });
    ctx.throwIfCancelled();
    return exit;
  },
});

beforeAll(async () => {
  redis = await startRedis();
  h = new Harness(redis.url);
  slowServer = createServer(() => undefined); // accepts and never answers
  await new Promise<void>((resolve) => slowServer.listen(0, '127.0.0.1', resolve));
  slowUrl = `http://127.0.0.1:${(slowServer.address() as AddressInfo).port}/`;
  await h.start([viaFetch, viaTimer, viaChild], { concurrency: 3 });
});

afterAll(async () => {
  await h?.close();
  slowServer?.closeAllConnections();
  slowServer?.close();
  await redis?.stop();
});

describe('ctx.signal with standard APIs', () => {
  it.each([
    // fetch rejects with the signal's reason itself: the closed-set reason string.
    ['via_fetch', 'CLIENT_CANCELLED'],
    ['via_timer', 'AbortError'],
    ['via_child', 'AbortError'],
  ])('a cancel aborts %s (rejecting with %s)', async (tool, errorName) => {
    const taskId = await h.enqueue(tool, {});
    await waitFor(() => started.has(taskId), { message: `${tool} did not start` });
    await h.cancel(taskId);
    await waitFor(() => outcomes.get(taskId), { message: `${tool} was not aborted` });
    expect(outcomes.get(taskId)).toBe(errorName);
    expect((await h.task(taskId))?.status).toBe('cancelled');
    if (tool === 'via_child') {
      const pid = childPid ?? 0;
      await waitFor(
        () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true; // the child is gone
          }
        },
        { message: 'child process still running' },
      );
    }
  });
});

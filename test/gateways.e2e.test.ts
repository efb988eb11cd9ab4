/**
 * PROTOCOL.md §10.8, §10.9 across two gateway replicas: status events reach the owner and the gateways waiting on a
 * task, a cancel answered by one replica is never followed by a progress notification from the owner, and idempotent
 * creation returns one task whichever replica is asked.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { type Redis } from 'ioredis';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, McpError, ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { TaskStore, createKeys } from '@taskrelay/shared';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { FIXTURE_TOOLS, type GatewayProcess } from './helpers/processes.js';
import { startTask } from './helpers/tasks.js';

const stack = useStack({
  name: 'gateways',
  gateways: [{}, {}],
  workers: [{ TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_CONCURRENCY: '16' }],
});
let r: Redis;
let prefix: string;
let a: GatewayProcess;
let b: GatewayProcess;
let onA: Client;
let onB: Client;

beforeAll(async () => {
  ({ r, prefix } = stack);
  [a, b] = stack.gateways as [GatewayProcess, GatewayProcess];
  [onA, onB] = await Promise.all([stack.client({}, a.url), stack.client({}, b.url)]);
});

const IDEMPOTENCY = 'dev.taskrelay/idempotency-key';

describe('§10.9 status fan-out and cancel acks', () => {
  it('answers tasks/result on a replica that does not own the task as soon as the task ends', async () => {
    const taskId = await startTask(onA, 'sleepy', { ms: 300, stepMs: 50 });
    const result = await onB.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ ms: 300 });
  });

  it('answers a cancel on another replica only once the owner has retired the route, even a stalled owner', async () => {
    // What a client can rely on: the owner sends nothing for the task after the other replica's answer. Two sockets
    // give no cross-connection order a test could read on the client side (their data may be handled in either order
    // within a millisecond), so this checks the server-side order: the answer waits for the owner, which can only
    // ack once it runs again and has retired the route; and after that, nothing more arrives for the task.
    for (let round = 0; round < 3; round++) {
      const token = `x-${round}`;
      let seen = 0;
      onA.setNotificationHandler(ProgressNotificationSchema, (n) => {
        if (n.params.progressToken === token) seen++;
      });
      const taskId = await startTask(onA, 'sleepy', { ms: 60_000, stepMs: 5 }, { progressToken: token });
      await waitFor(() => seen >= 3, { message: 'no progress before the cancel' });
      // The owner stalls (a GC pause, a busy event loop) while the worker keeps publishing to it.
      process.kill(a.pid, 'SIGSTOP');
      await new Promise((resolve) => setTimeout(resolve, 150));
      let resumedAt = Number.POSITIVE_INFINITY;
      const resume = new Promise((resolve) => setTimeout(resolve, 150)).then(() => {
        resumedAt = performance.now();
        process.kill(a.pid, 'SIGCONT');
      });
      const cancelled = await onB.experimental.tasks.cancelTask(taskId);
      const answeredAt = performance.now();
      await resume;
      expect(cancelled.status).toBe('cancelled');
      expect(answeredAt).toBeGreaterThan(resumedAt);
      // Anything the owner had queued before its ack reaches the client before a later task's result does.
      const later = await startTask(onA, 'sleepy', { ms: 20, stepMs: 10 }, { progressToken: `${token}-after` });
      await onA.experimental.tasks.getTaskResult(later, CallToolResultSchema);
      const settled = seen;
      const another = await startTask(onA, 'sleepy', { ms: 20, stepMs: 10 }, { progressToken: `${token}-after2` });
      await onA.experimental.tasks.getTaskResult(another, CallToolResultSchema);
      expect(seen).toBe(settled);
    }
  });
});

describe('§10.8 idempotent creation', () => {
  it('returns one task for one key, whichever replica is asked, and runs the tool once', async () => {
    const key = `order-${Date.now()}`;
    const ids = await Promise.all([
      startTask(onA, 'sleepy', { ms: 200 }, { meta: { [IDEMPOTENCY]: key } }),
      startTask(onB, 'sleepy', { ms: 200 }, { meta: { [IDEMPOTENCY]: key } }),
      startTask(onA, 'sleepy', { ms: 200 }, { meta: { [IDEMPOTENCY]: key } }),
    ]);
    expect(new Set(ids).size).toBe(1);
    const taskId = ids[0] ?? '';
    await onB.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(await startTask(onB, 'sleepy', { ms: 200 }, { meta: { [IDEMPOTENCY]: key } })).toBe(taskId);
    const task = await new TaskStore(r, createKeys(prefix)).records.get(taskId);
    expect(task?.attempt).toBe(1);
  });

  it('rejects a key that is not a string of 1 to 200 characters, naming it, and creates nothing', async () => {
    for (const bad of ['', 'x'.repeat(201), 42]) {
      const error = await startTask(onA, 'sleepy', { ms: 1 }, { meta: { [IDEMPOTENCY]: bad } }).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(McpError);
      expect((error as McpError).code).toBe(-32602);
      expect((error as McpError).message).toMatch(/idempotency-key/);
    }
  });

  it('refuses a key already used for another tool', async () => {
    const key = `k-${Date.now()}`;
    await startTask(onA, 'sleepy', { ms: 1 }, { meta: { [IDEMPOTENCY]: key } });
    const error = await startTask(onA, 'progress_burst', { count: 1 }, { meta: { [IDEMPOTENCY]: key } }).catch(
      (e: unknown) => e,
    );
    expect((error as McpError).code).toBe(-32602);
    expect((error as McpError).message).toMatch(/Idempotency key already used/);
  });
});

describe('§10 bounded Redis', () => {
  it('keeps a plain call’s hash only briefly and out of the principal index', async () => {
    const result = await onA.callTool({ name: 'sleepy', arguments: { ms: 10 } }, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    const keys = createKeys(prefix);
    const taskKeys = await r.keys(`${keys.taskKeyPrefix}*`);
    const ttls = await Promise.all(
      taskKeys.map(async (k) => ({ mode: await r.hget(k, 'mode'), ttl: await r.pttl(k) })),
    );
    const calls = ttls.filter((t) => t.mode === 'call');
    expect(calls.length).toBeGreaterThan(0);
    for (const call of calls) expect(call.ttl).toBeLessThanOrEqual(10_000);
    const indexed = await r.zrange(keys.principalTasks('anonymous'), 0, -1);
    const modes = await Promise.all(indexed.map((id) => r.hget(keys.task(id), 'mode')));
    expect(modes.filter((m) => m === 'call')).toEqual([]);
  });
});

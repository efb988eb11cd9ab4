/**
 * Issue 3, PROTOCOL.md §6 and §9: each progress update reaches exactly its own caller, across processes and gateway
 * replicas, strictly increasing, never after terminal, and survives a dropped stream.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { type Redis } from 'ioredis';
import {
  CallToolResultSchema,
  ProgressNotificationSchema,
  TaskStatusNotificationSchema,
  type ProgressNotification,
  type TaskStatusNotification,
} from '@modelcontextprotocol/sdk/types.js';
import { createKeys, TaskStore } from '@taskrelay/shared';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, connectClient, readMetric, type GatewayProcess } from './helpers/processes.js';
import { startTask } from './helpers/tasks.js';

const GATED_TOOLS = `${ROOT}/test/fixtures/gated-tools.mjs`;
const RELATED = 'io.modelcontextprotocol/related-task';

const stack = useStack({
  name: 'progress',
  gateways: [{}, {}],
  workers: [
    { WORKER_CONCURRENCY: '32' },
    { TASKRELAY_TOOLS: GATED_TOOLS, TASKRELAY_QUEUE: 'gated', WORKER_CONCURRENCY: '16' },
    FIXTURE_WORKER,
  ],
});
let r: Redis;
let prefix: string;
let gatewayA: GatewayProcess;
let gatewayB: GatewayProcess;

beforeAll(() => {
  ({ r, prefix } = stack);
  [gatewayA, gatewayB] = stack.gateways as [GatewayProcess, GatewayProcess];
});

/** A client that records every progress notification it receives, by token, like a UI with one card per call. */
async function recordingClient(url: string) {
  const client = await connectClient(url);
  const received: ProgressNotification['params'][] = [];
  client.setNotificationHandler(ProgressNotificationSchema, (n) => {
    received.push(n.params);
  });
  const cards = () => {
    const map = new Map<string | number, { progress: number; total?: number }>();
    for (const p of received) map.set(p.progressToken, { progress: p.progress, total: p.total });
    return map;
  };
  return { client, received, cards };
}

const push = (gate: string, command: Record<string, unknown>) => r.rpush(gate, JSON.stringify(command));

function expectStrictlyIncreasing(values: number[]) {
  for (let i = 1; i < values.length; i++) expect(values[i]).toBeGreaterThan(values[i - 1] ?? -Infinity);
}

describe('§6 progress flow', () => {
  it('shows sales 2/4 and returns 1/2 after interleaved updates, and a late sales update changes nothing', async () => {
    const { client, received, cards } = await recordingClient(gatewayA.url);
    const gateSales = `${prefix}:gate:sales`;
    const gateReturns = `${prefix}:gate:returns`;
    const sales = await startTask(client, 'gated', { gate: gateSales }, { progressToken: 'sales-42' });
    const returns = await startTask(client, 'gated', { gate: gateReturns }, { progressToken: 'returns-43' });

    await push(gateSales, { progress: 1, total: 4, message: 'sales 1/4' });
    await waitFor(() => cards().get('sales-42')?.progress === 1);
    await push(gateReturns, { progress: 1, total: 2, message: 'returns 1/2' });
    await waitFor(() => cards().get('returns-43')?.progress === 1);
    await push(gateSales, { progress: 2, total: 4, message: 'sales 2/4' });
    await waitFor(() => cards().get('sales-42')?.progress === 2);

    expect(cards().get('sales-42')).toEqual({ progress: 2, total: 4 });
    expect(cards().get('returns-43')).toEqual({ progress: 1, total: 2 });
    for (const p of received) {
      const taskId = p.progressToken === 'sales-42' ? sales : returns;
      expect((p._meta as Record<string, unknown>)[RELATED]).toEqual({ taskId });
    }

    const cancelled = await client.experimental.tasks.cancelTask(sales);
    expect(cancelled.status).toBe('cancelled');
    const salesCount = received.filter((p) => p.progressToken === 'sales-42').length;

    // A late update for sales: from the worker side the store refuses it; a stray pub/sub message is dropped.
    const store = new TaskStore(r, createKeys(prefix));
    expect(await store.runs.recordProgress(sales, { progress: 3, total: 4 })).toBe('terminal');
    const gatewayId = (await store.records.get(sales))?.gatewayId ?? '';
    await r.publish(
      createKeys(prefix).gatewayChannel(gatewayId),
      JSON.stringify({ type: 'progress', taskId: sales, progress: 3, total: 4 }),
    );

    // Ordered after the late message on the same channel: once returns shows 2/2, the late one was handled.
    await push(gateReturns, { progress: 2, total: 2 });
    await waitFor(() => cards().get('returns-43')?.progress === 2);
    expect(received.filter((p) => p.progressToken === 'sales-42')).toHaveLength(salesCount);
    expect(cards().get('sales-42')).toEqual({ progress: 2, total: 4 });
    await push(gateReturns, { done: true });
    await client.experimental.tasks.getTaskResult(returns, CallToolResultSchema);
    await client.close();
  });

  it('keeps many sessions with many concurrent tasks apart, each on its own token, strictly increasing', async () => {
    const sessions = await Promise.all(Array.from({ length: 4 }, () => recordingClient(gatewayA.url)));
    const calls: Array<{ session: number; token: string; taskId: string; report: string }> = [];
    await Promise.all(
      sessions.map(async (s, si) => {
        for (let i = 0; i < 6; i++) {
          const report = `s${si}-r${i}`;
          const token = i % 2 === 0 ? `tok-${report}` : `${si + 1}${i}`;
          const progressToken = i % 2 === 0 ? token : Number(token);
          const taskId = await startTask(
            s.client,
            'build_report',
            { report, items: 20, delayMs: 3 },
            { progressToken },
          );
          calls.push({ session: si, token, taskId, report });
        }
      }),
    );
    await Promise.all(
      calls.map((c) => sessions[c.session]?.client.experimental.tasks.getTaskResult(c.taskId, CallToolResultSchema)),
    );
    for (const c of calls) {
      const s = sessions[c.session];
      if (!s) throw new Error('no session');
      await waitFor(() => s.received.some((p) => String(p.progressToken) === c.token && p.progress === 20), {
        message: `token ${c.token} (task ${c.taskId}) never showed 20/20: ${JSON.stringify(
          s.received.filter((p) => String(p.progressToken) === c.token).map((p) => p.progress),
        )}`,
      });
    }
    for (const [si, s] of sessions.entries()) {
      const mine = calls.filter((c) => c.session === si);
      for (const p of s.received) {
        const call = mine.find((c) => String(p.progressToken) === c.token);
        expect(call, `session ${si} got a foreign token ${String(p.progressToken)}`).toBeDefined();
        expect(p.message).toContain(call?.report);
        expect((p._meta as Record<string, unknown>)[RELATED]).toEqual({ taskId: call?.taskId });
      }
      for (const c of mine) {
        const values = s.received.filter((p) => String(p.progressToken) === c.token).map((p) => p.progress);
        expectStrictlyIncreasing(values);
        expect(values.at(-1)).toBe(20);
        // Tokens keep their JSON type: integer tokens come back as numbers.
        const sample = s.received.find((p) => String(p.progressToken) === c.token);
        expect(typeof sample?.progressToken).toBe(c.token.startsWith('tok-') ? 'string' : 'number');
      }
    }
    await Promise.all(sessions.map((s) => s.client.close()));
  });

  it('reaches the session on the gateway that holds it and is forwarded by no other replica', async () => {
    const a = await recordingClient(gatewayA.url);
    const b = await recordingClient(gatewayB.url);
    const metric = (g: GatewayProcess) => readMetric(g.url, 'taskrelay_progress_notifications_total');
    const beforeA = await metric(gatewayA);
    const beforeB = await metric(gatewayB);
    const ta = await startTask(
      a.client,
      'build_report',
      { report: 'on-a', items: 10, delayMs: 2 },
      { progressToken: 'same-token' },
    );
    const tb = await startTask(
      b.client,
      'build_report',
      { report: 'on-b', items: 10, delayMs: 2 },
      { progressToken: 'same-token' },
    );
    await a.client.experimental.tasks.getTaskResult(ta, CallToolResultSchema);
    await b.client.experimental.tasks.getTaskResult(tb, CallToolResultSchema);
    await waitFor(() => a.received.some((p) => p.progress === 10) && b.received.some((p) => p.progress === 10));
    expect(a.received.every((p) => p.message?.includes('on-a'))).toBe(true);
    expect(b.received.every((p) => p.message?.includes('on-b'))).toBe(true);
    expect((await metric(gatewayA)) - beforeA).toBe(a.received.length);
    expect((await metric(gatewayB)) - beforeB).toBe(b.received.length);
    await a.client.close();
    await b.client.close();
  });

  it('sends nothing for a task after it is terminal, even when a stray update arrives later', async () => {
    const { client, received } = await recordingClient(gatewayA.url);
    const gate = `${prefix}:gate:terminal`;
    const taskId = await startTask(client, 'gated', { gate }, { progressToken: 'term' });
    await push(gate, { progress: 1, total: 3 });
    await waitFor(() => received.some((p) => p.progressToken === 'term'));
    await push(gate, { done: true });
    await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    const count = received.length;
    const gatewayId = (await new TaskStore(r, createKeys(prefix)).records.get(taskId))?.gatewayId ?? '';
    await r.publish(
      createKeys(prefix).gatewayChannel(gatewayId),
      JSON.stringify({ type: 'progress', taskId, progress: 2, total: 3 }),
    );
    // A sentinel task on the same gateway: its progress is delivered after the stray message was handled.
    const sentinelGate = `${prefix}:gate:sentinel`;
    const sentinel = await startTask(client, 'gated', { gate: sentinelGate }, { progressToken: 'sentinel' });
    await push(sentinelGate, { progress: 1 });
    await waitFor(() => received.some((p) => p.progressToken === 'sentinel'));
    expect(received.slice(count).map((p) => p.progressToken)).toEqual(['sentinel']);
    await client.experimental.tasks.cancelTask(sentinel);
    await client.close();
  });

  it('drops updates for unknown tasks and creates nothing', async () => {
    const store = new TaskStore(r, createKeys(prefix));
    expect(await store.runs.recordProgress('f'.repeat(32), { progress: 1 })).toBe('missing');
    expect(await r.exists(createKeys(prefix).task('f'.repeat(32)))).toBe(0);
  });

  it('mirrors the latest progress message into statusMessage for clients that only poll', async () => {
    const client = await connectClient(gatewayA.url);
    const gate = `${prefix}:gate:mirror`;
    const taskId = await startTask(client, 'gated', { gate }, { progressToken: 'mirror' });
    await push(gate, { progress: 1, total: 2, message: 'halfway there' });
    await waitFor(async () => (await client.experimental.tasks.getTask(taskId)).statusMessage === 'halfway there');
    await push(gate, { done: true });
    await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    await client.close();
  });

  it('carries progress of a plain call on that request’s own stream', async () => {
    const client = await connectClient(gatewayA.url);
    const seen: number[] = [];
    const result = await client.callTool(
      { name: 'build_report', arguments: { report: 'plain', items: 5, delayMs: 20 } },
      CallToolResultSchema,
      { onprogress: (p) => seen.push(p.progress) },
    );
    expect(result.structuredContent).toEqual({ report: 'plain', items: 5 });
    expect(seen.at(-1)).toBe(5);
    expectStrictlyIncreasing(seen);
    await client.close();
  });

  it('coalesces a tool that reports a million times into a handful of notifications, ending on the last value', async () => {
    const { client, received } = await recordingClient(gatewayA.url);
    const taskId = await startTask(client, 'progress_burst', { count: 1_000_000 }, { progressToken: 'burst' });
    await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    await waitFor(() => received.some((p) => p.progress === 1_000_000));
    const values = received.filter((p) => p.progressToken === 'burst').map((p) => p.progress);
    expectStrictlyIncreasing(values);
    // At most ~20 per second per task reach the client; the tool made a million calls.
    expect(values.length).toBeLessThan(1_000);
    expect(values.at(-1)).toBe(1_000_000);
    await client.close();
  });

  it('sends notifications/tasks/status on status changes, with the full task', async () => {
    const client = await connectClient(gatewayA.url);
    const statuses: TaskStatusNotification['params'][] = [];
    client.setNotificationHandler(TaskStatusNotificationSchema, (n) => {
      statuses.push(n.params);
    });
    const taskId = await startTask(
      client,
      'build_report',
      { report: 'status', items: 2, delayMs: 1 },
      { progressToken: 'st', ttl: 60_000 },
    );
    await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    const done = await waitFor(() => statuses.find((s) => s.taskId === taskId && s.status === 'completed'));
    expect(done).toMatchObject({ taskId, status: 'completed', ttl: 60_000 });
    expect(Date.parse(done.createdAt)).not.toBeNaN();
    await client.close();
  });
});

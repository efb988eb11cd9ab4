/**
 * Issue 12, gateway replicas behind a load balancer (docs/SCALING.md §3): two gateways behind a small in-test TCP
 * balancer, and a client switching replicas between polls. Tasks are reached by id on any replica (the record is in
 * Redis, tasks belong to the principal); a 2025-11-25 session lives on the replica that created it, so session
 * traffic needs stickiness and the other replica answers an unknown session with 404.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startLoadBalancer, type LoadBalancer } from './helpers/load-balancer.js';
import { RawSession } from './helpers/raw-mcp.js';
import { waitFor } from './helpers/wait-for.js';
import { FIXTURE_TOOLS, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';

const stack = useStack({ name: 'replicas', gateways: [{}, {}], workers: [{}, { TASKRELAY_TOOLS: FIXTURE_TOOLS }] });
let gateways: GatewayProcess[];
let lb: LoadBalancer;

beforeAll(async () => {
  gateways = stack.gateways;
  lb = await startLoadBalancer(gateways.map((g) => g.port));
});

afterAll(async () => {
  await lb?.close();
});

/** One poll as a client behind a non-sticky balancer does it: a session on whichever replica it lands on. */
async function onReplica<T>(index: number, fn: (session: RawSession) => Promise<T>): Promise<T> {
  lb.use(index);
  const session = await RawSession.open(lb.url);
  try {
    return await fn(session);
  } finally {
    await session.close();
  }
}

describe('tasks across gateway replicas', () => {
  it('polls a task on alternating replicas until it completes, and reads its result on either', async () => {
    const created = await onReplica(0, (s) =>
      s.request('tools/call', {
        name: 'build_report',
        arguments: { report: 'replicas', items: 20, delayMs: 25 },
        task: { ttl: 60_000 },
      }),
    );
    const taskId = String(created.result?.task?.taskId);
    expect(created.result?.task?.status).toBe('working');

    let poll = 0;
    const statuses: string[] = [];
    await waitFor(
      async () => {
        poll++;
        const got = await onReplica(poll % 2, (s) => s.request('tasks/get', { taskId }));
        statuses.push(String(got.result?.status));
        return got.result?.status === 'completed';
      },
      { timeoutMs: 20_000, intervalMs: 50, message: 'the task did not complete' },
    );
    expect(statuses.every((s) => s === 'working' || s === 'completed')).toBe(true);
    for (const index of [0, 1]) {
      const result = await onReplica(index, (s) => s.request('tasks/result', { taskId }));
      expect(result.result?.structuredContent).toEqual({ report: 'replicas', items: 20 });
    }
    // Both replicas answered polls.
    expect(lb.counts.every((n) => n > 2)).toBe(true);
  });

  it('cancels on one replica a task created on the other, and both then say cancelled', async () => {
    const created = await onReplica(1, (s) =>
      s.request('tools/call', { name: 'sleepy', arguments: { ms: 60_000, stepMs: 50 }, task: { ttl: 60_000 } }),
    );
    const taskId = String(created.result?.task?.taskId);
    const cancelled = await onReplica(0, (s) => s.request('tasks/cancel', { taskId }));
    expect(cancelled.result?.status).toBe('cancelled');
    for (const index of [0, 1]) {
      expect((await onReplica(index, (s) => s.request('tasks/get', { taskId }))).result?.status).toBe('cancelled');
    }
  });

  it('answers a session opened on one replica with 404 on the other: sessions need stickiness', async () => {
    lb.use(0);
    const session = await RawSession.open(lb.url);
    expect((await session.request('tools/list', {})).result?.tools?.length).toBeGreaterThan(0);
    lb.use(1);
    const res = await session.post({ jsonrpc: '2.0', id: 99, method: 'tools/list', params: {} });
    expect(res.status).toBe(404);
    await res.body?.cancel();
    lb.use(0);
    expect(await session.close()).toBe(200);
  });
});

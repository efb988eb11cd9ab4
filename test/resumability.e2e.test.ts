/**
 * Issue 3, PROTOCOL.md §9: a client whose GET stream drops and reconnects with Last-Event-ID misses no progress event.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { type Redis } from 'ioredis';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, readMetric } from './helpers/processes.js';
import { RawSession, type SseEvent } from './helpers/raw-mcp.js';

const stack = useStack({
  name: 'resume',
  // No coalescing here, so every single value must arrive.
  env: { TASKRELAY_PROGRESS_INTERVAL_MS: '0' },
  workers: [{ TASKRELAY_TOOLS: `${ROOT}/test/fixtures/gated-tools.mjs`, TASKRELAY_QUEUE: 'gated' }],
});
let r: Redis;
let prefix: string;

beforeAll(() => {
  ({ r, prefix } = stack);
});

type Msg = {
  method?: string;
  params?: { progressToken?: unknown; progress?: number; status?: string; taskId?: string };
};
const progressOf = (events: SseEvent[], token: string) =>
  events
    .map((e) => e.data as Msg)
    .filter((m) => m.method === 'notifications/progress' && m.params?.progressToken === token)
    .map((m) => m.params?.progress);

describe('§9 session event store (resumability)', () => {
  it('replays every progress event sent while the GET stream was down', async () => {
    const session = await RawSession.open(stack.gateway.url);
    const first = session.openGetStream();
    const gate = `${prefix}:gate:resume`;
    const created = await session.request('tools/call', {
      name: 'gated',
      arguments: { gate },
      task: { ttl: 60_000 },
      _meta: { progressToken: 'resume-1' },
    });
    const taskId = created.result?.task?.taskId as string;
    expect(taskId).toBeTruthy();

    for (const p of [1, 2, 3]) {
      await r.rpush(gate, JSON.stringify({ progress: p, total: 6 }));
      await waitFor(() => progressOf(first.events, 'resume-1').includes(p));
    }
    first.close();
    await first.done;
    const lastId = [...first.events].reverse().find((e) => e.id !== undefined)?.id;
    expect(lastId).toBeDefined();

    // While no stream is open, the task goes on and finishes.
    for (const p of [4, 5, 6]) await r.rpush(gate, JSON.stringify({ progress: p, total: 6 }));
    await r.rpush(gate, JSON.stringify({ done: true }));
    await waitFor(async () => (await session.request('tasks/get', { taskId })).result?.status === 'completed');

    const resumed = session.openGetStream(lastId);
    await waitFor(() =>
      resumed.events.some(
        (e) =>
          (e.data as Msg).method === 'notifications/tasks/status' && (e.data as Msg).params?.status === 'completed',
      ),
    );
    resumed.close();
    await resumed.done;
    expect(progressOf(first.events, 'resume-1')).toEqual([1, 2, 3]);
    expect(progressOf(resumed.events, 'resume-1')).toEqual([4, 5, 6]);
    expect(await session.close()).toBe(200);
  });

  it('keeps the events in the gateway, not in Redis, and releases them when the session closes', async () => {
    const session = await RawSession.open(stack.gateway.url);
    const stream = session.openGetStream();
    const gate = `${prefix}:gate:release`;
    const created = await session.request('tools/call', {
      name: 'gated',
      arguments: { gate },
      task: { ttl: 60_000 },
      _meta: { progressToken: 'release-1' },
    });
    const taskId = created.result?.task?.taskId as string;
    await r.rpush(gate, JSON.stringify({ progress: 1, total: 1 }), JSON.stringify({ done: true }));
    await waitFor(async () => (await session.request('tasks/get', { taskId })).result?.status === 'completed');
    await waitFor(() => progressOf(stream.events, 'release-1').includes(1));
    expect(await readMetric(stack.gateway.url, 'taskrelay_sse_event_store_bytes')).toBeGreaterThan(0);
    // Nothing of the SSE traffic reached Redis: only the task's own keys carry the prefix.
    const keys = await r.keys(`${prefix}:*`);
    expect(keys.filter((k) => k.includes(':stream:'))).toEqual([]);

    expect(await session.close()).toBe(200);
    stream.close();
    await stream.done;
    await waitFor(async () => (await readMetric(stack.gateway.url, 'taskrelay_sse_event_store_bytes')) === 0, {
      message: 'the closed session still holds its events',
    });
  });
});

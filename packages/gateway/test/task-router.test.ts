/**
 * The progress router in isolation (PROTOCOL.md §6, §8), with fake timers and a fake subscriber: per-task routing,
 * coalescing, and nothing after terminal.
 */
import { EventEmitter } from 'node:events';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Redis } from 'ioredis';
import { MIN_SUGGESTED_POLL_MS, createKeys, createLogger, type TaskStore, type TaskRecord } from '@taskrelay/shared';
import { GatewayMetrics } from '../src/metrics/gateway-metrics.js';
import { TaskRouter, type ProgressParams } from '../src/tasks/task-router.js';

const keys = createKeys('unit');
const GATEWAY = 'gw1';

class FakeSubscriber extends EventEmitter {
  subscribe = vi.fn(() => Promise.resolve(2));
  disconnect = vi.fn();
  progress(taskId: string, progress: number, total?: number, message?: string) {
    this.emit(
      'message',
      keys.gatewayChannel(GATEWAY),
      JSON.stringify({ type: 'progress', taskId, progress, total, message }),
    );
  }
  status(taskId: string, status: string, extra: Record<string, unknown> = {}) {
    this.emit(
      'message',
      keys.gatewayChannel(GATEWAY),
      JSON.stringify({ type: 'status', taskId, status, lastUpdatedAt: new Date().toISOString(), ...extra }),
    );
  }
  ack(taskId: string) {
    this.emit('message', keys.gatewayChannel(GATEWAY), JSON.stringify({ type: 'ack', taskId }));
  }
}

function record(taskId: string, token: string | number, mode: 'task' | 'call' = 'task'): TaskRecord {
  return {
    taskId,
    status: 'working',
    createdAt: '2026-01-01T00:00:00.000Z',
    lastUpdatedAt: '2026-01-01T00:00:00.000Z',
    ttl: 60_000,
    pollInterval: 1000,
    tool: 't',
    queue: 'default',
    principal: 'p',
    mode,
    progressToken: token,
    sessionId: 's',
  };
}

let sub: FakeSubscriber;
let router: TaskRouter;
let sent: Array<{ taskId: string; params: ProgressParams }>;
let statuses: Array<{ taskId: string; status: string }>;
let published: Array<{ channel: string; message: unknown }>;
let watch: ReturnType<typeof vi.fn>;
let statusesOf: ReturnType<typeof vi.fn>;
let metrics: GatewayMetrics;

/** `taskrelay_tasks_finished_total` for tool `t` and `status`. */
async function finished(status: string): Promise<number> {
  const values = (await metrics.tasksFinished.get()).values;
  return values.find((v) => v.labels['status'] === status)?.value ?? 0;
}

function route(taskId: string, token: string | number, mode: 'task' | 'call' = 'task') {
  router.register({
    record: record(taskId, token, mode),
    sendProgress: (params, named) => {
      sent.push({ taskId: named, params });
      return Promise.resolve();
    },
    sendStatus: (task) => {
      statuses.push({ taskId, status: task.status });
      return Promise.resolve();
    },
  });
}

beforeEach(async () => {
  vi.useFakeTimers();
  sub = new FakeSubscriber();
  sent = [];
  statuses = [];
  published = [];
  watch = vi.fn(() => Promise.resolve(record('w1', 'tok')));
  statusesOf = vi.fn();
  metrics = new GatewayMetrics();
  const store = { records: { get: vi.fn(), statuses: statusesOf, watch } } as unknown as TaskStore;
  router = new TaskRouter(
    sub as unknown as Redis,
    (channel, message) => {
      published.push({ channel, message: JSON.parse(message) as unknown });
      return Promise.resolve(1);
    },
    store,
    keys,
    createLogger('test', { level: 'silent' }),
    metrics,
    { gatewayId: GATEWAY, progressIntervalMs: 50 },
  );
  await router.start();
});

afterEach(() => {
  router.close();
  vi.useRealTimers();
});

describe('§6 progress routing', () => {
  it('subscribes once, to the status channel and this gateway’s progress channel', () => {
    expect(sub.subscribe).toHaveBeenCalledTimes(1);
    expect(sub.subscribe).toHaveBeenCalledWith(keys.gatewayChannel(GATEWAY));
  });

  it('forwards each task’s updates on its own token, naming the task to its sender (which renders the related-task key)', () => {
    route('sales', 'sales-42');
    route('returns', 7);
    route('plain', 'p-1', 'call');
    sub.progress('sales', 1, 4);
    sub.progress('returns', 1, 2);
    sub.progress('plain', 3);
    expect(sent).toEqual([
      {
        taskId: 'sales',
        params: {
          progressToken: 'sales-42',
          progress: 1,
          total: 4,
        },
      },
      {
        taskId: 'returns',
        params: {
          progressToken: 7,
          progress: 1,
          total: 2,
        },
      },
      { taskId: 'plain', params: { progressToken: 'p-1', progress: 3 } },
    ]);
  });

  it('drops updates for unknown tasks and malformed messages', () => {
    route('known', 'k');
    sub.progress('unknown', 5);
    sub.emit('message', keys.gatewayChannel(GATEWAY), '{not json');
    sub.emit(
      'message',
      keys.gatewayChannel(GATEWAY),
      JSON.stringify({ type: 'progress', taskId: 'known', progress: 'x' }),
    );
    expect(sent).toEqual([]);
  });

  it('coalesces a burst per task, keeping the newest value, without holding back another task', () => {
    route('a', 'a');
    route('b', 'b');
    for (let i = 1; i <= 100; i++) sub.progress('a', i);
    sub.progress('b', 1);
    expect(sent.map((s) => [s.taskId, s.params.progress])).toEqual([
      ['a', 1],
      ['b', 1],
    ]);
    vi.advanceTimersByTime(50);
    expect(sent.map((s) => [s.taskId, s.params.progress])).toEqual([
      ['a', 1],
      ['b', 1],
      ['a', 100],
    ]);
  });

  it('sends a pending value before the terminal status, then nothing more', () => {
    route('t', 'tok');
    sub.progress('t', 1);
    sub.progress('t', 2); // pending in the throttle
    sub.status('t', 'completed');
    expect(sent.map((s) => s.params.progress)).toEqual([1, 2]);
    expect(statuses).toEqual([{ taskId: 't', status: 'completed' }]);
    sub.progress('t', 3); // a late message
    vi.advanceTimersByTime(1_000);
    expect(sent.map((s) => s.params.progress)).toEqual([1, 2]);
    expect(router.activeRoutes).toBe(0);
  });

  it('drops a pending value when the gateway itself retires the task (cancel)', () => {
    route('c', 'tok');
    sub.progress('c', 1);
    sub.progress('c', 2);
    router.retire('c', { flush: false });
    vi.advanceTimersByTime(1_000);
    sub.progress('c', 3);
    expect(sent.map((s) => s.params.progress)).toEqual([1]);
  });

  it('keeps forwarding through a non-terminal status change and reports it', () => {
    route('w', 'tok');
    sub.status('w', 'input_required');
    sub.progress('w', 1);
    expect(statuses).toEqual([{ taskId: 'w', status: 'input_required' }]);
    expect(sent.map((s) => s.params.progress)).toEqual([1]);
  });

  it('stops forwarding to a session that closed', () => {
    route('s1', 'tok');
    router.retireSession('s');
    sub.progress('s1', 1);
    expect(sent).toEqual([]);
  });
});

describe('§10.9 cancels answered by another gateway', () => {
  it('never flushes a pending value on cancelled, and acks to the answering gateway after retiring', () => {
    route('x', 'tok');
    sub.progress('x', 1);
    sub.progress('x', 2); // pending
    sub.status('x', 'cancelled', { cancelReason: 'CLIENT_CANCELLED', ackTo: 'gw2' });
    vi.advanceTimersByTime(1_000);
    sub.progress('x', 3);
    expect(sent.map((s) => s.params.progress)).toEqual([1]);
    expect(published).toEqual([{ channel: keys.gatewayChannel('gw2'), message: { type: 'ack', taskId: 'x' } }]);
  });

  it('acks even without a route (the session closed), and never to itself', () => {
    sub.status('gone', 'cancelled', { ackTo: 'gw2' });
    sub.status('mine', 'cancelled', { ackTo: GATEWAY });
    expect(published.map((p) => p.channel)).toEqual([keys.gatewayChannel('gw2')]);
  });

  it('resolves an armed ack wait when the ack arrives, and gives up after the timeout otherwise', async () => {
    const acked = router.expectAck('a', 500);
    const waiting = acked.wait();
    sub.ack('a');
    expect(await waiting).toBe(true);
    const lonely = router.expectAck('b', 500).wait();
    vi.advanceTimersByTime(500);
    expect(await lonely).toBe(false);
  });
});

describe('§10 waiting for a task', () => {
  it('adds one abort listener for the whole wait, however many fallback polls it makes', async () => {
    const controller = new AbortController();
    const add = vi.spyOn(controller.signal, 'addEventListener');
    const remove = vi.spyOn(controller.signal, 'removeEventListener');
    const waiting = router.waitForTerminal('w1', { signal: controller.signal });
    waiting.catch(() => undefined);
    for (let i = 0; i < 5; i++) await vi.advanceTimersByTimeAsync(2_000);
    expect(watch.mock.calls.length).toBeGreaterThanOrEqual(5);
    expect(add).toHaveBeenCalledTimes(1);
    controller.abort(new Error('client went away'));
    await expect(waiting).rejects.toThrow(/client went away/);
    expect(remove).toHaveBeenCalledTimes(1);
  });

  it('answers at once when a status event wakes it, and "not found" for a task the caller may not see', async () => {
    watch
      .mockResolvedValueOnce(record('w1', 'tok'))
      .mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'completed' });
    const waiting = router.waitForTerminal('w1');
    await vi.advanceTimersByTimeAsync(0);
    sub.status('w1', 'completed');
    await expect(waiting).resolves.toMatchObject({ status: 'completed' });
    await expect(router.waitForTerminal('w1', { authorize: () => false })).rejects.toThrow(/not found/);
  });

  it('waits for the terminal event of a task it routes without reading it first, then reads it once', async () => {
    route('w1', 'tok');
    watch.mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'completed' });
    const waiting = router.waitForTerminal('w1', { authorize: () => true });
    await vi.advanceTimersByTimeAsync(0);
    expect(watch).not.toHaveBeenCalled();
    sub.status('w1', 'completed');
    await expect(waiting).resolves.toMatchObject({ status: 'completed' });
    expect(watch).toHaveBeenCalledTimes(1);
  });

  it('answers from a terminal event that carries the outcome, without any read (§6.7)', async () => {
    route('w1', 'tok');
    const waiting = router.waitForTerminal('w1', { authorize: (r) => r.principal === 'p' });
    await vi.advanceTimersByTimeAsync(0);
    const result = { content: [{ type: 'text', text: 'done' }], structuredContent: { n: 1 } };
    sub.status('w1', 'completed', { final: true, result: JSON.stringify(result), statusMessage: 'ok' });
    await expect(waiting).resolves.toMatchObject({ taskId: 'w1', status: 'completed', statusMessage: 'ok', result });
    expect(watch).not.toHaveBeenCalled();
  });

  it('answers from a terminal event that carries the outcome as JSON values (finalJson), without any read (§6.7)', async () => {
    route('w1', 'tok');
    const waiting = router.waitForTerminal('w1', { authorize: (r) => r.principal === 'p' });
    await vi.advanceTimersByTimeAsync(0);
    const result = { content: [{ type: 'text', text: 'done' }], structuredContent: { n: 1 } };
    sub.status('w1', 'completed', { finalJson: true, resultJson: result });
    await expect(waiting).resolves.toMatchObject({ taskId: 'w1', status: 'completed', result });
    expect(watch).not.toHaveBeenCalled();
  });

  it('answers a task that ended here a moment ago from memory, until shortly before its hash expires (§6.7)', async () => {
    route('w1', 'tok');
    sub.status('w1', 'failed', { final: true, error: JSON.stringify({ code: 'X', message: 'boom' }) });
    expect(router.recentlyEnded('w1')).toMatchObject({ status: 'failed', error: { code: 'X' } });
    await expect(router.waitForTerminal('w1', { authorize: () => true })).resolves.toMatchObject({ status: 'failed' });
    expect(watch).not.toHaveBeenCalled();
    // A copy the caller may not see is read again (it may be out of date, §17.4), and the read decides.
    watch.mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'failed' });
    await expect(router.waitForTerminal('w1', { authorize: () => false })).rejects.toThrow(/not found/);
    expect(watch).toHaveBeenCalledTimes(1);
    watch.mockClear();
    // The record's ttl is 60 s; memory keeps it 5 s at most.
    await vi.advanceTimersByTimeAsync(5_001);
    expect(router.recentlyEnded('w1')).toBeUndefined();
    // A task without `final` (its outcome too big to publish) is not kept.
    route('w2', 'tok');
    sub.status('w2', 'completed');
    expect(router.recentlyEnded('w2')).toBeUndefined();
  });

  it('reads a task whose terminal event shows it as another mode than the caller may see: a call become a task (§17.4)', async () => {
    // Routed as a plain call; the hash now says task (becomeTask), so the event's copy is out of date.
    route('w1', 'tok', 'call');
    const taskMode = (r: TaskRecord) => r.mode === 'task';
    const waiting = router.waitForTerminal('w1', { authorize: taskMode });
    await vi.advanceTimersByTimeAsync(0);
    watch.mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'completed' });
    sub.status('w1', 'completed', { finalJson: true, resultJson: { content: [] } });
    await expect(waiting).resolves.toMatchObject({ mode: 'task', status: 'completed' });
    // Held as a call: asked again, it is read again, and the read answers.
    expect(router.recentlyEnded('w1')).toMatchObject({ mode: 'call' });
    watch.mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'completed' });
    await expect(router.waitForTerminal('w1', { authorize: taskMode })).resolves.toMatchObject({ mode: 'task' });
  });

  it('keeps the ttl a retention policy gave the ended task, and as long as that ttl allows (§6.7, §30.1)', async () => {
    // Retained for 2 s instead of its 60 s: shown so, and gone from memory 250 ms before its hash expires.
    route('w1', 'tok');
    sub.status('w1', 'failed', { finalJson: true, ttl: 2_000 });
    expect(router.recentlyEnded('w1')).toMatchObject({ status: 'failed', ttl: 2_000 });
    await vi.advanceTimersByTimeAsync(1_800);
    expect(router.recentlyEnded('w1')).toBeUndefined();
    // Retained for a week: shown so.
    route('w2', 'tok');
    sub.status('w2', 'failed', { finalJson: true, ttl: 604_800_000 });
    expect(router.recentlyEnded('w2')).toMatchObject({ ttl: 604_800_000 });
    // A replay linked it: forgotten here, so the next read shows the link.
    router.forget('w2');
    expect(router.recentlyEnded('w2')).toBeUndefined();
  });

  it('rides out a Redis outage once the wait is under way, but answers "unavailable" on the first read', async () => {
    const down = () => Object.assign(new Error('Connection is closed.'), { name: 'Error' });
    watch
      .mockResolvedValueOnce(record('w1', 'tok'))
      .mockRejectedValueOnce(down())
      .mockResolvedValueOnce({ ...record('w1', 'tok'), status: 'completed' });
    const waiting = router.waitForTerminal('w1');
    for (let i = 0; i < 3; i++) await vi.advanceTimersByTimeAsync(2_000);
    await expect(waiting).resolves.toMatchObject({ status: 'completed' });
    watch.mockRejectedValueOnce(down());
    await expect(router.waitForTerminal('w2')).rejects.toThrow(/Connection is closed/);
  });

  it('ends and counts a routed task, once, when its terminal event was lost and a fallback poll reads it', async () => {
    route('w1', 'tok', 'call');
    watch.mockResolvedValue({ ...record('w1', 'tok', 'call'), status: 'completed' });
    const waiting = router.waitForTerminal('w1');
    // No status event comes (the subscriber was cut off while it was published): the poll after 2 s reads the end.
    await vi.advanceTimersByTimeAsync(2_000);
    await expect(waiting).resolves.toMatchObject({ status: 'completed' });
    expect(await finished('completed')).toBe(1);
    sub.progress('w1', 9);
    sub.status('w1', 'completed');
    await vi.advanceTimersByTimeAsync(100);
    expect(sent).toEqual([]);
    expect(await finished('completed')).toBe(1);
  });

  it('ends and counts, after the subscriber reconnects, the tasks that ended while it was away', async () => {
    route('done', 'a');
    route('gone', 'b');
    route('running', 'c');
    statusesOf.mockResolvedValue(['failed', undefined, 'working']);
    sub.emit('ready');
    await vi.advanceTimersByTimeAsync(0);
    expect(statusesOf).toHaveBeenCalledWith(['done', 'gone', 'running']);
    expect(await finished('failed')).toBe(1);
    sub.progress('done', 1);
    sub.progress('running', 1);
    await vi.advanceTimersByTimeAsync(100);
    expect(sent.map((s) => s.taskId)).toEqual(['running']);
  });
});

describe("§28.1 a young task's poll waits a moment for its end", () => {
  const CREATED = Date.parse('2026-01-01T00:00:00.000Z');
  const mine = (r: TaskRecord) => r.principal === 'p';
  /** Resolves `settle` for `taskId`, recording the fake time it resolved at. */
  function settled(taskId: string, visible = mine): { at: () => number | undefined } {
    let at: number | undefined;
    void router.settle(taskId, visible).then(() => (at = Date.now() - CREATED));
    return { at: () => at };
  }

  it("ends at the task's terminal event, which it then holds (no read needed), well before the interval", async () => {
    vi.setSystemTime(CREATED + 2);
    route('w1', 'tok');
    const poll = settled('w1');
    await vi.advanceTimersByTimeAsync(10);
    expect(poll.at()).toBeUndefined();
    sub.status('w1', 'completed', { final: true, result: JSON.stringify({ content: [] }) });
    await vi.advanceTimersByTimeAsync(0);
    expect(poll.at()).toBe(12);
    expect(router.recentlyEnded('w1')).toMatchObject({ status: 'completed' });
  });

  it('ends at any status event (a question), and once the task is MIN_SUGGESTED_POLL_MS old when nothing comes', async () => {
    vi.setSystemTime(CREATED + 10);
    route('w1', 'tok');
    route('w2', 'tok');
    const asked = settled('w1');
    const quiet = settled('w2');
    sub.status('w1', 'input_required');
    await vi.advanceTimersByTimeAsync(0);
    expect(asked.at()).toBe(10);
    await vi.advanceTimersByTimeAsync(MIN_SUGGESTED_POLL_MS - 11);
    expect(quiet.at()).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(quiet.at()).toBe(MIN_SUGGESTED_POLL_MS);
  });

  it("does not wait for an older task, one not routed here, one asking its client, or another caller's", async () => {
    vi.setSystemTime(CREATED + 1);
    router.register({ record: { ...record('old', 'tok'), createdAt: '2025-12-31T23:59:59.950Z' } });
    route('asking', 'tok');
    sub.status('asking', 'input_required');
    route('theirs', 'tok');
    const polls = [
      settled('old'),
      settled('elsewhere'),
      settled('asking'),
      settled('theirs', (r) => r.principal === 'q'),
    ];
    await vi.advanceTimersByTimeAsync(0);
    expect(polls.map((p) => p.at())).toEqual([1, 1, 1, 1]);
  });
});

describe('§18.1 listen streams follow tasks', () => {
  it('wakes a follower on each status event of its task (with no route here), on a reconnect, and not after its stop', async () => {
    const woken: string[] = [];
    const stop = router.follow('x', () => woken.push('x'));
    router.follow('y', () => woken.push('y'));
    sub.status('x', 'input_required');
    sub.status('x', 'completed', { final: true });
    sub.progress('x', 1);
    expect(woken).toEqual(['x', 'x']);
    statusesOf.mockResolvedValue([]);
    sub.emit('ready');
    await vi.advanceTimersByTimeAsync(0);
    expect(woken.sort()).toEqual(['x', 'x', 'x', 'y']);
    stop();
    sub.status('x', 'working');
    expect(woken.filter((t) => t === 'x')).toHaveLength(3);
  });

  it('registers this gateway as a watcher with the read', async () => {
    await router.watch('w1');
    expect(watch).toHaveBeenCalledWith('w1', GATEWAY);
  });
});

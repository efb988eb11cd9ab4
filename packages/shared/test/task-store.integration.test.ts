import { describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { monitorRedis } from '../../../test/helpers/monitor.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';

const db = useRedis();

function setup(label: string) {
  const keys = createKeys(uniquePrefix(label));
  return { keys, store: new TaskStore(db.redis, keys) };
}

const base = {
  tool: 'build_report',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
};

describe('§2 the task record and its state machine', () => {
  it('stores a task durably with a 128-bit id and reads it back', async () => {
    const { store } = setup('create');
    const created = await store.records.create({ ...base, progressToken: 'p-1', sessionId: 's', gatewayId: 'g' });
    expect(created.taskId).toMatch(/^[0-9a-f]{32}$/);
    const read = await store.records.get(created.taskId);
    expect(read).toEqual(created);
    expect(read?.progressToken).toBe('p-1');
  });

  it('keeps an integer progress token an integer', async () => {
    const { store } = setup('token');
    const created = await store.records.create({ ...base, progressToken: 42 });
    expect((await store.records.get(created.taskId))?.progressToken).toBe(42);
  });

  it('moves to a terminal status once and never again', async () => {
    const { store } = setup('cas');
    const { taskId } = await store.records.create(base);
    expect(await store.runs.transition(taskId, 'completed', { result: { content: [] } })).toEqual({
      ok: true,
      status: 'completed',
    });
    expect(await store.runs.transition(taskId, 'cancelled')).toEqual({ ok: false, status: 'completed' });
    expect(await store.runs.transition(taskId, 'failed')).toEqual({ ok: false, status: 'completed' });
    expect((await store.records.get(taskId))?.status).toBe('completed');
  });

  it('lets exactly one of many racing terminal writes win', async () => {
    const { store } = setup('race');
    for (let i = 0; i < 20; i++) {
      const { taskId } = await store.records.create(base);
      const outcomes = await Promise.all([
        store.runs.transition(taskId, 'completed'),
        store.runs.transition(taskId, 'cancelled'),
        store.runs.transition(taskId, 'failed'),
      ]);
      expect(outcomes.filter((o) => o.ok)).toHaveLength(1);
    }
  });

  it('expires a task ttl after it becomes terminal, not before', async () => {
    const { store, keys } = setup('ttl');
    const { taskId } = await store.records.create({ ...base, ttl: 5_000 });
    expect(await db.redis.pttl(keys.task(taskId))).toBe(-1);
    await store.runs.transition(taskId, 'failed');
    const pttl = await db.redis.pttl(keys.task(taskId));
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5_000);
  });

  it('§30.1 keeps an ended task as long as the retention of its ending status says, and reports it as its ttl', async () => {
    const { store, keys } = setup('retain');
    const week = 7 * 86_400_000;
    await store.records.setRetention({ failed: week, cancelled: 120_000 });
    // The terminal events say so too (§6.7): the gateway that holds an ended task answers tasks/get from its event.
    const sub = new Redis(db.server.url);
    const events = new Map<string, { ttl?: number }>();
    await sub.subscribe(keys.gatewayChannel('g1'));
    sub.on('message', (_c, m) => {
      const event = JSON.parse(m) as { taskId: string; ttl?: number };
      events.set(event.taskId, event);
    });
    const owned = { ...base, gatewayId: 'g1' };
    const failed = await store.records.create({ ...owned, ttl: 5_000 });
    const cancelled = await store.records.create({ ...owned, ttl: 5_000 });
    const completed = await store.records.create({ ...owned, ttl: 5_000 });
    const call = await store.records.create({ ...owned, mode: 'call', ttl: 10_000 });
    // Unfinished: no expiry, however long the retention.
    expect(await db.redis.pttl(keys.task(failed.taskId))).toBe(-1);
    await store.runs.transition(failed.taskId, 'failed');
    await store.runs.transition(cancelled.taskId, 'cancelled');
    await store.runs.transition(completed.taskId, 'completed', { result: { content: [] } });
    await store.runs.transition(call.taskId, 'failed');
    expect(await db.redis.pttl(keys.task(failed.taskId))).toBeGreaterThan(week - 60_000);
    expect((await store.records.get(failed.taskId))?.ttl).toBe(week);
    expect(await db.redis.pttl(keys.task(cancelled.taskId))).toBeGreaterThan(100_000);
    // No retention for completed: its own ttl. A plain call keeps its own too: its caller has its answer.
    expect(await db.redis.pttl(keys.task(completed.taskId))).toBeLessThanOrEqual(5_000);
    expect((await store.records.get(completed.taskId))?.ttl).toBe(5_000);
    expect(await db.redis.pttl(keys.task(call.taskId))).toBeLessThanOrEqual(10_000);
    await waitFor(() => events.size === 4);
    expect(events.get(failed.taskId)?.ttl).toBe(week);
    expect(events.get(cancelled.taskId)?.ttl).toBe(120_000);
    // Kept for its own ttl: the event names none, the gateway's copy has it already.
    expect(events.get(completed.taskId)).not.toHaveProperty('ttl');
    expect(events.get(call.taskId)).not.toHaveProperty('ttl');
    sub.disconnect();
    // A gateway started without a policy for failed removes it: the task's own ttl again.
    await store.records.setRetention({});
    const later = await store.records.create({ ...base, ttl: 5_000 });
    await store.runs.transition(later.taskId, 'failed');
    expect(await db.redis.pttl(keys.task(later.taskId))).toBeLessThanOrEqual(5_000);
  });

  it('publishes each status change on the owning gateway channel', async () => {
    const { store, keys } = setup('status');
    const sub = new Redis(db.server.url);
    const seen: string[] = [];
    await sub.subscribe(keys.gatewayChannel('g1'));
    sub.on('message', (_c, m) => seen.push(m));
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    await store.runs.transition(taskId, 'input_required');
    await store.runs.transition(taskId, 'working');
    await store.runs.transition(taskId, 'completed');
    await waitFor(() => seen.length === 3);
    expect(seen.map((m) => (JSON.parse(m) as { status: string }).status)).toEqual([
      'input_required',
      'working',
      'completed',
    ]);
    sub.disconnect();
  });

  it('answers a missing task with an undefined status', async () => {
    const { store } = setup('missing');
    expect(await store.runs.transition('nope', 'cancelled')).toEqual({ ok: false, status: undefined });
    expect(await store.records.get('nope')).toBeUndefined();
  });
});

describe('§6 progress flow (store side)', () => {
  it('accepts only increasing progress and publishes it to the owning gateway only', async () => {
    const { store, keys } = setup('progress');
    const sub = new Redis(db.server.url);
    const mine: string[] = [];
    const other: string[] = [];
    await sub.subscribe(keys.gatewayChannel('g1'), keys.gatewayChannel('g2'));
    sub.on('message', (c, m) => (c === keys.gatewayChannel('g1') ? mine : other).push(m));
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    expect(await store.runs.recordProgress(taskId, { progress: 1, total: 4, message: 'one' })).toBe('accepted');
    expect(await store.runs.recordProgress(taskId, { progress: 1, total: 4 })).toBe('stale');
    expect(await store.runs.recordProgress(taskId, { progress: 0.5 })).toBe('stale');
    expect(await store.runs.recordProgress(taskId, { progress: 2, total: 4 })).toBe('accepted');
    await waitFor(() => mine.length === 2);
    expect(mine.map((m) => JSON.parse(m) as unknown)).toEqual([
      { type: 'progress', taskId, progress: 1, total: 4, message: 'one' },
      { type: 'progress', taskId, progress: 2, total: 4 },
    ]);
    const record = await store.records.get(taskId);
    expect(record).toMatchObject({ progress: 2, total: 4, statusMessage: 'one', progressMessage: 'one' });
    expect(other).toEqual([]);
    sub.disconnect();
  });

  it('publishes nothing for a terminal or unknown task, and writes nothing for either', async () => {
    const { store, keys } = setup('terminal');
    const sub = new Redis(db.server.url);
    const seen: { taskId?: string; type?: string }[] = [];
    await sub.subscribe(keys.gatewayChannel('g1'));
    sub.on('message', (_channel, m) => seen.push(JSON.parse(m) as { taskId?: string; type?: string }));
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    await store.runs.transition(taskId, 'cancelled');
    expect(await store.runs.recordProgress(taskId, { progress: 10 })).toBe('terminal');
    expect(await store.runs.recordProgress('unknown', { progress: 10 })).toBe('missing');
    // A live task's progress, published after the two refused ones: once it arrives, anything they sent has too.
    const live = await store.records.create({ ...base, gatewayId: 'g1' });
    expect(await store.runs.recordProgress(live.taskId, { progress: 1 })).toBe('accepted');
    await waitFor(() => seen.some((m) => m.taskId === live.taskId && m.type === 'progress'));
    expect(seen.filter((m) => m.type === 'progress' && m.taskId !== live.taskId)).toEqual([]);
    expect((await store.records.get(taskId))?.progress).toBeUndefined();
    expect(await db.redis.exists(keys.task('unknown'))).toBe(0);
    sub.disconnect();
  });
});

describe('tasks/list storage', () => {
  it('lists only the principal’s own tasks, newest first, page by page', async () => {
    const { store } = setup('list');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await store.records.create(base, new Date(Date.UTC(2026, 0, 1, 0, 0, i)))).taskId);
    }
    await store.records.create({ ...base, principal: 'mallory' });
    const first = await store.records.list('alice', undefined, 3);
    expect(first.tasks.map((t) => t.taskId)).toEqual(ids.slice(2).reverse());
    expect(first.nextCursor).toBeDefined();
    const second = await store.records.list('alice', first.nextCursor, 3);
    expect(second.tasks.map((t) => t.taskId)).toEqual(ids.slice(0, 2).reverse());
    expect(second.nextCursor).toBeUndefined();
    await expect(store.records.list('alice', 'garbage')).rejects.toThrow(/Invalid cursor/);
  });
});

describe('issue 46: the commands a run’s own scripts cost, and what they still write', () => {
  /** The commands a script ran inside Redis (`[0 lua]` lines of MONITOR), counted by name, while `fn` ran. */
  /** The script-run commands `fn` caused on keys under `prefix`: the run's Redis is shared with other files' tests. */
  async function scriptCommands(prefix: string, fn: () => Promise<unknown>): Promise<string[]> {
    const monitor = await monitorRedis(db.server.url);
    try {
      await monitor.ready((marker) => db.redis.echo(marker));
      const from = monitor.commands.length;
      await fn();
      const marker = `issue46-${Math.random()}`;
      await db.redis.echo(marker);
      await waitFor(() => monitor.commands.some((c) => c.args.includes(marker)));
      return monitor.commands
        .slice(from)
        .filter((c) => c.fromLua && c.args.some((a) => a.includes(prefix)))
        .map((c) => c.name);
    } finally {
      monitor.close();
    }
  }

  it('a start reads and writes the task once each; a later start keeps startedAt and ends a back-off', async () => {
    const { store, keys } = setup('start-cost');
    const { taskId } = await store.records.create(base);
    const lock = { queue: 'default~build_report', token: 'tok' };
    await db.redis.set(keys.bullJobLock(lock.queue, taskId), 'tok');
    const first = await scriptCommands(keys.prefix, () =>
      store.runs.startRun({
        taskId,
        lock,
        attempt: 1,
        deadlineAt: Date.now() + 60_000,
        sharePrincipal: 'alice',
        version: { toolVersion: 'v1' },
        startedAt: new Date(1_000),
      }),
    );
    // HMGET, GET (the lock), HSET, ZREM (the fair share), HGETALL (the record it answers).
    expect(first).toEqual(['hmget', 'get', 'hset', 'zrem', 'hgetall']);
    const started = await store.records.get(taskId);
    expect(started).toMatchObject({ attempt: 1, toolVersion: 'v1' });
    expect(await db.redis.hget(keys.task(taskId), 'startedAt')).toBe(new Date(1_000).toISOString());
    await store.runs.suspend(taskId, lock, {
      deadlineAt: Date.now() + 60_000,
      statusMessage: 'Backing off until later',
    });
    await db.redis.hset(keys.task(taskId), 'backOff', '1');
    await store.runs.startRun({
      taskId,
      lock,
      attempt: 2,
      deadlineAt: Date.now() + 60_000,
      startedAt: new Date(2_000),
    });
    const again = await store.records.get(taskId);
    expect(again).toMatchObject({ attempt: 2, toolVersion: 'v1' });
    expect(await db.redis.hget(keys.task(taskId), 'startedAt')).toBe(new Date(1_000).toISOString());
    expect(again?.statusMessage).toBeUndefined();
    expect(await db.redis.hexists(keys.task(taskId), 'backOff')).toBe(0);
  });

  it('a progress update writes its fields in one HSET, and one without a total drops the old one', async () => {
    const { store, keys } = setup('progress-cost');
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    const commands = await scriptCommands(keys.prefix, () =>
      store.runs.recordProgress(taskId, { progress: 1, total: 4, message: 'one' }),
    );
    // The task's fields, the write, then the gateway's backlog budget (§22.4) before the publish.
    expect(commands).toEqual(['hmget', 'hset', 'hmget', 'publish']);
    expect(await store.runs.recordProgress(taskId, { progress: 2 })).toBe('accepted');
    const record = await store.records.get(taskId);
    expect(record).toMatchObject({ progress: 2, statusMessage: 'one' });
    expect(record?.total).toBeUndefined();
  });

  it('a transition reads the task’s status, id and message once; its event carries the message it wrote or had', async () => {
    const { store, keys } = setup('transition-cost');
    const sub = new Redis(db.server.url);
    const seen: Array<{ status?: string; statusMessage?: string }> = [];
    await sub.subscribe(keys.gatewayChannel('g1'));
    sub.on('message', (_c, m) => seen.push(JSON.parse(m) as { status?: string; statusMessage?: string }));
    const { taskId } = await store.records.create({ ...base, gatewayId: 'g1' });
    await store.runs.recordProgress(taskId, { progress: 1, message: 'halfway' });
    const commands = await scriptCommands(keys.prefix, () =>
      store.runs.transition(taskId, 'completed', { result: { content: [] } }),
    );
    expect(commands.filter((c) => c === 'hget' || c === 'hmget').slice(0, 1)).toEqual(['hmget']);
    expect(commands.filter((c) => c === 'hget')).toEqual(['hget']); // the retention policy's, in finish()
    const other = await store.records.create({ ...base, gatewayId: 'g1' });
    await store.runs.transition(other.taskId, 'failed', {
      statusMessage: 'broke',
      error: { code: 'INTERNAL', message: 'x' },
    });
    await waitFor(() => seen.filter((e) => e.status !== undefined).length === 2);
    expect(seen.filter((e) => e.status !== undefined).map((e) => [e.status, e.statusMessage])).toEqual([
      ['completed', 'halfway'],
      ['failed', 'broke'],
    ]);
    sub.disconnect();
  });
});

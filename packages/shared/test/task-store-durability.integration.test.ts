/**
 * PROTOCOL.md §10 at the store: the live set and the reaper, lock-checked writes, idempotent creation, watchers, and
 * a bounded, cursor-paged principal index. Real Redis; BullMQ's keys are written by hand where a test needs a job.
 */
import { describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { createKeys, type Keys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';

const db = useRedis();

function setup(label: string, options: ConstructorParameters<typeof TaskStore>[2] = {}) {
  const keys = createKeys(uniquePrefix(label));
  return { keys, store: new TaskStore(db.redis, keys, { reaperIntervalMs: 0, ...options }) };
}

const base = {
  tool: 'build_report',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
  gatewayId: 'g1',
};

/** A BullMQ job hash, as `Queue.add` leaves it (only existence matters to the reaper). */
async function fakeJob(keys: Keys, taskId: string, state: 'waiting' | 'failed' = 'waiting'): Promise<void> {
  const jobKey = `${keys.bullQueueKeyPrefix}default:${taskId}`;
  await db.redis.hset(jobKey, 'name', 'build_report', 'data', '{}');
  if (state === 'failed') {
    await db.redis.hset(jobKey, 'failedReason', 'job stalled more than allowable limit');
    await db.redis.zadd(`${keys.bullQueueKeyPrefix}default:failed`, Date.now(), taskId);
  }
}

async function holdLock(keys: Keys, taskId: string, token: string): Promise<void> {
  await db.redis.set(keys.bullJobLock('default', taskId), token, 'PX', 60_000);
}

describe('§10.3 the reaper', () => {
  it('fails a task whose job was never enqueued, and frees its idempotency key', async () => {
    const { store, keys } = setup('reap-lost');
    const { taskId } = await store.records.create({ ...base, idempotencyKey: 'k1' });
    const outcome = await store.runs.reap('g1');
    expect(outcome.reaped).toEqual([{ taskId, code: 'JOB_LOST', message: expect.stringMatching(/lost/) as string }]);
    const task = await store.records.get(taskId);
    expect(task).toMatchObject({ status: 'failed', error: { code: 'JOB_LOST' } });
    expect(task?.result?.isError).toBe(true);
    expect(await db.redis.zscore(keys.live, taskId)).toBeNull();
    expect(await db.redis.exists(keys.idempotency('alice', 'k1'))).toBe(0);
    expect(await db.redis.pttl(keys.task(taskId))).toBeGreaterThan(0);
  });

  it('§30.1 keeps a reaped task as long as the retention of failed tasks says', async () => {
    const { store, keys } = setup('reap-retain');
    await store.records.setRetention({ failed: 3 * 86_400_000 });
    const { taskId } = await store.records.create(base);
    await store.runs.reap('g1');
    expect((await store.records.get(taskId))?.status).toBe('failed');
    expect(await db.redis.pttl(keys.task(taskId))).toBeGreaterThan(2 * 86_400_000);
  });

  it('fails a task whose job sits in the failed set, with BullMQ’s reason', async () => {
    const { store, keys } = setup('reap-failed');
    const { taskId } = await store.records.create(base);
    await fakeJob(keys, taskId, 'failed');
    const outcome = await store.runs.reap('g1');
    expect(outcome.reaped[0]?.message).toMatch(/failed: job stalled more than allowable limit/);
    expect((await store.records.get(taskId))?.status).toBe('failed');
  });

  it('fails a task past its deadline even while its job exists', async () => {
    const { store, keys } = setup('reap-deadline');
    const { taskId } = await store.records.create({ ...base, deadlineAt: Date.now() - 1 });
    await fakeJob(keys, taskId);
    const outcome = await store.runs.reap('g1');
    expect(outcome.reaped).toEqual([{ taskId, code: 'TIMEOUT', message: expect.stringMatching(/deadline/) as string }]);
  });

  it('leaves a task with a live job alone and looks again later; drops terminal ones from the live set', async () => {
    const { store, keys } = setup('reap-alive', { reaperIntervalMs: 0 });
    const alive = await store.records.create(base);
    await fakeJob(keys, alive.taskId);
    const done = await store.records.create(base);
    await db.redis.hset(keys.task(done.taskId), 'status', 'completed'); // as if its terminal write lost the ZREM
    const outcome = await store.runs.reap('g1');
    expect(outcome).toMatchObject({ ran: true, looked: 2, reaped: [] });
    expect((await store.records.get(alive.taskId))?.status).toBe('working');
    expect(await db.redis.zscore(keys.live, alive.taskId)).not.toBeNull();
    expect(await db.redis.zscore(keys.live, done.taskId)).toBeNull();
  });

  it('does not look at a new task before the enqueue grace has passed', async () => {
    const { store } = setup('reap-grace', { reaperIntervalMs: 60_000 });
    const { taskId } = await store.records.create(base);
    expect((await store.runs.reap('g1')).looked).toBe(0);
    expect((await store.records.get(taskId))?.status).toBe('working');
  });

  it('lets one holder at a time run it', async () => {
    const { store } = setup('reap-lease');
    expect((await store.runs.reap('g1')).ran).toBe(true);
    expect((await store.runs.reap('g2')).ran).toBe(false);
    expect((await store.runs.reap('g1')).ran).toBe(true);
  });

  it('publishes the failure to the owner and to every watcher', async () => {
    const { store, keys } = setup('reap-publish');
    const sub = new Redis(db.server.url);
    const seen: Array<{ channel: string; status: string }> = [];
    await sub.subscribe(keys.gatewayChannel('g1'), keys.gatewayChannel('g2'));
    sub.on('message', (channel, m) => seen.push({ channel, status: (JSON.parse(m) as { status: string }).status }));
    const { taskId } = await store.records.create(base);
    await store.records.watch(taskId, 'g2');
    await store.runs.reap('g1');
    await waitFor(() => seen.length === 2);
    expect(seen.map((e) => e.status)).toEqual(['failed', 'failed']);
    sub.disconnect();
  });
});

describe('§10.4 lock-checked writes', () => {
  it('refuses progress, start and terminal writes unless the lock holds the same token', async () => {
    const { store, keys } = setup('lock');
    const { taskId } = await store.records.create(base);
    const mine = { queue: 'default', token: 'run-1' };
    await holdLock(keys, taskId, 'run-2'); // another run took the job over
    expect(await store.runs.recordProgress(taskId, { progress: 1 }, mine)).toBe('lock_lost');
    expect(await store.runs.startRun({ taskId, lock: mine, attempt: 1, deadlineAt: Date.now() + 1000 })).toEqual({
      lockLost: true,
    });
    expect(await store.runs.transition(taskId, 'completed', { result: { content: [] } }, { lock: mine })).toEqual({
      ok: false,
      status: 'working',
      lockLost: true,
    });
    expect((await store.records.get(taskId))?.status).toBe('working');

    await holdLock(keys, taskId, 'run-1');
    expect(await store.runs.recordProgress(taskId, { progress: 1 }, mine)).toBe('accepted');
    const started = await store.runs.startRun({ taskId, lock: mine, attempt: 2, deadlineAt: 12345 });
    expect(started).toMatchObject({ lockLost: false, record: { attempt: 2, deadlineAt: 12345 } });
    expect((await store.runs.transition(taskId, 'completed', { result: { content: [] } }, { lock: mine })).ok).toBe(
      true,
    );
  });

  it('takes a started job out of its principal’s fair share, unless the lock is another run’s (§25)', async () => {
    const { store, keys } = setup('share');
    const { taskId } = await store.records.create({ ...base, fairShare: { ttlMs: 60_000 } });
    const share = keys.fairShare('default', base.principal);
    expect(await db.redis.zscore(share, taskId)).not.toBeNull();
    const mine = { queue: 'default', token: 'run-1' };
    await holdLock(keys, taskId, 'run-2');
    expect(
      await store.runs.startRun({
        taskId,
        lock: mine,
        attempt: 1,
        deadlineAt: Date.now() + 1000,
        sharePrincipal: base.principal,
      }),
    ).toEqual({ lockLost: true });
    expect(await db.redis.zscore(share, taskId)).not.toBeNull();
    await holdLock(keys, taskId, 'run-1');
    expect(
      (
        await store.runs.startRun({
          taskId,
          lock: mine,
          attempt: 1,
          deadlineAt: Date.now() + 1000,
          sharePrincipal: base.principal,
        })
      ).lockLost,
    ).toBe(false);
    expect(await db.redis.zscore(share, taskId)).toBeNull();
  });

  it('leaves the gateway’s writes (no lock) unchecked', async () => {
    const { store } = setup('nolock');
    const { taskId } = await store.records.create(base);
    expect((await store.runs.transition(taskId, 'cancelled')).ok).toBe(true);
  });
});

describe('§10.8 idempotent creation', () => {
  it('returns the same task for the same principal and key, and a new one for another principal', async () => {
    const { store } = setup('idem');
    const first = await store.records.createTask({ ...base, idempotencyKey: 'order-1' });
    const again = await store.records.createTask({ ...base, idempotencyKey: 'order-1' });
    const other = await store.records.createTask({ ...base, principal: 'bob', idempotencyKey: 'order-1' });
    expect(first.created).toBe(true);
    expect(again).toMatchObject({ created: false, record: { taskId: first.record.taskId } });
    expect(other.created).toBe(true);
    expect(other.record.taskId).not.toBe(first.record.taskId);
  });

  it('lets exactly one of many concurrent creates with one key win', async () => {
    const { store } = setup('idem-race');
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, () => store.records.createTask({ ...base, idempotencyKey: 'race' })),
    );
    expect(outcomes.filter((o) => o.created)).toHaveLength(1);
    expect(new Set(outcomes.map((o) => o.record.taskId)).size).toBe(1);
  });

  it('refuses a key already used for another tool, and keeps the mapping exactly as long as the task', async () => {
    const { store, keys } = setup('idem-ttl');
    const { record } = await store.records.createTask({ ...base, idempotencyKey: 'k' });
    await expect(store.records.createTask({ ...base, tool: 'other', idempotencyKey: 'k' })).rejects.toThrow(
      /another|tool/,
    );
    expect(await db.redis.pttl(keys.idempotency('alice', 'k'))).toBe(-1);
    await store.runs.transition(record.taskId, 'completed', { result: { content: [] } });
    const ttl = await db.redis.pttl(keys.idempotency('alice', 'k'));
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });
});

describe('§10.9 watchers', () => {
  it('sends status changes to the owner and each watcher once, and to nobody else', async () => {
    const { store, keys } = setup('watch');
    const sub = new Redis(db.server.url);
    const seen: string[] = [];
    await sub.subscribe(keys.gatewayChannel('g1'), keys.gatewayChannel('g2'), keys.gatewayChannel('g3'));
    sub.on('message', (channel) => seen.push(channel));
    const { taskId } = await store.records.create(base);
    expect((await store.records.watch(taskId, 'g2'))?.taskId).toBe(taskId);
    await store.records.watch(taskId, 'g2');
    await store.records.watch(taskId, 'g1');
    await store.runs.transition(taskId, 'completed', { result: { content: [] } });
    await waitFor(() => seen.length >= 2);
    await store.runs.transition(taskId, 'failed'); // refused: nothing published
    expect(seen.sort()).toEqual([keys.gatewayChannel('g1'), keys.gatewayChannel('g2')]);
    expect(await store.records.watch('missing', 'g2')).toBeUndefined();
    sub.disconnect();
  });
});

describe('§10 bounded index and stable pages', () => {
  it('indexes only task-mode ids, keeps the newest up to the cap, and expires', async () => {
    const { store, keys } = setup('index', { indexCap: 3, indexTtlMs: 50_000 });
    await store.records.create({ ...base, mode: 'call' });
    const ids: string[] = [];
    for (let i = 0; i < 5; i++)
      ids.push((await store.records.create(base, new Date(Date.UTC(2026, 0, 1, 0, 0, i)))).taskId);
    const index = keys.principalTasks('alice');
    expect(await db.redis.zrange(index, 0, -1)).toEqual(ids.slice(2));
    const ttl = await db.redis.pttl(index);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(50_000);
  });

  it('pages without duplicates or gaps while tasks are created between pages, ties included', async () => {
    const { store } = setup('pages');
    const same = new Date(Date.UTC(2026, 0, 1));
    const ids = new Set<string>();
    for (let i = 0; i < 7; i++) ids.add((await store.records.create(base, same)).taskId);
    const seen: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await store.records.list('alice', cursor, 3);
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
      await store.records.create(base); // newer than every cursor: never on a later page
    } while (cursor !== undefined);
    expect(seen).toHaveLength(7);
    expect(new Set(seen)).toEqual(ids);
  });
});

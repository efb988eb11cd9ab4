/**
 * The task store in the sharded key layout (PROTOCOL.md §1.1), forced on one Redis: what spans shards stays exact —
 * `tasks/list` pages merged from every shard's index with its cursor, the reaper's pass over every shard's live set,
 * the live ids of every shard, the retention copy on every shard — and each task's keys stay under its own shard.
 */
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';
import { newTaskId } from '../src/store/task-codec.js';
import { WebhookOutbox } from '../src/webhook-outbox.js';

const db = useRedis();

function setup(label: string) {
  const prefix = uniquePrefix(label);
  const keys = createKeys(prefix, 'sharded');
  return { prefix, keys, store: new TaskStore(db.redis, keys, { reaperIntervalMs: 0 }) };
}

const base = {
  tool: 'hot',
  queue: 'default~hot',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
  gatewayId: 'g1',
};

describe('the sharded layout on one Redis', () => {
  it('places a tool’s shards once, and every process reads the same codes', async () => {
    const { keys, store } = setup('place');
    const codes = await store.placement?.codes('default~hot', 3);
    expect(codes).toHaveLength(3);
    expect(new Set(codes).size).toBe(3);
    for (const code of codes ?? []) expect(code).toMatch(/^[0-9a-f]{4}$/);
    // Another process (a store of its own) reads them from the registry, and places nothing new.
    const other = new TaskStore(db.redis, keys);
    expect(await other.placement?.codes('default~hot', 3)).toEqual(codes);
    expect(await other.placement?.codes('default~hot', 1)).toEqual(codes?.slice(0, 1));
    expect(Object.keys(await db.redis.hgetall(keys.placement))).toHaveLength(3);
  });

  it('keeps a task and what its create touched under the shard its id names', async () => {
    const { prefix, store } = setup('own');
    const [code] = (await store.placement?.codes('default~hot', 1)) ?? [];
    const created = await store.records.create({ ...base, taskId: newTaskId(code), idempotencyKey: 'k' });
    expect(created.taskId).toMatch(new RegExp(`^${code}[0-9a-f]{32}$`));
    const written = await db.redis.keys(`${prefix}:*`);
    for (const key of written.filter((k) => !k.includes('{home}')))
      expect(key.startsWith(`${prefix}:{${code}}:`)).toBe(true);
    expect(written.some((k) => k === `${prefix}:{${code}}:task:${created.taskId}`)).toBe(true);
    expect(written.some((k) => k === `${prefix}:{${code}}:live`)).toBe(true);
    // A create without an id goes to the tool's first shard.
    const plain = await store.records.create(base);
    expect(plain.taskId.slice(0, 4)).toBe(code);
  });

  it('lists a principal’s tasks of every shard newest first, page by page, with no duplicate and no gap', async () => {
    const { store } = setup('list');
    const codes = (await store.placement?.codes('default~hot', 3)) ?? [];
    const made: Array<{ id: string; at: number }> = [];
    // 12 tasks over 3 shards, some created in the same millisecond (ties are ordered by id).
    for (let i = 0; i < 12; i++) {
      const at = new Date(1_800_000_000_000 + Math.floor(i / 2));
      const taskId = newTaskId(codes[i % 3]);
      await store.records.create({ ...base, taskId }, at);
      made.push({ id: taskId, at: at.getTime() });
    }
    const expected = [...made].sort((a, b) => b.at - a.at || (a.id < b.id ? 1 : -1)).map((t) => t.id);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await store.records.list('alice', cursor, 5);
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
      pages++;
    } while (cursor !== undefined && pages < 10);
    expect(pages).toBe(3);
    expect(seen).toEqual(expected);
  });

  it('reaps every shard’s live tasks in one pass, and lists the live ids of every shard', async () => {
    const { keys, store } = setup('reap');
    await store.records.setRetention({ failed: 86_400_000 });
    const codes = (await store.placement?.codes('default~hot', 3)) ?? [];
    const ids: string[] = [];
    for (const code of codes) ids.push((await store.records.create({ ...base, taskId: newTaskId(code) })).taskId);
    expect((await store.records.liveIds(10)).sort()).toEqual([...ids].sort());
    // Shards placed after the retention was written start with a copy of it.
    for (const code of codes) expect(await db.redis.hget(keys.forShard(code).retention, 'failed')).toBe('86400000');
    const outcome = await store.runs.reap('g1');
    expect(outcome.ran).toBe(true);
    expect(outcome.reaped.map((r) => r.taskId).sort()).toEqual([...ids].sort());
    for (const id of ids) expect((await store.records.get(id))?.status).toBe('failed');
    expect(await store.records.liveIds(10)).toEqual([]);
    expect(await store.records.statuses(ids)).toEqual(['failed', 'failed', 'failed']);
  });

  it('delivers the webhook events of every shard: claim, settle, counts and dead letters span the shards', async () => {
    const { store } = setup('outbox');
    const codes = (await store.placement?.codes('default~hot', 3)) ?? [];
    // The outbox over the store's runner finds every placed shard's outbox by itself.
    const outbox = new WebhookOutbox(store.runner);
    const ids: string[] = [];
    for (const code of codes) {
      const { taskId } = await store.records.create({
        ...base,
        taskId: newTaskId(code),
        webhook: { url: 'http://h/x', cap: 10 },
      });
      await store.runs.transition(taskId, 'completed', { result: { content: [] } });
      ids.push(taskId);
    }
    expect(await outbox.pendingFor('alice')).toBe(3);
    expect(await outbox.counts()).toEqual({ pending: 3, dead: 0 });
    const { events: claimed } = await outbox.claim('g1', 10, 30_000);
    expect(claimed.map((e) => e.taskId).sort()).toEqual([...ids].sort());
    const [first, second, third] = claimed;
    expect(await outbox.settle(first!, { outcome: 'delivered' })).toBe(true);
    expect(await outbox.settle(second!, { outcome: 'dead', reason: 'no' })).toBe(true);
    expect(await outbox.settle(third!, { outcome: 'dead', reason: 'no' })).toBe(true);
    expect(await outbox.counts()).toEqual({ pending: 0, dead: 2 });
    expect((await outbox.deadLetters(10)).map((d) => d.id).sort()).toEqual([second!.id, third!.id].sort());
    expect(await outbox.resend(undefined)).toHaveLength(2);
    expect(await outbox.counts()).toEqual({ pending: 2, dead: 0 });
  });
});

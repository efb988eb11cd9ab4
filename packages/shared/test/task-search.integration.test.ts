/**
 * PROTOCOL.md §30.2 against a real Redis: what a task keeps for its operators (tags, arguments, replay links) and the
 * search over the task index: filters, newest first, pages that never repeat or skip a task (ties of one millisecond
 * included), a bounded scan whatever the filter, and the index pruned of tasks that are gone.
 */
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { TaskStore } from '../src/store/task-store.js';
import { newTaskId } from '../src/store/task-codec.js';
import { SEARCH_SCAN_BUDGET, TaskSearch } from '../src/task-search.js';

const db = useRedis();

function setup(label: string) {
  const keys = createKeys(uniquePrefix(label));
  const store = new TaskStore(db.redis, keys);
  return { keys, store, search: new TaskSearch(store.runner) };
}

const base = {
  tool: 'build_report',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
};
const at = (s: number) => new Date(Date.UTC(2026, 11, 1, 0, 0, s));

describe('§30.2 what a task keeps for its operators', () => {
  it('keeps a task’s arguments beside its hash, expiring with it; a plain call keeps none', async () => {
    const { store, keys } = setup('args');
    const task = await store.records.create({ ...base, ttl: 5_000, argumentsJson: '{"report":"q3"}' });
    const call = await store.records.create({ ...base, mode: 'call', argumentsJson: '{"report":"q4"}' });
    expect(await db.redis.get(keys.taskArguments(task.taskId))).toBe('{"report":"q3"}');
    expect(await db.redis.pttl(keys.taskArguments(task.taskId))).toBe(-1);
    expect(await db.redis.exists(keys.taskArguments(call.taskId))).toBe(0);
    await store.runs.transition(task.taskId, 'failed');
    const pttl = await db.redis.pttl(keys.taskArguments(task.taskId));
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5_000);
  });

  it('stores a call’s tags, adds a run’s under its lock (each once, at most 10), and links a replay both ways', async () => {
    const { store, keys } = setup('tags');
    const { taskId } = await store.records.create({ ...base, tags: ['nightly', 'team:data'] });
    const lock = { queue: 'default', token: 'tok' };
    await db.redis.set(keys.bullJobLock('default', taskId), 'tok');
    expect(await store.runs.addTags(taskId, lock, ['team:data', 'retry'])).toBe('written');
    expect((await store.records.get(taskId))?.tags).toEqual(['nightly', 'team:data', 'retry']);
    const eight = Array.from({ length: 8 }, (_v, i) => `t${i}`);
    expect(await store.runs.addTags(taskId, lock, eight)).toBe('full');
    expect((await store.records.get(taskId))?.tags).toHaveLength(3);
    expect(await store.runs.addTags(taskId, { ...lock, token: 'other' }, ['x'])).toBe('lock_lost');
    await store.runs.transition(taskId, 'failed');
    expect(await store.runs.addTags(taskId, lock, ['late'])).toBe('gone');
    const replay = await store.records.create({ ...base, replayOf: taskId, steps: '{"fetch":1}' });
    expect(await store.records.get(taskId)).toMatchObject({ replayedBy: replay.taskId });
    expect(await store.records.get(replay.taskId)).toMatchObject({ replayOf: taskId, steps: { fetch: 1 } });
  });
});

describe('§30.2 search', () => {
  it('filters by status, tool, principal, tag and creation time, newest first', async () => {
    const { store, search } = setup('filter');
    const make = async (s: number, o: Partial<typeof base> & { tags?: string[]; end?: 'failed' | 'completed' }) => {
      const { end, ...input } = o;
      const { taskId } = await store.records.create({ ...base, ...input }, at(s));
      if (end) await store.runs.transition(taskId, end);
      return taskId;
    };
    const a = await make(1, { end: 'failed', tags: ['nightly'] });
    const b = await make(2, { end: 'failed', tool: 'other', tags: ['nightly'] });
    const c = await make(3, { end: 'completed', tags: ['nightly'] });
    const d = await make(4, { end: 'failed', principal: 'bob', tags: ['nightly'] });
    const e = await make(5, { end: 'failed' });
    const f = await make(6, {});
    const ids = async (filter: Parameters<TaskSearch['search']>[0]) =>
      (await search.search(filter)).tasks.map((t) => t.taskId);
    expect(await ids({})).toEqual([f, e, d, c, b, a]);
    expect(await ids({ status: ['failed'] })).toEqual([e, d, b, a]);
    expect(await ids({ status: ['failed'], tool: 'build_report', tag: 'nightly' })).toEqual([d, a]);
    expect(await ids({ status: ['failed', 'completed'], principal: 'alice', tag: 'nightly' })).toEqual([c, b, a]);
    expect(await ids({ since: at(2).getTime(), until: at(4).getTime() })).toEqual([d, c, b]);
    expect(await ids({ status: ['working'] })).toEqual([f]);
    const [first] = (await search.search({ tag: 'nightly', principal: 'bob' })).tasks;
    expect(first).toMatchObject({
      taskId: d,
      tool: 'build_report',
      principal: 'bob',
      status: 'failed',
      tags: ['nightly'],
    });
  });

  it('pages without repeating or skipping a task, ties of one millisecond included', async () => {
    const { store, search } = setup('pages');
    const made: string[] = [];
    for (let i = 0; i < 7; i++) made.push((await store.records.create(base, at(i < 4 ? 1 : 2))).taskId);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await search.search({}, { limit: 2, ...(cursor ? { cursor } : {}) });
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
      pages += 1;
    } while (cursor !== undefined && pages < 10);
    expect(seen).toHaveLength(7);
    expect(new Set(seen)).toEqual(new Set(made));
    await expect(search.search({}, { cursor: 'nonsense' })).rejects.toThrow(/cursor/);
  });

  it('reads at most its scan budget per page, and says where to go on', async () => {
    const { store, search } = setup('budget');
    const rare = (await store.records.create({ ...base, tags: ['rare'] }, at(0))).taskId;
    for (let i = 0; i < SEARCH_SCAN_BUDGET + 10; i++) await store.records.create(base, at(1));
    const first = await search.search({ tag: 'rare' });
    expect(first.tasks).toEqual([]);
    expect(first.scanned).toBe(SEARCH_SCAN_BUDGET);
    expect(first.nextCursor).toBeDefined();
    const second = await search.search({ tag: 'rare' }, { cursor: first.nextCursor! });
    expect(second.tasks.map((t) => t.taskId)).toEqual([rare]);
    expect(second.nextCursor).toBeUndefined();
  });

  it('prunes the index of tasks that are gone, keeping an old unfinished one', async () => {
    const { store, search, keys } = setup('prune');
    const gone = await store.records.create(base, at(1));
    const running = await store.records.create(base, at(2));
    await db.redis.del(keys.task(gone.taskId));
    expect(await search.prune(at(3).getTime())).toBe(1);
    expect(await db.redis.zrange(keys.taskIndex, 0, -1)).toEqual([running.taskId]);
  });
});

describe('§30.4 kept log lines', () => {
  it('keeps at most 1,000 lines, oldest dropped, read after an id; nothing for a task that is gone; expires with it', async () => {
    const { store, keys } = setup('logs');
    const { taskId } = await store.records.create({ ...base, ttl: 5_000 });
    const lines = Array.from({ length: 1_005 }, (_v, i) =>
      JSON.stringify({ level: 'info', msg: `line ${i}`, attempt: 1 }),
    );
    await store.logs.keep(taskId, lines.slice(0, 500));
    await store.logs.keep(taskId, lines.slice(500));
    expect(await db.redis.xlen(keys.taskLogs(taskId))).toBe(1_000);
    const first = await store.logs.read(taskId, undefined, 2);
    expect(first.map((l) => l['msg'])).toEqual(['line 5', 'line 6']);
    expect(first[0]).toMatchObject({ level: 'info', attempt: 1, id: expect.stringMatching(/^\d+-\d+$/) as string });
    const next = await store.logs.read(taskId, first[1]!.id, 1);
    expect(next.map((l) => l['msg'])).toEqual(['line 7']);
    expect(await db.redis.pttl(keys.taskLogs(taskId))).toBe(-1);
    await store.runs.transition(taskId, 'failed');
    const pttl = await db.redis.pttl(keys.taskLogs(taskId));
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5_000);
    // A line flushed after the end expires with the task too; a task that is gone gets no stream at all.
    await store.logs.keep(taskId, [JSON.stringify({ msg: 'late' })]);
    expect(await db.redis.pttl(keys.taskLogs(taskId))).toBeGreaterThan(0);
    await store.logs.keep('gone', [JSON.stringify({ msg: 'x' })]);
    expect(await db.redis.exists(keys.taskLogs('gone'))).toBe(0);
  });
});

describe('§30.2 the search in the sharded layout (PROTOCOL.md §1.1), on one Redis', () => {
  function shardedSetup(label: string) {
    const keys = createKeys(uniquePrefix(label), 'sharded');
    const store = new TaskStore(db.redis, keys);
    return { keys, store, search: new TaskSearch(store.runner) };
  }

  it('finds the tasks of every shard, newest first, page by page with no duplicate and no gap, filters applied', async () => {
    const { store, search } = shardedSetup('search-shards');
    const codes = (await store.placement?.codes('default~hot', 3)) ?? [];
    const made: string[] = [];
    // 30 tasks over 3 shards, two by two in the same second (ties ordered by id), every third one failed.
    for (let i = 0; i < 30; i++) {
      const { taskId } = await store.records.create(
        { ...base, tool: 'hot', taskId: newTaskId(codes[i % 3]) },
        at(i >> 1),
      );
      if (i % 3 === 0) await store.runs.transition(taskId, 'failed');
      made.push(taskId);
    }
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await search.search({}, { limit: 4, ...(cursor === undefined ? {} : { cursor }) });
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
      pages += 1;
    } while (cursor !== undefined && pages < 20);
    expect(new Set(seen).size).toBe(30);
    expect(seen).toHaveLength(30);
    // Newest first: by creation time, ties by id descending.
    const order = made
      .map((id, i) => ({ id, s: i >> 1 }))
      .sort((a, b) => b.s - a.s || (a.id < b.id ? 1 : -1))
      .map((e) => e.id);
    expect(seen).toEqual(order);
    // A filter, and a time window, span the shards too.
    const failed = await search.search({ status: ['failed'] }, { limit: 50 });
    expect(failed.tasks.map((t) => t.taskId).sort()).toEqual(made.filter((_, i) => i % 3 === 0).sort());
    const window = await search.search({ since: at(3).getTime(), until: at(5).getTime() }, { limit: 50 });
    expect(window.tasks.map((t) => t.taskId).sort()).toEqual(made.slice(6, 12).sort());
    expect(window.nextCursor).toBeUndefined();
    // The operator's replay selection reads every shard.
    expect((await search.ended({}, 100)).tasks).toHaveLength(10);
  });

  it('reads on past a round of entries that matched nothing, to the oldest match of every shard', async () => {
    const { store, search } = shardedSetup('search-rounds');
    const codes = (await store.placement?.codes('default~hot', 3)) ?? [];
    const old: string[] = [];
    // 250 tasks: more than one round reads (200); only the three oldest carry the tag.
    for (let i = 0; i < 250; i++) {
      const tags = i < 3 ? ['old'] : [];
      const { taskId } = await store.records.create(
        { ...base, tool: 'hot', tags, taskId: newTaskId(codes[i % 3]) },
        at(i),
      );
      if (i < 3) old.push(taskId);
    }
    const page = await search.search({ tag: 'old' }, { limit: 50 });
    expect(page.tasks.map((t) => t.taskId)).toEqual(old.reverse());
    expect(page.scanned).toBe(250);
  });

  it('prunes every shard’s index of tasks that are gone', async () => {
    const { keys, store, search } = shardedSetup('prune-shards');
    const codes = (await store.placement?.codes('default~hot', 2)) ?? [];
    const ids: string[] = [];
    for (const code of codes)
      ids.push((await store.records.create({ ...base, tool: 'hot', taskId: newTaskId(code) }, at(1))).taskId);
    for (const id of ids) await db.redis.del(keys.forTask(id).task(id));
    expect(await search.prune(at(2).getTime())).toBe(2);
    for (const id of ids) expect(await db.redis.zscore(keys.forTask(id).taskIndex, id)).toBeNull();
  });
});

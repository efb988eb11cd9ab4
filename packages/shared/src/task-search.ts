/**
 * Operators' search over tasks (PROTOCOL.md §30.2): the task index (or one principal's), newest first, filtered by
 * status, tool, principal, tag and creation time, in pages that are bounded however rare the match. Redis has no
 * secondary index that fits (RediSearch is a module most deployments lack), so a page reads the index in batches and
 * filters each batch's fields, read in one pipeline; a cursor carries on where a page stopped.
 */
import type { Keys } from './protocol/keys.js';
import { pipelineByShard } from './placement.js';
import type { RedisClient } from './redis.js';
import { SCRIPTS } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';
import { TASK_FIELDS as F } from './protocol/task-fields.js';
import { TASK_STATUSES, isTerminal, type TaskStatus } from './protocol/task-model.js';
import { TaskrelayError } from './protocol/errors.js';

/** What a search selects; every filter given must match. */
export interface TaskFilter {
  /** Any of these statuses. */
  status?: readonly TaskStatus[];
  tool?: string;
  principal?: string;
  tag?: string;
  /** Created at or after (ms since epoch). */
  since?: number;
  /** Created at or before (ms since epoch). */
  until?: number;
}

/** What a list shows of a task: never its arguments or its result. */
export interface TaskSummary {
  taskId: string;
  tool: string;
  principal: string;
  status: TaskStatus;
  statusMessage?: string;
  createdAt: string;
  lastUpdatedAt: string;
  attempt?: number;
  tags: string[];
  /** The error of a failed task: its code and message. */
  error?: { code: string; message: string };
  replayOf?: string;
  replayedBy?: string;
}

export interface SearchPage {
  tasks: TaskSummary[];
  /** Where the next page starts; absent when this page reached the end of the index. */
  nextCursor?: string;
  /** How many index entries the page read. */
  scanned: number;
}

export const SEARCH_DEFAULT_LIMIT = 50;
export const SEARCH_MAX_LIMIT = 200;
/** Index entries one page reads at most, whatever the filters: a request's cost is bounded. */
export const SEARCH_SCAN_BUDGET = 5_000;
const BATCH = 200;
/** Index entries the reaper's leader checks per tick for tasks that are gone. */
const PRUNE_BATCH = 500;

const FIELDS = [
  F.taskId,
  F.tool,
  F.principal,
  F.status,
  F.statusMessage,
  F.createdAt,
  F.lastUpdatedAt,
  F.attempt,
  F.tags,
  F.error,
  F.replayOf,
  F.replayedBy,
] as const;

/** A cursor: the score of the last entry read, and how many entries of that score were read. */
interface Cursor {
  s: number;
  n: number;
}

function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify(c)).toString('base64url');
}

function encodeMerged(c: MergedCursor): string {
  return Buffer.from(JSON.stringify(c)).toString('base64url');
}

function decodeCursor(text: string): Cursor {
  try {
    const c = JSON.parse(Buffer.from(text, 'base64url').toString()) as Partial<Cursor>;
    if (typeof c.s === 'number' && Number.isFinite(c.s) && Number.isInteger(c.n) && (c.n ?? -1) >= 0) {
      return { s: c.s, n: c.n as number };
    }
  } catch {
    // below
  }
  throw new TaskrelayError('INVALID_ARGUMENTS', 'cursor is not one this search gave');
}

function summaryOf(values: Array<string | null>): TaskSummary | undefined {
  const v = Object.fromEntries(FIELDS.map((f, i) => [f, values[i] ?? undefined])) as Record<string, string | undefined>;
  const status = v[F.status] as TaskStatus | undefined;
  const taskId = v[F.taskId];
  if (!taskId || !status || !TASK_STATUSES.includes(status)) return undefined;
  const summary: TaskSummary = {
    taskId,
    tool: v[F.tool] ?? '',
    principal: v[F.principal] ?? '',
    status,
    createdAt: v[F.createdAt] ?? '',
    lastUpdatedAt: v[F.lastUpdatedAt] ?? '',
    tags: v[F.tags]?.split(',').filter(Boolean) ?? [],
  };
  if (v[F.statusMessage]) summary.statusMessage = v[F.statusMessage];
  if (v[F.attempt]) summary.attempt = Number(v[F.attempt]);
  if (v[F.replayOf]) summary.replayOf = v[F.replayOf];
  if (v[F.replayedBy]) summary.replayedBy = v[F.replayedBy];
  const error = v[F.error];
  if (status === 'failed' && error) {
    try {
      const e = JSON.parse(error) as { code?: unknown; message?: unknown };
      const text = (v: unknown) => (typeof v === 'string' ? v : '');
      summary.error = { code: text(e.code), message: text(e.message) };
    } catch {
      // an unreadable error shows none
    }
  }
  return summary;
}

function matches(t: TaskSummary, f: TaskFilter): boolean {
  if (f.status && f.status.length > 0 && !f.status.includes(t.status)) return false;
  if (f.tool !== undefined && t.tool !== f.tool) return false;
  if (f.principal !== undefined && t.principal !== f.principal) return false;
  if (f.tag !== undefined && !t.tags.includes(f.tag)) return false;
  return true;
}

/** The sharded search's cursor: the last entry read, in the merged order (score, then id, both descending). */
interface MergedCursor {
  s: number;
  id: string;
}

/** Above every task id (hex, and `.` for a batch child): a cursor at this id takes every entry of its score. */
const ABOVE_EVERY_ID = '~';

function decodeMergedCursor(text: string): MergedCursor {
  try {
    const c = JSON.parse(Buffer.from(text, 'base64url').toString()) as Partial<MergedCursor>;
    if (typeof c.s === 'number' && Number.isFinite(c.s) && typeof c.id === 'string') return { s: c.s, id: c.id };
  } catch {
    // below
  }
  throw new TaskrelayError('INVALID_ARGUMENTS', 'cursor is not one this search gave');
}

/** The index's order: newest first, ties by id descending (what `list-1.lua` pages by). */
function newestFirst(a: { id: string; score: number }, b: { id: string; score: number }): number {
  return b.score - a.score || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

export class TaskSearch {
  private readonly redis: RedisClient;
  private readonly keys: Keys;

  /**
   * @param runner the task store's runner (`TaskStore.runner`): in the sharded layout a search reads every placed
   *   shard's index (`runner.everyShard()`) and merges them (PROTOCOL.md §30.2); in the single layout the one index.
   */
  constructor(private readonly runner: StoreRunner) {
    this.redis = runner.redis;
    this.keys = runner.keys;
  }

  /** One page of the tasks `filter` selects, newest first (PROTOCOL.md §30.2). */
  async search(filter: TaskFilter, page: { cursor?: string; limit?: number } = {}): Promise<SearchPage> {
    const limit = Math.min(SEARCH_MAX_LIMIT, Math.max(1, page.limit ?? SEARCH_DEFAULT_LIMIT));
    if (this.keys.layout === 'sharded') return this.searchShards(filter, page, limit);
    const index = filter.principal === undefined ? this.keys.taskIndex : this.keys.principalTasks(filter.principal);
    const min = filter.since ?? '-inf';
    let at: Cursor | undefined = page.cursor === undefined ? undefined : decodeCursor(page.cursor);
    const tasks: TaskSummary[] = [];
    let scanned = 0;
    while (scanned < SEARCH_SCAN_BUDGET && tasks.length < limit) {
      const max = at?.s ?? filter.until ?? '+inf';
      const count = Math.min(BATCH, SEARCH_SCAN_BUDGET - scanned);
      const flat = await this.redis.zrevrangebyscore(index, max, min, 'WITHSCORES', 'LIMIT', at?.n ?? 0, count);
      if (flat.length === 0) return { tasks, scanned };
      const entries: Array<[string, number]> = [];
      for (let i = 0; i < flat.length; i += 2) entries.push([flat[i] as string, Number(flat[i + 1])]);
      const pipeline = this.redis.pipeline();
      for (const [id] of entries) pipeline.hmget(this.keys.task(id), ...FIELDS);
      const rows = (await pipeline.exec()) ?? [];
      for (let i = 0; i < entries.length; i++) {
        const [, score] = entries[i]!;
        scanned += 1;
        at = at !== undefined && at.s === score ? { s: score, n: at.n + 1 } : { s: score, n: 1 };
        const [error, values] = rows[i] ?? [];
        if (error) throw error;
        const summary = summaryOf(values as Array<string | null>);
        if (summary && matches(summary, filter)) tasks.push(summary);
        if (tasks.length >= limit) break;
      }
      if (entries.length < count && tasks.length < limit) return { tasks, scanned };
    }
    return { tasks, scanned, ...(at === undefined ? {} : { nextCursor: encodeCursor(at) }) };
  }

  /**
   * The sharded layout's search (PROTOCOL.md §30.2): every shard's index, merged in one order (score, then id, both
   * descending), with a cursor that is a position in that order, not in any one index. Each round asks every shard for
   * its next `count` entries after the cursor (`list-1.lua`, which skips the ties already read); the merged first
   * `count` of them are the next `count` of the merged index, since no shard gave fewer than `count` unless it had no
   * more. The scan budget bounds the entries read the same way as on one index.
   */
  private async searchShards(filter: TaskFilter, page: { cursor?: string }, limit: number): Promise<SearchPage> {
    const shards = await this.runner.everyShard();
    const indexOf = (keys: Keys) =>
      filter.principal === undefined ? keys.taskIndex : keys.principalTasks(filter.principal);
    let at: MergedCursor | undefined =
      page.cursor !== undefined
        ? decodeMergedCursor(page.cursor)
        : filter.until !== undefined
          ? { s: filter.until, id: ABOVE_EVERY_ID }
          : undefined;
    const tasks: TaskSummary[] = [];
    let scanned = 0;
    while (scanned < SEARCH_SCAN_BUDGET && tasks.length < limit) {
      const count = Math.min(BATCH, SEARCH_SCAN_BUDGET - scanned);
      const pages = await Promise.all(
        shards.map(async (keys) => {
          const reply = await this.runner.call(SCRIPTS.list, {
            keys: { index: indexOf(keys) },
            args: { cursorScore: at === undefined ? '' : String(at.s), cursorId: at?.id ?? '', limit: count },
          });
          const rows = (reply.values[0] as string[] | undefined) ?? [];
          const found: Array<{ id: string; score: number }> = [];
          for (let i = 0; i + 1 < rows.length; i += 2) found.push({ id: rows[i] ?? '', score: Number(rows[i + 1]) });
          return found;
        }),
      );
      const merged = pages.flat().sort(newestFirst);
      const since = filter.since ?? Number.NEGATIVE_INFINITY;
      const entries = merged.slice(0, count).filter((e) => e.score >= since);
      const more = merged.length > count && entries.length === count;
      const rows = await pipelineByShard(
        this.redis,
        this.keys,
        entries.map((e) => e.id),
        (pipeline, id) => pipeline.hmget(this.keys.forTask(id).task(id), ...FIELDS),
      );
      for (let i = 0; i < entries.length; i++) {
        const entry = entries[i]!;
        scanned += 1;
        at = { s: entry.score, id: entry.id };
        const [error, values] = rows[i] ?? [];
        if (error) throw error;
        const summary = summaryOf(values as Array<string | null>);
        if (summary && matches(summary, filter)) tasks.push(summary);
        if (tasks.length >= limit) break;
      }
      // Every shard read to its end (or to `since`), and the page not full: no next page.
      if (!more && tasks.length < limit) return { tasks, scanned };
    }
    return { tasks, scanned, ...(at === undefined ? {} : { nextCursor: encodeMerged(at) }) };
  }

  /**
   * Every task `filter` selects that has ended, up to `max`, reading pages until the index ends (a bulk replay,
   * §30.3). Answers how many it read too, and whether it stopped at `max`.
   */
  async ended(filter: TaskFilter, max: number): Promise<{ tasks: TaskSummary[]; truncated: boolean }> {
    const tasks: TaskSummary[] = [];
    let cursor: string | undefined;
    const wanted = filter.status?.filter((s) => isTerminal(s)) ?? ['completed', 'failed', 'cancelled'];
    if (wanted.length === 0) return { tasks, truncated: false };
    do {
      const page = await this.search(
        { ...filter, status: wanted },
        { limit: SEARCH_MAX_LIMIT, ...(cursor ? { cursor } : {}) },
      );
      for (const t of page.tasks) {
        if (tasks.length >= max) return { tasks, truncated: true };
        tasks.push(t);
      }
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    return { tasks, truncated: false };
  }

  /**
   * Drops from the task index up to a batch of ids created before `olderThan` (ms) whose task is gone (expired after
   * its retention or ttl). An unfinished task's id stays, however old. Resolves with how many it dropped.
   */
  async prune(olderThan: number): Promise<number> {
    // Every shard's index in the sharded layout (each index with its shard's tasks: one node per pipeline).
    const shards = await this.runner.everyShard();
    let dropped = 0;
    for (const keys of shards) dropped += await this.pruneIndex(keys, olderThan);
    return dropped;
  }

  private async pruneIndex(keys: Keys, olderThan: number): Promise<number> {
    const ids = await this.redis.zrangebyscore(keys.taskIndex, '-inf', olderThan, 'LIMIT', 0, PRUNE_BATCH);
    if (ids.length === 0) return 0;
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.exists(keys.task(id));
    const exists = (await pipeline.exec()) ?? [];
    const gone = ids.filter((_id, i) => exists[i]?.[1] === 0);
    if (gone.length > 0) await this.redis.zrem(keys.taskIndex, ...gone);
    return gone.length;
  }
}

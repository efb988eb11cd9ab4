/**
 * Operators' search over tasks (PROTOCOL.md §30.2): the task index (or one principal's), newest first, filtered by
 * status, tool, principal, tag and creation time, in pages that are bounded however rare the match. Redis has no
 * secondary index that fits (RediSearch is a module most deployments lack), so a page reads the index in batches and
 * filters each batch's fields, read in one pipeline; a cursor carries on where a page stopped.
 */
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';
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

export class TaskSearch {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
  ) {}

  /** One page of the tasks `filter` selects, newest first (PROTOCOL.md §30.2). */
  async search(filter: TaskFilter, page: { cursor?: string; limit?: number } = {}): Promise<SearchPage> {
    const limit = Math.min(SEARCH_MAX_LIMIT, Math.max(1, page.limit ?? SEARCH_DEFAULT_LIMIT));
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
    const ids = await this.redis.zrangebyscore(this.keys.taskIndex, '-inf', olderThan, 'LIMIT', 0, PRUNE_BATCH);
    if (ids.length === 0) return 0;
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.exists(this.keys.task(id));
    const exists = (await pipeline.exec()) ?? [];
    const gone = ids.filter((_id, i) => exists[i]?.[1] === 0);
    if (gone.length > 0) await this.redis.zrem(this.keys.taskIndex, ...gone);
    return gone.length;
  }
}

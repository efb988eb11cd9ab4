import { BatchStore, TaskrelayError, type RedisClient, type Keys, type StoreRunner } from '@taskrelay/shared';

/**
 * The per-principal cap on unfinished work: tasks and plain calls (PROTOCOL.md §25). A sorted set per principal holds
 * the ids of what it created; the task's create script checks the cap and adds the id in the same step, so
 * concurrent creates cannot all pass the check before any is counted (3,000 calls sent at once once put 2,984 jobs in
 * a pool). It is pruned (ended or expired ids, stale reservations of gateways from before the check moved into the
 * create) only when it reaches the cap, so a create below the cap costs nothing more than its create.
 */
/** Reservations are members too, told apart by this mark (task ids never start with it). */
const RESERVATION_MARK = 'reserved:';
/** A reservation older than this is a create that died before `add` (a create takes milliseconds). */
const RESERVATION_MAX_AGE_MS = 60_000;

export class OpenTaskLimit {
  private readonly redis: RedisClient;
  private readonly keys: Keys;
  private readonly batches: BatchStore;

  constructor(
    /** The task store's runner: the open-work sets and the batches it prunes by are on its connection. */
    runner: StoreRunner,
    /** The cap; 0: none. Batch children are held to it too (their jobs carry it, PROTOCOL.md §26.6). */
    readonly max: number,
    /** How long the set outlives its newest task (the longest ttl after the longest run). */
    readonly ttlMs: number,
  ) {
    this.redis = runner.redis;
    this.keys = runner.keys;
    this.batches = new BatchStore(runner);
  }

  /** Drops ended work and stale reservations from the principal's set; resolves with how many members remain. */
  async prune(principal: string, taskId?: string): Promise<number> {
    const key = (taskId === undefined ? this.keys : this.keys.forTask(taskId)).principalOpenTasks(principal);
    const now = Date.now();
    const flat = await this.redis.zrange(key, 0, -1, 'WITHSCORES');
    const ids: string[] = [];
    const stale: string[] = [];
    for (let i = 0; i < flat.length; i += 2) {
      const id = flat[i] ?? '';
      if (!id.startsWith(RESERVATION_MARK)) ids.push(id);
      else if (now - Number(flat[i + 1]) > RESERVATION_MAX_AGE_MS) stale.push(id);
    }
    // Batch children count too (PROTOCOL.md §26.6): one has ended once its outcome is recorded or its parent ended.
    const endedFlags = await this.batches.endedWork(ids);
    const ended = ids.filter((_id, i) => endedFlags[i] === true);
    ended.push(...stale);
    if (ended.length > 0) await this.redis.zrem(key, ...ended);
    return flat.length / 2 - ended.length;
  }

  /** The refusal of a principal with `open` unfinished tasks and calls (the wire answers it -32600). */
  refusal(open: number): TaskrelayError {
    return new TaskrelayError(
      'TOO_MANY_OPEN_TASKS',
      `Too many open tasks: this principal has ${open} unfinished tasks and calls (at most ${this.max}); wait for one to end or cancel one`,
    );
  }
}

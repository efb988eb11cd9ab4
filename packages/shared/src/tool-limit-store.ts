/**
 * The worker-admitted limits of PROTOCOL.md §3.5: a concurrency limit per key (a semaphore whose holders expire with
 * their lease) and a rate limit per key or shared by name (an exact log of starts, and a hold a back-off sets). Each
 * step is one script in Redis' clock. A plain rate limit counts its starts here too, exactly; BullMQ's per-queue
 * limiter then only paces the takes (§3.3).
 */
import { createHash } from 'node:crypto';
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';
import { ResultCode } from './protocol/script-results.js';
import { SCRIPTS, type ScriptRunner } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';

/** A limit's key value, hashed: any value makes a bounded Redis key. */
export function limitKeyDigest(value: string): string {
  return createHash('sha256').update(value).digest('base64url').slice(0, 22);
}

/**
 * The key value of a limit counted per principal (PROTOCOL.md §3.5): the principal and the value, NUL between (a
 * principal name holds no NUL, so no principal's key is another's). Both workers build it this way (Python:
 * `limits.principal_scoped_key`), so Node and Python runs of one tool count in the same limits.
 */
export function principalScopedKey(principal: string, value: string): string {
  return `${principal}\u0000${value}`;
}

/** One slot limit: a tool, a key value, a size. */
export interface SlotLimit {
  tool: string;
  key: string;
  limit: number;
  /** On a limit shared across principals, the run's principal: its line is fair between principals (§3.5). */
  principal?: string;
}

/** One rate limit: its scope (the tool, or the shared name), a key value, `max` starts per `perMs`. */
export interface RateLimit {
  scope: string;
  key: string;
  max: number;
  perMs: number;
}

/**
 * A limit's answer. A rate start taken may say how long until its window has room for the next (`roomInMs`, 0 while
 * it has): a paced limit holds BullMQ's takes that long (PROTOCOL.md §3.3).
 */
export type Admission = { ok: true; roomInMs?: number } | { ok: false; waitMs: number };

export class ToolLimitStore {
  private readonly redis: RedisClient;
  private readonly keys: Keys;
  private readonly scripts: ScriptRunner;

  /** Over the runner of the connection it writes on (store/store-runner.ts): one script runner per connection. */
  constructor(runner: StoreRunner) {
    this.redis = runner.redis;
    this.keys = runner.keys;
    this.scripts = runner.scripts;
  }

  /** Takes waiters out of the line: their jobs are gone (a task cancelled or ended while it waited). */
  async dropWaiters(l: SlotLimit, waiters: readonly string[]): Promise<void> {
    if (waiters.length === 0) return;
    const digest = limitKeyDigest(l.key);
    await this.redis
      .multi()
      .zrem(this.keys.toolLimit('slots', l.tool, digest).b, ...waiters)
      .hdel(this.keys.slotWaitersBy(l.tool, digest), ...waiters)
      .exec();
  }

  /**
   * Takes (or renews) `holder`'s slot; without room the job `waiter` (`<queue> <jobId>`) waits in line, and the answer
   * is the time to the earliest lease end. `renew`: only a slot `holder` still holds (a renewal in flight when its run
   * released takes nothing). `peek` (after a refused run's delayed move): is there room (or is `holder` in), taking
   * nothing; without room `waiter` is put back in line if a releaser dropped it (§3.5 step 3).
   */
  async takeSlot(
    l: SlotLimit,
    holder: string,
    waiter: string,
    leaseMs: number,
    mode: 'take' | 'renew' | 'peek' = 'take',
  ): Promise<Admission> {
    const digest = limitKeyDigest(l.key);
    const k = this.keys.toolLimit('slots', l.tool, digest);
    const reply = await this.scripts.call(SCRIPTS.slotTake, {
      keys: { slots: k.a, waiting: k.b, waitingBy: this.keys.slotWaitersBy(l.tool, digest) },
      args: { holder, limit: l.limit, leaseMs, waiter, mode, principal: l.principal ?? '' },
    });
    return reply.code === ResultCode.OK ? { ok: true } : { ok: false, waitMs: Number(reply.values[0] ?? 0) };
  }

  /** Gives `holder`'s slot back; resolves with the waiters (`<queue> <jobId>`) that now have room, oldest first. */
  async releaseSlot(l: SlotLimit, holder: string, waiter: string): Promise<string[]> {
    const digest = limitKeyDigest(l.key);
    const k = this.keys.toolLimit('slots', l.tool, digest);
    const reply = await this.scripts.call(SCRIPTS.slotRelease, {
      keys: { slots: k.a, waiting: k.b, waitingBy: this.keys.slotWaitersBy(l.tool, digest) },
      args: { holder, limit: l.limit, waiter },
    });
    return reply.values.map(String);
  }

  /**
   * Records a start of `start` (unique per run) if the window has room and no hold stands; taken, it says how long
   * until the window has room for another.
   */
  async takeStart(l: RateLimit, start: string): Promise<Admission> {
    const k = this.keys.toolLimit('rate', l.scope, limitKeyDigest(l.key));
    const reply = await this.scripts.call(SCRIPTS.rateTake, {
      keys: { starts: k.a, hold: k.b },
      args: { start, max: l.max, perMs: l.perMs },
    });
    const ms = Number(reply.values[0] ?? 0);
    return reply.code === ResultCode.OK ? { ok: true, roomInMs: ms } : { ok: false, waitMs: ms };
  }

  /** Holds the rate limit `ms` from now (a back-off, §3.4): no start of any tool sharing it until then. */
  async hold(l: Pick<RateLimit, 'scope' | 'key'>, ms: number): Promise<void> {
    const k = this.keys.toolLimit('rate', l.scope, limitKeyDigest(l.key));
    await this.scripts.call(SCRIPTS.rateHold, { keys: { hold: k.b }, args: { ms: Math.max(1, Math.round(ms)) } });
  }
}

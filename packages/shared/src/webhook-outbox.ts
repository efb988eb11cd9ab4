/**
 * The webhook outbox's store (PROTOCOL.md §27.2, §27.3, §27.5). Events are appended by the task store's status-change
 * scripts; here they are claimed with a visibility timeout (a lease), fairly between principals, and settled. Both
 * scripts (`webhookClaim-1`, `webhookSettle-3`) are command files behind the script layer, and use Redis server time,
 * as the append does, so gateways whose clocks disagree still agree on what is due.
 */
import { z } from 'zod';
import type { WebhookKeys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';
import { ResultCode } from './protocol/script-results.js';
import { SCRIPTS, type ScriptRunner } from './protocol/scripts.js';
import type { StoreRunner } from './store/store-runner.js';
import { TASK_STATUSES } from './protocol/task-model.js';
import { WEBHOOK_DEAD_LETTERS_KEPT } from './protocol/webhook-limits.js';

export { WEBHOOK_DEAD_LETTERS_KEPT };

/**
 * Due events a claim looks at, at most: past the ones of principals at their cap, it still finds the others' events
 * within this many (a principal's backlog is bounded by its pending cap, `TASKRELAY_WEBHOOK_MAX_PENDING`).
 */
const CLAIM_SCAN = 2_000;

/** One event as claimed: what a try needs (PROTOCOL.md §27.2). */
export const OutboxEventSchema = z.object({
  id: z.string().min(1),
  taskId: z.string().min(1),
  principal: z.string(),
  url: z.string().min(1),
  status: z.enum(TASK_STATUSES),
  statusMessage: z.string().optional(),
  timestamp: z.string(),
  /** Tries so far, this one included. */
  attempts: z.coerce.number().int().min(1),
  /** This try's lease token: settling needs it. */
  lease: z.string().min(1),
});
export type OutboxEvent = z.infer<typeof OutboxEventSchema>;

/** What one try decided (PROTOCOL.md §27.5). */
export type Settlement =
  | { outcome: 'delivered' }
  | { outcome: 'gone' }
  | { outcome: 'retry'; delayMs: number; reason: string }
  | { outcome: 'dead'; reason: string };

export const DeadLetterSchema = z.object({
  id: z.string(),
  taskId: z.string().optional(),
  principal: z.string().optional(),
  url: z.string().optional(),
  status: z.string().optional(),
  attempts: z.number().optional(),
  reason: z.string(),
  /** ms since epoch (Redis server time). */
  deadAt: z.number(),
  /** The event's own time and message (dead letters made before they were kept have none). */
  timestamp: z.string().optional(),
  statusMessage: z.string().optional(),
});
export type DeadLetter = z.infer<typeof DeadLetterSchema>;

/**
 * How one claim shares the slots (PROTOCOL.md §27.3): one event of each principal with nothing in flight first, then
 * more of the others, up to `perPrincipal` each, while more than `reserve` free slots stay free; nothing to a blocked
 * receiver.
 */
export interface ClaimFairness {
  perPrincipal: number;
  /** Tries in flight on this gateway now, by principal. */
  inFlight: ReadonlyMap<string, number>;
  /** Free slots kept for principals with no try in flight (default 0). */
  reserve?: number;
  /**
   * Receivers (`scheme://authority`, lower case) not tried as usual: with a time (ms), their circuit is open and up to
   * `deferMax` of their due events are returned as `deferred`, to be settled as failed tries due again then; with 0
   * their events stay due, untouched; with -1 (half open) one event is taken as a probe, up to `probes` in all.
   */
  blocked?: Readonly<Record<string, number>>;
  /** Deferred events per claim, at most (default 0). */
  deferMax?: number;
  /** Half-open receivers probed per claim, at most (default 0). */
  probes?: number;
  /**
   * Receivers that may take several tries in this claim: those that answered this gateway and have a try in flight
   * on it. Any other receiver that is not blocked gets one (slow start, PROTOCOL.md §27.3), and `Claimed.more` says
   * that others were left due for that. Not given: no slow start.
   */
  trusted?: ReadonlySet<string>;
}

/** What one claim leased: events to try now, and events of receivers whose circuit is open, to settle unsent. */
export interface Claimed {
  events: OutboxEvent[];
  deferred: OutboxEvent[];
  /** Due events were left only because their receiver got its one try of this claim: claim again at once. */
  more: boolean;
}

/**
 * The receiver of a URL: its lower-cased `scheme://authority`. Written as the pattern the claim script uses
 * (`receiverOf` in webhookClaim-1.lua), so both sides name a receiver with the same string; a URL object's `origin`
 * would drop a default port the script cannot drop.
 */
export function receiverOf(url: string): string {
  const match = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/.exec(url);
  return (match?.[0] ?? url).toLowerCase();
}

/**
 * Where the outbox is in the sharded key layout (PROTOCOL.md §1.1): one per shard, beside the task scripts that append
 * to it. An event id (`msg_<taskId>_<n>`) names its task, so its shard.
 */
export interface OutboxShards {
  every(): Promise<WebhookKeys[]>;
  ofEvent(eventId: string): WebhookKeys;
}

/** Where a runner's outbox is: its layout's one, or every placed shard's, found from the event id (PROTOCOL.md §1.1). */
function outboxShardsOf(runner: StoreRunner): OutboxShards {
  const { keys, placement } = runner;
  if (placement === undefined) return { every: () => Promise.resolve([keys.webhooks]), ofEvent: () => keys.webhooks };
  return {
    every: async () => (await placement.all()).map((code) => keys.forShard(code).webhooks),
    ofEvent: (eventId) => keys.forTask(eventId.replace(/^msg_/, '')).webhooks,
  };
}

export class WebhookOutbox {
  private readonly redis: RedisClient;
  private readonly scripts: ScriptRunner;
  private readonly shards: OutboxShards;

  /**
   * Over the task store's runner (store/store-runner.ts). In the sharded layout the outbox is every placed shard's,
   * each event's found from its id; `shards` overrides where the outbox is.
   */
  constructor(runner: StoreRunner, shards?: OutboxShards) {
    this.redis = runner.redis;
    this.scripts = runner.scripts;
    this.shards = shards ?? outboxShardsOf(runner);
  }

  /**
   * Leases up to `batch` due events to `holder` for `leaseMs`, shared as `fairness` says. An event whose hash cannot be
   * read as one (written by hand, or by another version) is settled dead at once rather than retried for ever.
   */
  async claim(
    holder: string,
    batch: number,
    leaseMs: number,
    fairness: ClaimFairness = { perPrincipal: batch, inFlight: new Map() },
  ): Promise<Claimed> {
    const deferMax = fairness.deferMax ?? 0;
    if (batch <= 0 && deferMax <= 0) return { events: [], deferred: [], more: false };
    const claimed: Claimed = { events: [], deferred: [], more: false };
    // A receiver given its one try or its probe on one shard gets none on the next (both hold across shards).
    const blocked: Record<string, number> = { ...fairness.blocked };
    // Sharded: each shard in turn while slots (or deferrals) are left, from a different first shard each time.
    const every = await this.shards.every();
    const first = every.length > 1 ? Math.floor(Math.random() * every.length) : 0;
    for (let i = 0; i < every.length; i++) {
      const left = batch - claimed.events.length;
      const deferLeft = deferMax - claimed.deferred.length;
      if (left <= 0 && deferLeft <= 0) break;
      const keys = every[(first + i) % every.length];
      if (!keys) continue;
      const got = await this.claimFrom(keys, holder, left, leaseMs, {
        ...fairness,
        blocked,
        deferMax: Math.max(0, deferLeft),
      });
      claimed.events.push(...got.events);
      claimed.deferred.push(...got.deferred);
      claimed.more ||= got.more;
      for (const event of got.events) {
        const receiver = receiverOf(event.url);
        const slowStart = fairness.trusted !== undefined && !fairness.trusted.has(receiver);
        if (blocked[receiver] === -1 || (blocked[receiver] === undefined && slowStart)) {
          blocked[receiver] = 0;
          // Its events on the shards after this one are left due: claim again at once, as the script's `more` says.
          if (slowStart && i < every.length - 1) claimed.more = true;
        }
      }
    }
    return claimed;
  }

  private async claimFrom(
    keys: WebhookKeys,
    holder: string,
    batch: number,
    leaseMs: number,
    fairness: ClaimFairness,
  ): Promise<Claimed> {
    const deferMax = fairness.deferMax ?? 0;
    const reply = await this.scripts.call(SCRIPTS.webhookClaim, {
      keys: { due: keys.due },
      args: {
        batch: Math.max(0, batch),
        leaseMs,
        holder,
        eventPrefix: keys.eventPrefix,
        perPrincipal: fairness.perPrincipal,
        inFlight: JSON.stringify(Object.fromEntries(fairness.inFlight)),
        scan: CLAIM_SCAN,
        reserve: fairness.reserve ?? 0,
        blocked: JSON.stringify(fairness.blocked ?? {}),
        deferMax,
        probes: fairness.probes ?? 0,
        trusted: fairness.trusted ? JSON.stringify(Object.fromEntries([...fairness.trusted].map((r) => [r, 1]))) : '',
      },
    });
    return {
      events: await this.readRows(reply.values[0]),
      deferred: await this.readRows(reply.values[1]),
      more: Number(reply.values[2]) === 1,
    };
  }

  private async readRows(value: unknown): Promise<OutboxEvent[]> {
    const rows = (Array.isArray(value) ? value : []) as string[][];
    const events: OutboxEvent[] = [];
    for (const flat of rows) {
      const h: Record<string, string> = {};
      for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
      const parsed = OutboxEventSchema.safeParse(h);
      if (parsed.success) events.push(parsed.data);
      else if (h['id'] && h['lease']) {
        await this.settle({ id: h['id'], lease: h['lease'] }, { outcome: 'dead', reason: 'unreadable event' });
      }
    }
    return events;
  }

  /** Records a try's outcome; false when the lease ran out and another try holds the event now. */
  async settle(event: Pick<OutboxEvent, 'id' | 'lease'>, settlement: Settlement): Promise<boolean> {
    const keys = this.shards.ofEvent(event.id);
    const reply = await this.scripts.call(SCRIPTS.webhookSettle, {
      keys: { due: keys.due, pending: keys.pending, dead: keys.dead },
      args: {
        eventPrefix: keys.eventPrefix,
        id: event.id,
        lease: event.lease,
        outcome: settlement.outcome,
        delayMs: settlement.outcome === 'retry' ? Math.max(0, Math.round(settlement.delayMs)) : 0,
        reason: settlement.outcome === 'retry' || settlement.outcome === 'dead' ? settlement.reason : '',
      },
    });
    return reply.code === ResultCode.OK;
  }

  /** Events of `principal` not settled yet (the creation-time cap). */
  async pendingFor(principal: string): Promise<number> {
    const every = await this.shards.every();
    const held = await Promise.all(every.map((keys) => this.redis.hget(keys.pending, principal)));
    return held.reduce((sum, n) => sum + Number(n ?? 0), 0);
  }

  /** Fleet-wide: events waiting (due or in a try) and dead letters held. */
  async counts(): Promise<{ pending: number; dead: number }> {
    const every = await this.shards.every();
    const counted = await Promise.all(
      every.map((keys) => Promise.all([this.redis.zcard(keys.due), this.redis.llen(keys.dead)])),
    );
    return counted.reduce((sum, [pending, dead]) => ({ pending: sum.pending + pending, dead: sum.dead + dead }), {
      pending: 0,
      dead: 0,
    });
  }

  /**
   * Sends dead events again (an operator's resend, PROTOCOL.md §27.6): the dead letter `id`, or with no id every dead
   * letter, newest first, up to `max`. Each is due at once with its tries counted from 0, under its own event id.
   * Resolves with the ids due again.
   */
  async resend(id: string | undefined, max = WEBHOOK_DEAD_LETTERS_KEPT): Promise<string[]> {
    const every = id === undefined ? await this.shards.every() : [this.shards.ofEvent(id)];
    const resent: string[] = [];
    for (const keys of every) {
      if (resent.length >= max) break;
      const reply = await this.scripts.call(SCRIPTS.webhookResend, {
        keys: { due: keys.due, pending: keys.pending, dead: keys.dead },
        args: { eventPrefix: keys.eventPrefix, id: id ?? '', max: max - resent.length },
      });
      resent.push(...reply.values.map(String));
    }
    return resent;
  }

  /** The newest `limit` dead letters. */
  async deadLetters(limit = 50): Promise<DeadLetter[]> {
    const every = await this.shards.every();
    const lists = await Promise.all(every.map((keys) => this.redis.lrange(keys.dead, 0, Math.max(0, limit - 1))));
    const letters = lists.flat().flatMap((raw) => {
      try {
        const parsed = DeadLetterSchema.safeParse(JSON.parse(raw));
        return parsed.success ? [parsed.data] : [];
      } catch {
        return [];
      }
    });
    // One list per shard in the sharded layout: the newest of all of them (one list keeps its own order).
    return every.length === 1 ? letters : letters.sort((a, b) => b.deadAt - a.deadAt).slice(0, limit);
  }
}

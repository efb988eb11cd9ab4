/**
 * The gateway's side of the webhook outbox (PROTOCOL.md §27.2, §27.3, §27.5). Events are appended by the task store's
 * status-change scripts; here they are claimed with a visibility timeout (a lease) and settled. Both scripts use Redis
 * server time, as the append does, so gateways whose clocks disagree still agree on what is due.
 */
import { z } from 'zod';
import { TASK_STATUSES, type RedisClient, type WebhookKeys } from '@taskrelay/shared';

/** Dead letters kept (newest first); older ones are dropped. */
export const DEAD_LETTERS_KEPT = 1_000;

/**
 * KEYS: 1 due set. ARGV: 1 batch size, 2 lease ms, 3 holder (gateway id), 4 event key prefix.
 * Takes the due events, counts a try on each, leases it to this holder (token `<holder>:<try>`) and hides it until
 * the lease ends. Returns one flat HGETALL list per event claimed.
 */
const CLAIM_SCRIPT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(due) do
  local key = ARGV[4] .. id
  if redis.call('EXISTS', key) == 0 then
    redis.call('ZREM', KEYS[1], id)
  else
    local try = redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'lease', ARGV[3] .. ':' .. try)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    out[#out + 1] = redis.call('HGETALL', key)
  end
end
return out
`;

/**
 * KEYS: 1 due set, 2 pending counts, 3 dead letters. ARGV: 1 event key prefix, 2 event id, 3 lease token,
 * 4 outcome (delivered | gone | retry | dead), 5 retry delay ms, 6 reason, 7 dead letters kept.
 * Does nothing unless the lease is still this try's. Returns 1 settled, 0 the lease is no longer held.
 */
const SETTLE_SCRIPT = `
local key = ARGV[1] .. ARGV[2]
if redis.call('HGET', key, 'lease') ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] == 'retry' then
  redis.call('HSET', key, 'lease', '', 'lastError', ARGV[6])
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[2])
  return 1
end
local h = redis.call('HMGET', key, 'principal', 'taskId', 'url', 'status', 'attempts')
if ARGV[4] == 'dead' then
  redis.call('LPUSH', KEYS[3], cjson.encode({id = ARGV[2], taskId = h[2], principal = h[1], url = h[3],
    status = h[4], attempts = tonumber(h[5]), reason = ARGV[6], deadAt = now}))
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[7]) - 1)
end
redis.call('DEL', key)
redis.call('ZREM', KEYS[1], ARGV[2])
local principal = h[1] or ''
if redis.call('HINCRBY', KEYS[2], principal, -1) <= 0 then redis.call('HDEL', KEYS[2], principal) end
return 1
`;

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
});
export type DeadLetter = z.infer<typeof DeadLetterSchema>;

type ScriptCommand = (...args: Array<string | number>) => Promise<unknown>;

export class WebhookOutbox {
  private readonly claimScript: ScriptCommand;
  private readonly settleScript: ScriptCommand;

  constructor(
    private readonly redis: RedisClient,
    private readonly keys: WebhookKeys,
  ) {
    const commands = redis as unknown as Record<string, ScriptCommand | undefined>;
    if (!commands['taskrelayWebhookClaim']) {
      redis.defineCommand('taskrelayWebhookClaim', { numberOfKeys: 1, lua: CLAIM_SCRIPT });
    }
    if (!commands['taskrelayWebhookSettle']) {
      redis.defineCommand('taskrelayWebhookSettle', { numberOfKeys: 3, lua: SETTLE_SCRIPT });
    }
    const bound = redis as unknown as Record<string, ScriptCommand>;
    this.claimScript = (...args) => bound['taskrelayWebhookClaim']!(...args);
    this.settleScript = (...args) => bound['taskrelayWebhookSettle']!(...args);
  }

  /**
   * Leases up to `batch` due events to `holder` for `leaseMs`. An event whose hash cannot be read as one (written by
   * hand, or by another version) is settled dead at once rather than retried for ever.
   */
  async claim(holder: string, batch: number, leaseMs: number): Promise<OutboxEvent[]> {
    if (batch <= 0) return [];
    const rows = (await this.claimScript(
      this.keys.due,
      String(batch),
      String(leaseMs),
      holder,
      this.keys.eventPrefix,
    )) as string[][];
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
    const reply = await this.settleScript(
      this.keys.due,
      this.keys.pending,
      this.keys.dead,
      this.keys.eventPrefix,
      event.id,
      event.lease,
      settlement.outcome,
      settlement.outcome === 'retry' ? String(Math.max(0, Math.round(settlement.delayMs))) : '0',
      settlement.outcome === 'retry' || settlement.outcome === 'dead' ? settlement.reason : '',
      String(DEAD_LETTERS_KEPT),
    );
    return reply === 1;
  }

  /** Events of `principal` not settled yet (the creation-time cap). */
  async pendingFor(principal: string): Promise<number> {
    return Number((await this.redis.hget(this.keys.pending, principal)) ?? 0);
  }

  /** Fleet-wide: events waiting (due or in a try) and dead letters held. */
  async counts(): Promise<{ pending: number; dead: number }> {
    const [pending, dead] = await Promise.all([this.redis.zcard(this.keys.due), this.redis.llen(this.keys.dead)]);
    return { pending, dead };
  }

  /** The newest `limit` dead letters. */
  async deadLetters(limit = 50): Promise<DeadLetter[]> {
    const raws = await this.redis.lrange(this.keys.dead, 0, Math.max(0, limit - 1));
    return raws.flatMap((raw) => {
      try {
        const parsed = DeadLetterSchema.safeParse(JSON.parse(raw));
        return parsed.success ? [parsed.data] : [];
      } catch {
        return [];
      }
    });
  }
}

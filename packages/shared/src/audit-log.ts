/**
 * What operators did (PROTOCOL.md §30.5): every action of the admin API (replay, cancel, pause, resume, resend) and
 * every dashboard login and logout is one entry, newest first, at most `AUDIT_KEPT`, in Redis so that every gateway's
 * dashboard shows the same list; each is also a log line of the gateway that carried it out.
 */
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';

/** Entries kept; older ones are dropped. */
export const AUDIT_KEPT = 200;

export interface AuditEntry {
  /** ISO time. */
  at: string;
  /** The operator's principal. */
  by: string;
  action:
    | 'replay'
    | 'replay-many'
    | 'cancel'
    | 'pause'
    | 'resume'
    | 'resend'
    | 'schedule-set'
    | 'schedule-pause'
    | 'schedule-resume'
    | 'schedule-remove'
    | 'login'
    | 'logout';
  /** What it acted on: a task id, a tool name, a webhook event id, or a filter. */
  target: string;
  /** What came of it, in a few words. */
  outcome: string;
}

export class AuditLog {
  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Pick<Keys, 'audit'>,
  ) {}

  async record(entry: Omit<AuditEntry, 'at'>, now = new Date()): Promise<void> {
    await this.redis
      .multi()
      .lpush(this.keys.audit, JSON.stringify({ at: now.toISOString(), ...entry }))
      .ltrim(this.keys.audit, 0, AUDIT_KEPT - 1)
      .exec();
  }

  async newest(limit = 50): Promise<AuditEntry[]> {
    const raws = await this.redis.lrange(this.keys.audit, 0, Math.max(0, Math.min(limit, AUDIT_KEPT) - 1));
    return raws.flatMap((raw) => {
      try {
        return [JSON.parse(raw) as AuditEntry];
      } catch {
        return [];
      }
    });
  }
}

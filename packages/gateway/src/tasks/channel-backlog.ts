/**
 * This gateway's side of its channel backlog (PROTOCOL.md §22.4): sets the budget below Redis's pub/sub output limit,
 * takes off what it reads (in one write per ACK_EVERY_MS, not one per message), starts the count again when its
 * subscriber is new, and keeps the hash alive while it runs.
 *
 * In the sharded layout (§1.2) the scripts charge the hash of the task's shard, so there is one per shard the gateway
 * subscribes to. Redis's limit is per connection, and the gateway has one subscriber connection per master: each
 * shard's `max` is the budget ÷ the number of this gateway's shards on that master (at least MIN_SHARD_BACKLOG_BYTES),
 * so what a master buffers for the gateway stays within the budget.
 */
import {
  ChannelBacklogStore,
  MIN_SHARD_BACKLOG_BYTES,
  backlogBudget,
  backlogCost,
  clusterMasters,
  masterOfSlot,
  slotOfCode,
  type Keys,
  type Logger,
  type RedisClient,
} from '@taskrelay/shared';

/** How often what was read is taken off the count, at most. */
const ACK_EVERY_MS = 20;
/** The hash outlives the gateway's last write by this much: a gateway that is gone bounds nothing after it. */
const TTL_MS = 60_000;
const HEARTBEAT_MS = 10_000;

/** The single layout's one hash (the prefix's own). */
const SINGLE = '';

interface ShardCount {
  /** Read since the last ack. */
  read: number;
  max: number;
}

export class ChannelBacklog {
  /** The budget of one subscriber connection. */
  private budget = 0;
  /** One count per hash: `SINGLE` in the single layout, else one per subscribed shard code. */
  private readonly counts = new Map<string, ShardCount>();
  private ackTimer: NodeJS.Timeout | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private readonly store: ChannelBacklogStore;
  private readonly sharded: boolean;

  constructor(
    private readonly redis: RedisClient,
    keys: Keys,
    private readonly gatewayId: string,
    private readonly log: Logger,
    /** The shard code of a channel this gateway reads tool messages on (sharded layout); undefined: none. */
    private readonly shardOfChannel?: (channel: string) => string | undefined,
  ) {
    this.store = new ChannelBacklogStore(redis, keys);
    this.sharded = keys.layout === 'sharded';
  }

  /** Reads Redis's limit (CONFIG may be refused: the default budget then) and starts the count at 0. */
  async start(): Promise<void> {
    this.budget = await this.readBudget();
    if (!this.sharded) {
      this.counts.set(SINGLE, { read: 0, max: this.budget });
      await this.ack(SINGLE, 0, true);
    }
    this.log.debug({ maxBytes: this.budget }, 'channel backlog budget set');
    this.heartbeat = setInterval(() => void this.refresh(), HEARTBEAT_MS);
    this.heartbeat.unref();
  }

  /**
   * The gateway subscribed to these shards' channels (sharded layout): each gets a hash, counted from 0, and every
   * shard's share of its master's budget is set again (the next ack writes it).
   */
  async addShards(codes: readonly string[]): Promise<void> {
    if (this.budget === 0) return;
    const fresh = codes.filter((code) => !this.counts.has(code));
    for (const code of fresh) this.counts.set(code, { read: 0, max: this.budget });
    await this.share();
    // The new shards start at 0; the others get their smaller share now, not at the next heartbeat.
    await Promise.all([...this.counts.keys()].map((code) => this.ack(code, 0, fresh.includes(code))));
  }

  /** Each shard's `max`: the budget ÷ this gateway's shards on the same master (one server: all of them). */
  private async share(): Promise<void> {
    if (!this.sharded) return;
    let masters;
    try {
      masters = await clusterMasters(this.redis);
    } catch (error) {
      this.log.debug({ err: error }, 'CLUSTER SLOTS not read; the backlog shares stay as they are');
      return;
    }
    const masterOf = (code: string) => (masters ? masterOfSlot(masters, slotOfCode(code)) : undefined) ?? '';
    const perMaster = new Map<string, number>();
    for (const code of this.counts.keys()) perMaster.set(masterOf(code), (perMaster.get(masterOf(code)) ?? 0) + 1);
    for (const [code, count] of this.counts) {
      count.max = Math.max(MIN_SHARD_BACKLOG_BYTES, Math.floor(this.budget / (perMaster.get(masterOf(code)) ?? 1)));
    }
  }

  /** The budget below Redis's pub/sub output limit as Redis has it now (an operator may lower it at run time). */
  private async readBudget(): Promise<number> {
    let config: string | undefined;
    try {
      const reply = await this.redis.call('CONFIG', 'GET', 'client-output-buffer-limit');
      config = Array.isArray(reply) ? String(reply[1] ?? '') : undefined;
    } catch (error) {
      this.log.debug({ err: error }, 'CONFIG GET client-output-buffer-limit refused; the default backlog budget holds');
    }
    return backlogBudget(config);
  }

  /** Each heartbeat: the limit read again (a `CONFIG SET` since start is followed), then the hashes kept alive. */
  private async refresh(): Promise<void> {
    if (this.budget === 0) return;
    const budget = await this.readBudget();
    if (this.budget !== 0 && budget !== this.budget) {
      this.log.info({ maxBytes: budget, was: this.budget }, 'channel backlog budget follows a changed pub/sub limit');
      this.budget = budget;
      if (!this.sharded) for (const count of this.counts.values()) count.max = budget;
    }
    // A failover may have moved shards between masters: their shares follow.
    await this.share();
    this.flush();
  }

  /** A tool message (progress, log) was read from the channel. */
  counted(channel: string, raw: string): void {
    if (this.budget === 0) return;
    const count = this.counts.get(this.sharded ? (this.shardOfChannel?.(channel) ?? SINGLE) : SINGLE);
    if (count === undefined) return;
    count.read += backlogCost(channel, raw);
    this.ackTimer ??= setTimeout(() => {
      this.ackTimer = undefined;
      this.flush(true);
    }, ACK_EVERY_MS);
  }

  /** The subscriber is new: what was published to the one before is never read, so the counts start again. */
  resubscribed(): void {
    if (this.budget === 0) return;
    for (const [code, count] of this.counts) {
      count.read = 0;
      this.ack(code, 0, true).catch((error: unknown) =>
        this.log.warn({ err: error }, 'could not reset the channel backlog'),
      );
    }
  }

  close(): void {
    clearTimeout(this.ackTimer);
    clearInterval(this.heartbeat);
    this.budget = 0;
  }

  /** Acks what was read; `readOnly`: only the hashes something was read from (the heartbeat acks them all). */
  private flush(readOnly = false): void {
    if (this.budget === 0) return;
    for (const [code, count] of this.counts) {
      const read = count.read;
      if (readOnly && read === 0) continue;
      count.read = 0;
      this.ack(code, read).catch((error: unknown) => {
        // Counted again next time: until then the workers see less room, never more.
        count.read += read;
        this.log.warn({ err: error }, 'could not take read messages off the channel backlog');
      });
    }
  }

  private ack(code: string, read: number, reset = false): Promise<number> {
    const max = this.counts.get(code)?.max ?? this.budget;
    return this.store.ack(this.gatewayId, read, {
      max,
      ttlMs: TTL_MS,
      ...(reset ? { reset: true } : {}),
      ...(code === SINGLE ? {} : { shard: code }),
    });
  }
}

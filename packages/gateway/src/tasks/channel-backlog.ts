/**
 * This gateway's side of its channel backlog (PROTOCOL.md §22.4): sets the budget below Redis's pub/sub output limit,
 * takes off what it reads (in one write per ACK_EVERY_MS, not one per message), starts the count again when its
 * subscriber is new, and keeps the hash alive while it runs.
 */
import {
  ChannelBacklogStore,
  backlogBudget,
  backlogCost,
  type Keys,
  type Logger,
  type RedisClient,
} from '@taskrelay/shared';

/** How often what was read is taken off the count, at most. */
const ACK_EVERY_MS = 20;
/** The hash outlives the gateway's last write by this much: a gateway that is gone bounds nothing after it. */
const TTL_MS = 60_000;
const HEARTBEAT_MS = 10_000;

export class ChannelBacklog {
  private read = 0;
  private max = 0;
  private ackTimer: NodeJS.Timeout | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private readonly store: ChannelBacklogStore;

  constructor(
    private readonly redis: RedisClient,
    keys: Keys,
    private readonly gatewayId: string,
    private readonly log: Logger,
  ) {
    this.store = new ChannelBacklogStore(redis, keys);
  }

  /** Reads Redis's limit (CONFIG may be refused: the default budget then) and starts the count at 0. */
  async start(): Promise<void> {
    this.max = await this.readBudget();
    await this.store.ack(this.gatewayId, 0, { max: this.max, ttlMs: TTL_MS, reset: true });
    this.log.debug({ maxBytes: this.max }, 'channel backlog budget set');
    this.heartbeat = setInterval(() => void this.refresh(), HEARTBEAT_MS);
    this.heartbeat.unref();
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

  /** Each heartbeat: the limit read again (a `CONFIG SET` since start is followed), then the hash kept alive. */
  private async refresh(): Promise<void> {
    if (this.max === 0) return;
    const max = await this.readBudget();
    if (this.max !== 0 && max !== this.max) {
      this.log.info({ maxBytes: max, was: this.max }, 'channel backlog budget follows a changed pub/sub limit');
      this.max = max;
    }
    this.flush();
  }

  /** A tool message (progress, log) was read from the channel. */
  counted(channel: string, raw: string): void {
    if (this.max === 0) return;
    this.read += backlogCost(channel, raw);
    this.ackTimer ??= setTimeout(() => {
      this.ackTimer = undefined;
      this.flush();
    }, ACK_EVERY_MS);
  }

  /** The subscriber is new: what was published to the one before is never read, so the count starts again. */
  resubscribed(): void {
    if (this.max === 0) return;
    this.read = 0;
    this.store
      .ack(this.gatewayId, 0, { max: this.max, ttlMs: TTL_MS, reset: true })
      .catch((error: unknown) => this.log.warn({ err: error }, 'could not reset the channel backlog'));
  }

  close(): void {
    clearTimeout(this.ackTimer);
    clearInterval(this.heartbeat);
    this.max = 0;
  }

  private flush(): void {
    if (this.max === 0) return;
    const read = this.read;
    this.read = 0;
    this.store.ack(this.gatewayId, read, { max: this.max, ttlMs: TTL_MS }).catch((error: unknown) => {
      // Counted again next time: until then the workers see less room, never more.
      this.read += read;
      this.log.warn({ err: error }, 'could not take read messages off the channel backlog');
    });
  }
}

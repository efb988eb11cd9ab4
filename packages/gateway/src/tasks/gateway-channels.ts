/**
 * The channels a gateway listens on in the sharded layout (PROTOCOL.md §1.2): the scripts of a task publish its
 * gateway events and its resource wake-ups with `SPUBLISH` on channels of the task's shard, so the gateway
 * `SSUBSCRIBE`s its events channel and the resources channel of every placed shard, and its home events channel (the
 * acks other gateways send it). A shard placed later is subscribed as this gateway's placement cache learns of it
 * (before a call of it is created here), when a task id names it (before this gateway waits on the task), and by a
 * periodic look at the registry. The subscriber is an ioredis `Cluster` with `shardedSubscribers`: one subscriber
 * connection per master, whatever the number of shards, moved with its slots through a failover.
 */
import { type Keys, type Logger, type RedisClient, type ShardPlacement, subscribeTo } from '@taskrelay/shared';

/** How often the registry is read for shards placed by other processes. */
const REFRESH_MS = 5_000;

export class GatewayChannels {
  /** Events channel → the shard code it is of ('' for the home channel). */
  private readonly events = new Map<string, string>();
  private readonly resources = new Set<string>();
  private readonly shards = new Set<string>();
  private readonly shardListeners: Array<(codes: readonly string[]) => void> = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly subscriber: RedisClient,
    private readonly keys: Keys,
    private readonly gatewayId: string,
    private readonly placement: ShardPlacement,
    private readonly log: Logger,
  ) {}

  /** Subscribes the home events channel and every placed shard's channels; then follows new shards. */
  async start(): Promise<void> {
    const home = this.keys.gatewayChannel(this.gatewayId);
    await subscribeTo(this.subscriber, this.keys, [home]);
    this.events.set(home, '');
    this.placement.onLearned((codes) => this.addShards(codes));
    await this.placement.all();
    this.timer = setInterval(() => {
      this.placement.all().catch((error: unknown) => this.log.debug({ err: error }, 'placement registry not read'));
    }, REFRESH_MS);
    this.timer.unref();
  }

  close(): void {
    clearInterval(this.timer);
  }

  /** Told of the shards subscribed from now on (and of those already), e.g. to keep a backlog budget per shard. */
  onShards(listener: (codes: readonly string[]) => void): void {
    this.shardListeners.push(listener);
    if (this.shards.size > 0) listener([...this.shards]);
  }

  /** The shards subscribed so far. */
  subscribedShards(): string[] {
    return [...this.shards];
  }

  isEvents(channel: string): boolean {
    return this.events.has(channel);
  }

  /** The shard code of one of this gateway's events channels ('' for home), or undefined. */
  shardOfEvents(channel: string): string | undefined {
    return this.events.get(channel);
  }

  isResources(channel: string): boolean {
    return this.resources.has(channel);
  }

  /**
   * Subscribes the shard `taskId` names when it is placed and not subscribed yet (a task created by another gateway
   * on a shard this one has not seen). A code the registry does not hold names no task: nothing is subscribed for it.
   */
  async ensureTask(taskId: string): Promise<void> {
    const code = this.keys.shardOf(taskId);
    if (code === undefined || this.shards.has(code)) return;
    await this.placement.all();
  }

  private async addShards(codes: readonly string[]): Promise<void> {
    const fresh = codes.filter((code) => !this.shards.has(code));
    if (fresh.length === 0) return;
    const channels: string[] = [];
    for (const code of fresh) {
      const shard = this.keys.forShard(code);
      channels.push(shard.gatewayChannel(this.gatewayId), shard.resourcesChannel);
    }
    // Listened for before the subscribe answers, so nothing published just after it is dropped as unknown.
    for (const code of fresh) {
      const shard = this.keys.forShard(code);
      this.events.set(shard.gatewayChannel(this.gatewayId), code);
      this.resources.add(shard.resourcesChannel);
    }
    await subscribeTo(this.subscriber, this.keys, channels);
    for (const code of fresh) this.shards.add(code);
    this.log.debug({ shards: fresh }, 'gateway channels subscribed on new shards');
    for (const listener of this.shardListeners) listener(fresh);
  }
}

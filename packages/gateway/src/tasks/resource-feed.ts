/**
 * Wake-ups of task resources (PROTOCOL.md §34.5): each `outputWrite` (and each artifact stored) publishes its task id
 * on `P:resources`; every gateway subscribes on its subscriber connection and wakes the subscriptions it holds for
 * that task. Pub/sub is only the wake-up: a subscriber re-reads the resource itself. In the sharded layout the channel
 * is the task's shard's (`P:{<code>}:resources`, §1.2), which `GatewayChannels` subscribes on every placed shard.
 */
import { z } from 'zod';
import { messageEvent, type Keys, type Logger, type RedisClient } from '@taskrelay/shared';
import type { GatewayChannels } from './gateway-channels.js';

const WakeSchema = z.object({ taskId: z.string() });

export class ResourceFeed {
  private readonly watchers = new Map<string, Set<() => void>>();
  private readonly onMessage = (channel: string, raw: string): void => {
    const mine = this.channels ? this.channels.isResources(channel) : channel === this.keys.resourcesChannel;
    if (!mine) return;
    let parsed;
    try {
      parsed = WakeSchema.safeParse(JSON.parse(raw));
    } catch {
      parsed = undefined;
    }
    if (!parsed?.success) {
      this.log.debug({ raw: raw.slice(0, 200) }, 'malformed resource wake-up dropped');
      return;
    }
    for (const wake of this.watchers.get(parsed.data.taskId) ?? []) wake();
  };

  constructor(
    private readonly subscriber: RedisClient,
    private readonly keys: Keys,
    private readonly log: Logger,
    /** The sharded layout's channels, subscribed by them; none: the single layout's one channel, subscribed here. */
    private readonly channels?: Pick<GatewayChannels, 'isResources' | 'ensureTask'>,
  ) {}

  async start(): Promise<void> {
    this.subscriber.on(messageEvent(this.keys), this.onMessage);
    if (this.channels === undefined) await this.subscriber.subscribe(this.keys.resourcesChannel);
  }

  close(): void {
    this.subscriber.off(messageEvent(this.keys), this.onMessage);
  }

  /**
   * Subscribes the resources channel of the task's shard when this gateway has not seen that shard yet (the sharded
   * layout, §1.2; the registry is read every few seconds anyway): call before `watch`.
   */
  async follow(taskId: string): Promise<void> {
    await this.channels?.ensureTask(taskId);
  }

  /** Calls `wake` on each change of the task's resources; returns the stop. */
  watch(taskId: string, wake: () => void): () => void {
    let set = this.watchers.get(taskId);
    if (!set) this.watchers.set(taskId, (set = new Set()));
    set.add(wake);
    return () => {
      set.delete(wake);
      if (set.size === 0 && this.watchers.get(taskId) === set) this.watchers.delete(taskId);
    };
  }
}

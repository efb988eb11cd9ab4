/**
 * Which pub/sub a key layout uses (PROTOCOL.md §1.2): the single layout keeps classic `PUBLISH`/`SUBSCRIBE`; the
 * sharded layout publishes with `SPUBLISH` on channels that hash with the shard they concern and subscribes with
 * `SSUBSCRIBE`, so on a cluster a message goes to that shard's master (and its replicas) only, not over the cluster
 * bus to every node. Redis 7 serves both on a single server too.
 */
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';

/** True when `keys` publish with `SPUBLISH` (the sharded layout). */
export function shardedPubSub(keys: Keys): boolean {
  return keys.layout === 'sharded';
}

/**
 * The publish command the layout's scripts take (their `publish` argument, PROTOCOL.md §1.2): `SPUBLISH` on the
 * sharded layout's channels, which hash with the task's shard; the classic `PUBLISH` in the single layout.
 */
export function publishCommand(keys: Keys): 'PUBLISH' | 'SPUBLISH' {
  return shardedPubSub(keys) ? 'SPUBLISH' : 'PUBLISH';
}

/** Publishes `message` on `channel` the way the layout does. */
export async function publishOn(redis: RedisClient, keys: Keys, channel: string, message: string): Promise<void> {
  await (shardedPubSub(keys) ? redis.spublish(channel, message) : redis.publish(channel, message));
}

/** The subscriber event that carries the layout's messages: `smessage` for `SSUBSCRIBE`, else `message`. */
export function messageEvent(keys: Keys): 'message' | 'smessage' {
  return shardedPubSub(keys) ? 'smessage' : 'message';
}

/**
 * Subscribes to `channels` the way the layout does. Sharded channels are subscribed one by one: on a cluster each may
 * hash to another master (one `SSUBSCRIBE` must stay within one slot).
 */
export async function subscribeTo(subscriber: RedisClient, keys: Keys, channels: readonly string[]): Promise<void> {
  if (!shardedPubSub(keys)) {
    if (channels.length > 0) await subscriber.subscribe(...channels);
    return;
  }
  for (const channel of new Set(channels)) await subscriber.ssubscribe(channel);
}

/**
 * The bound on what waits for one gateway on its pub/sub channel (PROTOCOL.md §22.4). Redis cuts a subscriber whose
 * unsent output passes its `client-output-buffer-limit` (pubsub: 32 MB hard, 8 MB for 60 s soft, by default), and
 * every task the gateway routes loses its live messages while it reconnects. So each gateway keeps a budget below
 * that limit in a hash of its own; the progress and log scripts publish a tool message only while what its gateway
 * has not read yet, plus the message, fits (`channelBacklog` include), and the gateway takes off what it reads.
 */
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';
import { SCRIPTS, ScriptRunner } from './protocol/scripts.js';

/** The budget when Redis's limit cannot be read (or allows more): 4 MiB, half the default soft limit. */
export const DEFAULT_BACKLOG_BYTES = 4 * 1024 * 1024;
/** The least budget: room for the largest log message (64 KiB) and then some. */
export const MIN_BACKLOG_BYTES = 128 * 1024;
/** What one message costs besides its payload and channel name (RESP framing), as the include counts it. */
export const BACKLOG_MESSAGE_OVERHEAD = 64;
/**
 * The least budget of one shard's channel in the sharded layout (PROTOCOL.md §1.2): the largest log message (64 KiB
 * of data) with its framing, so a shard's share never refuses every large message.
 */
export const MIN_SHARD_BACKLOG_BYTES = 80 * 1024;

/** What one published message costs the budget: the same sum the include makes. */
export function backlogCost(channel: string, payload: string): number {
  return Buffer.byteLength(payload) + Buffer.byteLength(channel) + BACKLOG_MESSAGE_OVERHEAD;
}

/**
 * The budget for a Redis whose `client-output-buffer-limit` is `config` (the CONFIG GET value): half the smaller
 * non-zero pubsub limit, at most DEFAULT_BACKLOG_BYTES and at least MIN_BACKLOG_BYTES.
 */
export function backlogBudget(config: string | undefined): number {
  const match = /pubsub\s+(\d+)\s+(\d+)\s+\d+/i.exec(config ?? '');
  if (!match) return DEFAULT_BACKLOG_BYTES;
  const limits = [Number(match[1]), Number(match[2])].filter((n) => n > 0);
  if (limits.length === 0) return DEFAULT_BACKLOG_BYTES;
  return Math.max(MIN_BACKLOG_BYTES, Math.min(DEFAULT_BACKLOG_BYTES, Math.floor(Math.min(...limits) / 2)));
}

export class ChannelBacklogStore {
  private readonly scripts: ScriptRunner;

  constructor(
    redis: RedisClient,
    private readonly keys: Keys,
  ) {
    this.scripts = new ScriptRunner(redis);
  }

  /**
   * Takes `read` bytes off the gateway's count (or starts it at 0), sets its budget, keeps the hash for `ttlMs`. In the
   * sharded layout `shard` names the shard whose hash it is (one per shard the gateway subscribes to, §1.2).
   */
  async ack(
    gatewayId: string,
    read: number,
    o: { max: number; ttlMs: number; reset?: boolean; shard?: string },
  ): Promise<number> {
    const keys = o.shard === undefined ? this.keys : this.keys.forShard(o.shard);
    const reply = await this.scripts.call(SCRIPTS.backlogAck, {
      keys: { backlog: keys.gatewayBacklog(gatewayId) },
      args: { read, max: o.max, ttlMs: o.ttlMs, reset: o.reset ? '1' : '0' },
    });
    return Number(reply.values[0] ?? 0);
  }
}

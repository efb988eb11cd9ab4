/**
 * What an operator or a tool's definition set on a tool's queue (PROTOCOL.md §3.3): paused, a fleet-wide concurrency,
 * a rate limit; with the runs active now. Read in one round trip for many queues, from BullMQ's own meta hash (written
 * only through BullMQ's `Queue` methods), for the gateway's catalog, its admin pages and its metrics.
 */
import {
  BULLMQ_ACTIVE_SUFFIX,
  BULLMQ_META_FIELDS,
  BULLMQ_META_SUFFIX,
  bullQueueKey,
} from './protocol/bullmq-layout.js';
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';

export interface ToolControls {
  paused: boolean;
  concurrency?: number;
  rateLimit?: { max: number; perMs: number };
  /** Runs of the queue active now (BullMQ's active list). */
  active: number;
}

const positive = (raw: string | null | undefined): number | undefined => {
  const n = raw == null ? NaN : Number(raw);
  return Number.isInteger(n) && n > 0 ? n : undefined;
};

/**
 * The controls of each queue (by our queue name), in the order given. In the sharded layout (PROTOCOL.md §1.1) pass
 * `shards`: each queue's placed shard codes. A queue with codes is read on every shard (one pipeline per shard, as a
 * cluster pipeline stays on one node) and summed: paused when every shard is, the concurrency and rate the shards
 * allow together (each gets ⌈limit / N⌉, docs/SCALING.md §4), the runs active on all of them. A queue with none is read
 * under the home prefix, as in the single layout.
 */
export async function readToolControls(
  redis: RedisClient,
  keys: Keys,
  queues: readonly string[],
  shards?: ReadonlyMap<string, readonly string[]>,
): Promise<ToolControls[]> {
  if (queues.length === 0) return [];
  // One read per (queue, shard): under the shard's keys, or the home keys.
  const reads = queues.flatMap((queue, i) => {
    const codes = shards?.get(queue) ?? [];
    return codes.length > 0
      ? codes.map((code) => ({ i, queue, at: keys.forShard(code), code }))
      : [{ i, queue, at: keys, code: '' }];
  });
  const byShard = new Map<string, typeof reads>();
  for (const read of reads) byShard.set(read.code, [...(byShard.get(read.code) ?? []), read]);
  const replies = new Map<(typeof reads)[number], ToolControls>();
  await Promise.all(
    [...byShard.values()].map(async (group) => {
      const pipeline = redis.pipeline();
      for (const { queue, at } of group) {
        const queueKey = bullQueueKey(at.bullPrefix, at.queueName(queue));
        pipeline.hmget(`${queueKey}${BULLMQ_META_SUFFIX}`, ...BULLMQ_META_FIELDS);
        pipeline.llen(`${queueKey}${BULLMQ_ACTIVE_SUFFIX}`);
      }
      const got = (await pipeline.exec()) ?? [];
      group.forEach((read, n) => replies.set(read, controlsOf(got[n * 2], got[n * 2 + 1])));
    }),
  );
  return queues.map((_queue, i) => sum(reads.filter((r) => r.i === i).map((r) => replies.get(r)!)));
}

type Reply = [Error | null, unknown] | undefined;

function controlsOf(
  [metaError, meta]: NonNullable<Reply> | [] = [],
  [activeError, active]: NonNullable<Reply> | [] = [],
): ToolControls {
  const [paused, concurrency, max, duration] = (metaError ? [] : (meta as Array<string | null>)) ?? [];
  const controls: ToolControls = { paused: paused != null, active: activeError ? 0 : Number(active ?? 0) };
  const limit = positive(concurrency);
  if (limit !== undefined) controls.concurrency = limit;
  const maxStarts = positive(max);
  const perMs = positive(duration);
  if (maxStarts !== undefined && perMs !== undefined) controls.rateLimit = { max: maxStarts, perMs };
  return controls;
}

/** A queue's shards as one: paused when all are, a limit when all have one (summed), active runs summed. */
function sum(parts: ToolControls[]): ToolControls {
  if (parts.length === 1) return parts[0]!;
  const out: ToolControls = {
    paused: parts.length > 0 && parts.every((p) => p.paused),
    active: parts.reduce((n, p) => n + p.active, 0),
  };
  if (parts.every((p) => p.concurrency !== undefined)) {
    out.concurrency = parts.reduce((n, p) => n + (p.concurrency ?? 0), 0);
  }
  const perMs = parts[0]?.rateLimit?.perMs;
  if (perMs !== undefined && parts.every((p) => p.rateLimit?.perMs === perMs)) {
    out.rateLimit = { max: parts.reduce((n, p) => n + (p.rateLimit?.max ?? 0), 0), perMs };
  }
  return out;
}

/**
 * Why a queued, unstarted task of a tool waits, from its queue's controls; undefined when nothing holds it back. What
 * `tasks/get` shows as its `statusMessage` (PROTOCOL.md §3.3).
 */
export function controlsWaitReason(tool: string, controls: ToolControls | undefined): string | undefined {
  if (!controls) return undefined;
  if (controls.paused) return `Waiting: tool ${tool} is paused by an operator; the task runs once it is resumed`;
  if (controls.concurrency !== undefined && controls.active >= controls.concurrency) {
    return `Waiting for a slot: tool ${tool} runs at most ${controls.concurrency} at once (${controls.active} running)`;
  }
  return undefined;
}

/** `_meta` key of a listed tool's controls in `tools/list` (docs/MCP.md): `{ paused, concurrency?, rateLimit? }`. */
export const TOOL_CONTROLS_META = 'dev.taskrelay/controls';
/** `_meta` key of a tool's version in `tools/list` (PROTOCOL.md §12.11). */
export const TOOL_VERSION_META = 'dev.taskrelay/version';

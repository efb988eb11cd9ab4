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

/** The controls of each queue (by our queue name), in the order given. */
export async function readToolControls(
  redis: RedisClient,
  keys: Keys,
  queues: readonly string[],
): Promise<ToolControls[]> {
  if (queues.length === 0) return [];
  const pipeline = redis.pipeline();
  for (const queue of queues) {
    const queueKey = bullQueueKey(keys.bullPrefix, keys.queueName(queue));
    pipeline.hmget(`${queueKey}${BULLMQ_META_SUFFIX}`, ...BULLMQ_META_FIELDS);
    pipeline.llen(`${queueKey}${BULLMQ_ACTIVE_SUFFIX}`);
  }
  const replies = (await pipeline.exec()) ?? [];
  return queues.map((_queue, i) => {
    const [metaError, meta] = replies[i * 2] ?? [];
    const [activeError, active] = replies[i * 2 + 1] ?? [];
    const [paused, concurrency, max, duration] = (metaError ? [] : (meta as Array<string | null>)) ?? [];
    const controls: ToolControls = { paused: paused != null, active: activeError ? 0 : Number(active ?? 0) };
    const limit = positive(concurrency);
    if (limit !== undefined) controls.concurrency = limit;
    const maxStarts = positive(max);
    const perMs = positive(duration);
    if (maxStarts !== undefined && perMs !== undefined) controls.rateLimit = { max: maxStarts, perMs };
    return controls;
  });
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

/**
 * Where each tool shard lives in the sharded key layout (PROTOCOL.md §1.1): the placement registry on the home tag maps
 * `<queue>~<tool>#<i>` to a 4-hex shard code, written once with HSETNX and never changed, so every process caches
 * what it read. A new shard gets a code that hashes into the slots of the master holding the fewest placed shards, so
 * a handful of tools spreads over the masters (hash tags alone put three tools on three masters one time in five).
 */
import { randomBytes, randomInt } from 'node:crypto';
import calculateSlot from 'cluster-key-slot';
import { Cluster, type ChainableCommander } from 'ioredis';
import { isShardCode, placementField, type Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';

/** How long one process may hold the placement lease; placing takes a few round trips. */
const LEASE_MS = 2_000;
/** How long a process waits between looks while another one holds the lease. */
const LEASE_RETRY_MS = 25;
/** Most tries to draw a code in a master's slots (each hits with probability ~1/masters). */
const MAX_DRAWS = 10_000;

/** Slot ranges of each master, by master id: from `CLUSTER SLOTS`. */
export type MasterSlots = Map<string, Array<[number, number]>>;

/** The master a slot belongs to, or undefined. */
export function masterOfSlot(masters: MasterSlots, slot: number): string | undefined {
  for (const [id, ranges] of masters) if (ranges.some(([from, to]) => slot >= from && slot <= to)) return id;
  return undefined;
}

/** The slot of a shard code's keys: Redis hashes only what is between the braces. */
export function slotOfCode(code: string): number {
  return calculateSlot(code);
}

/**
 * A new code for a shard, given the codes already placed: in the slots of the master holding the fewest of them (ties:
 * the first master in `masters`' order), avoiding codes in use. Without masters (one server) any unused code.
 */
export function chooseCode(
  placed: readonly string[],
  masters: MasterSlots | undefined,
  draw: () => string = randomCode,
): string {
  const used = new Set(placed);
  let target: string | undefined;
  if (masters !== undefined && masters.size > 0) {
    const counts = new Map([...masters.keys()].map((id) => [id, 0]));
    for (const code of placed) {
      const master = masterOfSlot(masters, slotOfCode(code));
      if (master !== undefined) counts.set(master, (counts.get(master) ?? 0) + 1);
    }
    let fewest = Infinity;
    for (const [id, count] of counts) {
      if (count < fewest) {
        fewest = count;
        target = id;
      }
    }
  }
  for (let i = 0; i < MAX_DRAWS; i++) {
    const code = draw();
    if (used.has(code)) continue;
    if (target === undefined || masters === undefined || masterOfSlot(masters, slotOfCode(code)) === target)
      return code;
  }
  throw new Error('no shard code found for the chosen master');
}

function randomCode(): string {
  return randomInt(0, 0x10000).toString(16).padStart(4, '0');
}

/** The masters' slot ranges of a cluster (`CLUSTER SLOTS`), or undefined for one server. */
export async function clusterMasters(redis: RedisClient): Promise<MasterSlots | undefined> {
  if (!(redis instanceof Cluster)) return undefined;
  const reply = (await redis.cluster('SLOTS')) as unknown as Array<[number, number, [string, number, string?]]>;
  const masters: MasterSlots = new Map();
  for (const [from, to, master] of reply) {
    const id = master[2] ?? `${master[0]}:${master[1]}`;
    const ranges = masters.get(id) ?? [];
    ranges.push([from, to]);
    masters.set(id, ranges);
  }
  for (const ranges of masters.values()) ranges.sort((a, b) => a[0] - b[0]);
  return new Map([...masters].sort((a, b) => (a[1][0]?.[0] ?? 0) - (b[1][0]?.[0] ?? 0)));
}

/**
 * The placement registry as one process sees it: codes read or written are cached for good (they never change).
 * Only used in the sharded layout.
 */
export class ShardPlacement {
  private readonly known = new Map<string, string>();
  private readonly placing = new Map<string, Promise<string[]>>();
  /** Codes handed to the listener already (each once). */
  private readonly told = new Set<string>();
  private listener: ((codes: readonly string[]) => Promise<void>) | undefined;

  constructor(
    private readonly redis: RedisClient,
    private readonly keys: Keys,
  ) {}

  /**
   * Told of each code this process learns (placed here, or read from the registry), once, before `codes` or `all`
   * answer with it: a gateway subscribes its channel on a shard before any task of that shard is routed to it
   * (PROTOCOL.md §1.2).
   */
  onLearned(listener: (codes: readonly string[]) => Promise<void>): void {
    this.listener = listener;
  }

  /** The codes of a tool queue's `shards` shards, placing those not placed yet. */
  async codes(queue: string, shards = 1): Promise<string[]> {
    const fields = Array.from({ length: shards }, (_, i) => placementField(queue, i));
    const cached = fields.map((f) => this.known.get(f));
    const told = this.listener === undefined || cached.every((c) => c !== undefined && this.told.has(c));
    if (cached.every((c) => c !== undefined) && told) return cached;
    const key = `${queue}#${shards}`;
    let pending = this.placing.get(key);
    if (pending === undefined) {
      pending = this.place(fields)
        .then(async (codes) => {
          await this.tell(codes);
          return codes;
        })
        .finally(() => this.placing.delete(key));
      this.placing.set(key, pending);
    }
    return pending;
  }

  /** Every shard code placed so far (what a reader of every shard reads): the registry's, cached as it goes. */
  async all(): Promise<string[]> {
    const registry = await this.redis.hgetall(this.keys.placement);
    for (const [field, code] of Object.entries(registry)) if (isShardCode(code)) this.known.set(field, code);
    const codes = [...new Set(this.known.values())].sort();
    await this.tell(codes);
    return codes;
  }

  private async tell(codes: readonly string[]): Promise<void> {
    if (this.listener === undefined) return;
    const fresh = [...new Set(codes)].filter((code) => !this.told.has(code));
    if (fresh.length === 0) return;
    // Marked once the listener is done: a failed listener is asked again next time.
    await this.listener(fresh);
    for (const code of fresh) this.told.add(code);
  }

  /**
   * A new shard starts with the deployment's retention policy (PROTOCOL.md §30.1), copied from home: the scripts that
   * end its tasks read the shard's own copy, and the gateways write every placed shard's as they start.
   */
  private async seed(code: string): Promise<void> {
    const policy = await this.redis.hgetall(this.keys.retention);
    if (Object.keys(policy).length > 0) await this.redis.hset(this.keys.forShard(code).retention, policy);
  }

  /** The codes of a tool queue's placed shards, in shard order (what the admin views show per shard). */
  async placed(queue: string): Promise<string[]> {
    return (await this.placedMany([queue])).get(queue) ?? [];
  }

  /** `placed` of several queues, from one read of the registry. */
  async placedMany(queues: readonly string[]): Promise<Map<string, string[]>> {
    await this.all();
    const out = new Map<string, string[]>();
    for (const queue of queues) {
      const mine: Array<[number, string]> = [];
      for (const [field, code] of this.known) {
        if (field.startsWith(`${queue}#`)) mine.push([Number(field.slice(queue.length + 1)), code]);
      }
      out.set(
        queue,
        mine.sort((a, b) => a[0] - b[0]).map(([, code]) => code),
      );
    }
    return out;
  }

  private async place(fields: string[]): Promise<string[]> {
    const read = await this.redis.hmget(this.keys.placement, ...fields);
    fields.forEach((f, i) => {
      const code = read[i];
      if (code) this.known.set(f, code);
    });
    if (fields.every((f) => this.known.has(f))) return fields.map((f) => this.known.get(f) ?? '');
    const token = randomBytes(8).toString('hex');
    while ((await this.redis.set(this.keys.placementLease, token, 'PX', LEASE_MS, 'NX')) !== 'OK') {
      await new Promise((resolve) => setTimeout(resolve, LEASE_RETRY_MS));
    }
    try {
      const masters = await clusterMasters(this.redis);
      for (const field of fields) {
        if (this.known.has(field)) continue;
        const registry = await this.redis.hgetall(this.keys.placement);
        const existing = registry[field];
        const code = existing ?? chooseCode(Object.values(registry), masters);
        if (existing === undefined && (await this.redis.hsetnx(this.keys.placement, field, code)) === 1) {
          await this.seed(code);
        }
        this.known.set(field, (await this.redis.hget(this.keys.placement, field)) ?? code);
      }
    } finally {
      // Released only if still ours (a lease that expired may be another process's now).
      if ((await this.redis.get(this.keys.placementLease)) === token) await this.redis.del(this.keys.placementLease);
    }
    return fields.map((f) => this.known.get(f) ?? '');
  }
}

/** One reply of a pipeline: an error or a value, as ioredis gives them. */
export type PipelineReply = [Error | null, unknown];

/**
 * Commands about many tasks in one round trip per shard, replies in the order they were added, as one pipeline would
 * give them: a pipeline on a Redis Cluster must stay on one node, and the sharded layout's tasks are on several
 * (PROTOCOL.md §1.1). In the single layout this is one pipeline, as before.
 */
export async function pipelineByShard(
  redis: RedisClient,
  keys: Keys,
  ids: readonly string[],
  add: (pipeline: ChainableCommander, id: string, index: number) => void,
): Promise<PipelineReply[]> {
  const groups = new Map<string, number[]>();
  ids.forEach((id, i) => {
    const code = keys.shardOf(id) ?? '';
    const group = groups.get(code);
    if (group) group.push(i);
    else groups.set(code, [i]);
  });
  const perId: PipelineReply[][] = ids.map(() => []);
  await Promise.all(
    [...groups.values()].map(async (indexes) => {
      const pipeline = redis.pipeline();
      const counts = indexes.map((i) => {
        const before = pipeline.length;
        add(pipeline, ids[i] ?? '', i);
        return pipeline.length - before;
      });
      const replies = ((await pipeline.exec()) ?? []) as PipelineReply[];
      let at = 0;
      indexes.forEach((i, n) => {
        const count = counts[n] ?? 0;
        perId[i] = replies.slice(at, at + count);
        at += count;
      });
    }),
  );
  return perId.flat();
}

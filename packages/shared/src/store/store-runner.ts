import type { Keys } from '../protocol/keys.js';
import { ShardPlacement } from '../placement.js';
import type { RedisClient } from '../redis.js';
import type { ScriptReply } from '../protocol/script-results.js';
import { ScriptRunner, scriptsGeneration, type ScriptInput, type ScriptSpec } from '../protocol/scripts.js';

/** How long a scripts generation stays known in `P:protocol` after its last announcement (§29.2). */
const GENERATION_KEPT_MS = 30 * 86_400_000;

/**
 * What every store aggregate (task records, runs, logs, waitpoints) runs over: one connection, its key layout, the
 * one `ScriptRunner` of that connection (the Lua scripts of `scripts.ts`, loaded once; ioredis' `defineCommand`
 * sends EVALSHA and falls back to EVAL on NOSCRIPT), and the routing of the sharded layout (PROTOCOL.md §1.1): a task's
 * keys are on the shard its id names (`forTask`), and a reader of every shard reads the placement registry's shards.
 */
export class StoreRunner {
  readonly scripts: ScriptRunner;
  /** The placement registry, in the sharded layout (PROTOCOL.md §1.1): what a reader of every shard reads. */
  readonly placement: ShardPlacement | undefined;

  constructor(
    readonly redis: RedisClient,
    readonly keys: Keys,
  ) {
    this.scripts = new ScriptRunner(redis);
    this.placement = keys.layout === 'sharded' ? new ShardPlacement(redis, keys) : undefined;
  }

  /** Runs script `s` (named keys and arguments), its reply decoded through the one result-code mapper. */
  call<S extends ScriptSpec>(s: S, input: ScriptInput<S>): Promise<ScriptReply> {
    return this.scripts.call(s, input);
  }

  /** The keys of the shard task `taskId` is on (this layout's one set in the single layout). */
  forTask(taskId: string): Keys {
    return this.keys.forTask(taskId);
  }

  /** The keys of every shard tasks may be on: this layout's one set, or every placed shard's (PROTOCOL.md §1.1). */
  async everyShard(): Promise<Keys[]> {
    if (this.placement === undefined) return [this.keys];
    return (await this.placement.all()).map((code) => this.keys.forShard(code));
  }

  /**
   * Records that a process running this build's scripts started (PROTOCOL.md §29.2): `P:protocol` maps each generation
   * to when it was last announced. Generations not announced for 30 days are dropped, so a worker of a long-gone
   * generation is refused again. Returns this build's generation.
   */
  async announceScriptsGeneration(now = Date.now()): Promise<string> {
    const generation = scriptsGeneration();
    const seen = await this.redis.hgetall(this.keys.protocol);
    const stale = Object.entries(seen)
      .filter(([other, at]) => other !== generation && now - Number(at) > GENERATION_KEPT_MS)
      .map(([other]) => other);
    const tx = this.redis.multi().hset(this.keys.protocol, generation, String(now));
    if (stale.length > 0) tx.hdel(this.keys.protocol, ...stale);
    await tx.exec();
    return generation;
  }
}

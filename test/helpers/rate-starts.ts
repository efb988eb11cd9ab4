/**
 * Starts of a rate-limited tool as the limit counted them (PROTOCOL.md §3.3), for the rate limit's end-to-end tests of
 * both workers. Each run's start is an entry of the limit's start log (`rateTake`: a sorted set of start id → Redis' ms,
 * the id `<job id>:<uuid>`), kept there at least `perMs`: `watchStartLog` reads it while the runs go, and so has every
 * start at the very time the limit counted it. What else there is to measure by lags the count: a run's take (the last
 * `active` entry of its job in its queue's BullMQ event stream) precedes its start by the worker's step from the one
 * to the other, which a loaded machine stretched to about a second (a CI run saw a take 8 ms after two others, each
 * start correctly a second apart); the handler's own start time follows it by as much.
 */
import type { Redis } from 'ioredis';
import { expect } from 'vitest';

/** When each job of `jobIds` was taken for the run that started it, in Redis' clock, by job id. */
export async function takesByJob(r: Redis, eventsKey: string, jobIds: string[]): Promise<Map<string, number>> {
  const stream = await r.xrange(eventsKey, '-', '+');
  const taken = new Map<string, number>();
  for (const [entryId, fields] of stream) {
    const field = (name: string) => fields[fields.indexOf(name) + 1];
    const jobId = field('jobId') ?? '';
    if (field('event') === 'active' && jobIds.includes(jobId)) taken.set(jobId, Number(entryId.split('-')[0]));
  }
  return taken;
}

/** When each job of `jobIds` was taken for the run that started it, in Redis' clock, sorted. */
export async function startedTakes(r: Redis, eventsKey: string, jobIds: string[]): Promise<number[]> {
  return [...(await takesByJob(r, eventsKey, jobIds)).values()].sort((a, b) => a - b);
}

export interface StartLogWatch {
  /** Stops watching; every start id the log held meanwhile, with when it was counted (Redis' ms). */
  stop(): Promise<Map<string, number>>;
}

/**
 * Reads the start log of the plain rate limit of `tool` under `prefix` every 50 ms until `stop`. A start stays in the
 * log at least its window (`perMs`, 1 s in the tests), so a read that comes less than a window late misses none.
 */
export function watchStartLog(r: Redis, prefix: string, tool: string): StartLogWatch {
  const pattern = `${prefix}:limit:rate:${encodeURIComponent(`tool:${tool}`)}:*`;
  const seen = new Map<string, number>();
  let key: string | undefined;
  let stopped = false;
  const read = async () => {
    key ??= (await r.keys(pattern)).find((k) => !k.endsWith(':hold'));
    if (key === undefined) return;
    const flat = await r.zrange(key, 0, -1, 'WITHSCORES');
    for (let i = 0; i + 1 < flat.length; i += 2) seen.set(flat[i]!, Number(flat[i + 1]));
  };
  // A read that fails (the connection closed under a failed test) ends the watch; `stop` then says why.
  const loop = (async () => {
    while (!stopped) {
      await read();
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await read();
  })();
  loop.catch(() => undefined);
  return {
    stop: async () => {
      stopped = true;
      await loop;
      return seen;
    },
  };
}

/**
 * The start each job of `taken` (its take, by job id) was counted at: exactly one per run, never before its take. Then
 * any `max + 1` of them span at least `perMs`, exactly: the limit's own promise, in its own clock.
 */
export function expectStartsLogged(
  log: Map<string, number>,
  taken: Map<string, number>,
  max: number,
  perMs: number,
): number[] {
  const starts: number[] = [];
  for (const [jobId, takenAt] of taken) {
    const own = [...log].filter(([id]) => id.startsWith(`${jobId}:`)).map(([, at]) => at);
    expect(own, `the starts the log counted for ${jobId}`).toHaveLength(1);
    expect(own[0]!, `${jobId}'s start, counted after its take at ${takenAt}`).toBeGreaterThanOrEqual(takenAt);
    starts.push(own[0]!);
  }
  starts.sort((a, b) => a - b);
  for (let i = 0; i + max < starts.length; i++) {
    expect(
      starts[i + max]! - starts[i]!,
      `starts ${i + 1} to ${i + max + 1} of ${starts.join(', ')}`,
    ).toBeGreaterThanOrEqual(perMs);
  }
  return starts;
}

/** Redis' clock, in ms. */
export async function redisNowMs(r: Redis): Promise<number> {
  const [seconds, micros] = await r.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

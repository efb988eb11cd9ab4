/**
 * Starts of a rate-limited tool as Redis saw them (PROTOCOL.md §3.3), for the rate limit's end-to-end tests of both
 * workers. A run starts from a take: the last `active` entry of its job in its queue's BullMQ event stream (an entry's
 * id is Redis' time in ms). A take the start log refused is followed by the job's `waiting` entry and a later take.
 * The handlers' own start times lag the take by a scheduling delay that grows with the machine's load (seen 927 ms
 * apart for a 1,000 ms window at load 11), so they are not the limit's measure.
 */
import type { Redis } from 'ioredis';
import { expect } from 'vitest';

/** When each job of `jobIds` was taken for the run that started it, in Redis' clock, sorted. */
export async function startedTakes(r: Redis, eventsKey: string, jobIds: string[]): Promise<number[]> {
  const stream = await r.xrange(eventsKey, '-', '+');
  const taken = new Map<string, number>();
  for (const [entryId, fields] of stream) {
    const field = (name: string) => fields[fields.indexOf(name) + 1];
    const jobId = field('jobId') ?? '';
    if (field('event') === 'active' && jobIds.includes(jobId)) taken.set(jobId, Number(entryId.split('-')[0]));
  }
  return [...taken.values()].sort((a, b) => a - b);
}

/**
 * Any `max + 1` starts span at least `perMs`. A take precedes the start the log counts by the worker's step from the
 * one to the other (a script call and a few ms of the run's set-up, longer under load): 150 ms of room for it.
 */
export function expectAtMostInAnyWindow(starts: number[], max: number, perMs: number): void {
  for (let i = 0; i + max < starts.length; i++) {
    expect(
      starts[i + max]! - starts[i]!,
      `starts ${i + 1} to ${i + max + 1} of ${starts.join(', ')}`,
    ).toBeGreaterThanOrEqual(perMs - 150);
  }
}

/** Redis' clock, in ms. */
export async function redisNowMs(r: Redis): Promise<number> {
  const [seconds, micros] = await r.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

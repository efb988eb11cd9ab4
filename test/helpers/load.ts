/**
 * Waits that scale with what the machine is doing. A bound in a test is a "something is wrong" limit, never a speed
 * target (those are `pnpm bench`'s): on a 2-core machine running a second full suite beside this one (load average
 * 10–14), a gateway has taken over 20 s to become ready and a task result several times its quiet-machine time.
 * `loadFactor()` is the 1-minute load average per core, at least 1 (a quiet machine keeps the written bounds) and at
 * most MAX_FACTOR (a wedged process still fails in bounded time).
 */
import { availableParallelism, loadavg } from 'node:os';

const MAX_FACTOR = 6;

export function loadFactor(): number {
  const perCore = (loadavg()[0] ?? 0) / availableParallelism();
  return Math.min(MAX_FACTOR, Math.max(1, perCore));
}

/** `ms` stretched by the load now. */
export function scaled(ms: number): number {
  return Math.round(ms * loadFactor());
}

/**
 * An absence window: waits `ms` stretched by the load, for a test that then checks that something did not happen
 * (a second delivery, a firing while paused, a read while idle). On a loaded machine the event it looks for comes
 * late too, and a window of the quiet machine's length would close before it and pass a test that should fail.
 */
export function absenceWindow(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, scaled(ms)));
}

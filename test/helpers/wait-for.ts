import { loadFactor } from './load.js';

/** Thrown by a condition to end the wait at once: what it waits for can no longer happen (its process exited). */
export class StopWaiting extends Error {}

/**
 * Polls `condition` until it returns a truthy value or `timeoutMs` passes, stretched by the machine's load
 * (`loadFactor`, read again at each poll, so a load that rises during the wait extends it). Never a bare sleep.
 */
export async function waitFor<T>(
  condition: () => T | Promise<T>,
  options: { timeoutMs?: number; intervalMs?: number; message?: string } = {},
): Promise<NonNullable<T>> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const intervalMs = options.intervalMs ?? 20;
  const started = Date.now();
  let lastError: unknown;
  for (;;) {
    try {
      const value = await condition();
      if (value) return value as NonNullable<T>;
    } catch (error) {
      if (error instanceof StopWaiting) throw error;
      lastError = error;
    }
    const waited = Date.now() - started;
    if (waited > timeoutMs * loadFactor()) {
      const cause = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`${options.message ?? 'condition not met'} within ${waited} ms${cause}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Polls `condition` until it returns a truthy value or `timeoutMs` passes. Never a bare sleep. */
export async function waitFor<T>(
  condition: () => T | Promise<T>,
  options: { timeoutMs?: number; intervalMs?: number; message?: string } = {},
): Promise<NonNullable<T>> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const intervalMs = options.intervalMs ?? 20;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await condition();
      if (value) return value as NonNullable<T>;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      const cause = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`${options.message ?? 'condition not met'} within ${timeoutMs} ms${cause}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

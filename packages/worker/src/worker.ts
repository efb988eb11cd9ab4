import { checkIsolatedTools } from './engine/isolated-run.js';
import { TaskWorker } from './engine/task-worker.js';
import { resolveWorkerOptions, type CloseOptions, type WorkerOptions } from './options.js';

export { resolveWorkerOptions, type CloseOptions, type ResolvedWorkerOptions, type WorkerOptions } from './options.js';

/** A running worker. */
export interface WorkerHandle {
  readonly workerId: string;
  /** The pool this worker consumes: its `queue` option plus a digest of its tool names (PROTOCOL.md §3.2). */
  readonly queue: string;
  /**
   * Stops taking jobs, waits up to `graceMs` for running tools (the catalog stays listed meanwhile), aborts the rest
   * with `WORKER_SHUTDOWN`, removes the catalog, then closes every Redis connection. Safe to call more than once.
   */
  close(options?: CloseOptions): Promise<void>;
}

/**
 * Starts a worker: consumes its queue, serves cancels, and publishes its tool catalog (once before this resolves, so
 * a gateway sees the tools at once).
 *
 * @throws ConfigError when an option is invalid, an isolated tool's module does not export it, or this is an isolated
 *   run's child (PROTOCOL.md §31.4).
 */
export async function startWorker(options: WorkerOptions): Promise<WorkerHandle> {
  const resolved = resolveWorkerOptions(options);
  await checkIsolatedTools(resolved.tools);
  const worker = new TaskWorker(resolved);
  await worker.start();
  return { workerId: worker.workerId, queue: worker.queue, close: (closeOptions) => worker.close(closeOptions) };
}

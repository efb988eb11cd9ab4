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
 */
export async function startWorker(options: WorkerOptions): Promise<WorkerHandle> {
  const worker = new TaskWorker(resolveWorkerOptions(options));
  await worker.start();
  return { workerId: worker.workerId, queue: worker.queue, close: (closeOptions) => worker.close(closeOptions) };
}

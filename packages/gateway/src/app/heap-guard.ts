/**
 * The V8 heap's garbage within the memory budget's reserve (PROTOCOL.md §22.2, issue 48 F3). The budget counts what
 * the gateway holds for clients; under a flood V8 also lets its old space fill with the garbage of every message
 * (parsed, serialised, framed, copied for the socket) up to four to six times what is live before it collects, and
 * the process's RSS follows the heap: 250 unread streams against a 128 MiB budget held 58 MB live in up to 370 MB of
 * heap. This checks the heap once a second and, when what is in use passes the heap the gateway had at start plus
 * three quarters of the budget, runs a full collection (at most one per `minGapMs`): the garbage then never holds
 * more than the budget reserves for it, whatever V8's growth heuristics would allow.
 *
 * Hand-written: node has no API for a heap bound that collects instead of crashing (`--max-old-space-size` aborts the
 * process when live data reaches it); `gc` is V8's own, exposed at run time the way the `expose-gc` package does.
 */
import { getHeapStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** How much of the budget the heap may grow past its size at start before a collection. */
export const HEAP_SHARE_OF_BUDGET = 0.75;

export interface HeapGuardOptions {
  /** The memory budget (`TASKRELAY_MEMORY_BUDGET_BYTES`): how far the heap may grow past its size at start. */
  budgetBytes: number;
  /** How often the heap is read. Default 1000 ms. */
  intervalMs?: number;
  /** Fewest ms between two collections this runs. Default 2000 ms. */
  minGapMs?: number;
  /** Told of each collection: the heap in use before and after. Default: none. */
  onCollect?: (beforeBytes: number, afterBytes: number) => void;
}

/** Starts the guard; returns its stop. The timer never keeps the process alive. */
export function startHeapGuard(options: HeapGuardOptions): () => void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  // What the budget lets clients make the gateway hold is at most half of it (held bytes count twice, §22.2); a
  // quarter more is room for garbage, so the heap never passes its size at start plus three quarters of the budget.
  const limit = getHeapStatistics().used_heap_size + options.budgetBytes * HEAP_SHARE_OF_BUDGET;
  const minGapMs = options.minGapMs ?? 2000;
  let lastGc = 0;
  const timer = setInterval(() => {
    const before = getHeapStatistics().used_heap_size;
    const now = Date.now();
    if (before <= limit || now - lastGc < minGapMs) return;
    lastGc = now;
    gc();
    options.onCollect?.(before, getHeapStatistics().used_heap_size);
  }, options.intervalMs ?? 1000);
  timer.unref();
  return () => clearInterval(timer);
}

/**
 * The gateway's memory bound (PROTOCOL.md §22.2): sessions, event stores, routes, listen streams and the bytes waiting
 * in SSE send buffers under one budget, and what gives way past it — the principal that holds the most, first.
 */
import type { GatewayConfig, Logger } from '@taskrelay/shared';
import { StreamBuffers } from '../http/stream-buffers.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import type { TaskRouter } from '../tasks/task-router.js';
import { MemoryBudget } from './memory-budget.js';
import type { SessionRegistry } from './session-registry.js';

/** A stream is shed for the budget only when this far behind (§22.2): its client is not reading it. */
const SHED_STREAM_MIN_BYTES = 256 * 1024;

export interface MemoryRelief {
  /** What every SSE stream holds in its send buffers. */
  buffers: StreamBuffers;
  budget: MemoryBudget;
  /** A session event store grew or shrank by `delta` bytes. */
  onEventsResized: (delta: number) => void;
}

export function createMemoryRelief(deps: {
  options: Pick<GatewayConfig, 'memoryBudgetBytes'>;
  log: Logger;
  metrics: GatewayMetrics;
  sessions: SessionRegistry;
  router: Pick<TaskRouter, 'activeRoutes'>;
}): MemoryRelief {
  const { options, log, metrics, sessions, router } = deps;
  // What every SSE stream holds in its send buffers, shed from the largest consumer first past the budget (§22.2).
  let shedQueued = false;
  const buffers = new StreamBuffers(() => {
    if (shedQueued || budget.fits()) return;
    shedQueued = true;
    // Not inside the stream's own write: shedding closes streams, possibly the one writing.
    setImmediate(() => {
      shedQueued = false;
      relieve();
    });
  });
  const budget = new MemoryBudget({
    budgetBytes: options.memoryBudgetBytes,
    sessions: () => sessions.size,
    routes: () => router.activeRoutes,
    streamBytes: () => buffers.bytes,
  });
  metrics.watchMemoryBudget(budget);
  /**
   * Past the budget (§22.2), again and again until the rest fit: the principal whose sessions and streams hold the most
   * gives way first — its largest stream buffer (when at least 256 KiB behind) is closed, else its least recently seen
   * idle session, else its largest event store drops its older half. So one principal's unread streams or floods never
   * cost anyone else first.
   */
  const relieve = () => {
    while (!budget.fits()) {
      const held = sessions.heldByPrincipal();
      for (const [principal, bytes] of buffers.byPrincipal()) held.set(principal, (held.get(principal) ?? 0) + bytes);
      const heaviest = [...held].sort((a, b) => b[1] - a[1]).map(([principal]) => principal);
      let freed = false;
      for (const principal of heaviest) {
        const stream = buffers.largestOf(principal);
        // A stream that far behind has a client not reading it; a reader's few unsent kilobytes are left alone.
        if (stream !== undefined && stream.bytes >= SHED_STREAM_MIN_BYTES) {
          metrics.streamsShed.inc();
          log.info(
            { principal, bufferedBytes: stream.bytes, budgetBytes: budget.budgetBytes },
            'SSE stream closed: the memory budget is reached and its principal holds the most',
          );
          stream.stream.shed();
          freed = true;
        } else {
          freed = sessions.relieveFrom(principal);
        }
        if (freed) break;
      }
      if (!freed) break;
    }
  };
  let evictionQueued = false;
  const onEventsResized = (delta: number) => {
    metrics.sseEventBytes.inc(delta);
    budget.eventsResized(delta);
    // Not inside the store's own write: relieving closes sessions, possibly the one writing.
    if (delta > 0 && !evictionQueued && !budget.fits()) {
      evictionQueued = true;
      setImmediate(() => {
        evictionQueued = false;
        relieve();
      });
    }
  };
  return { buffers, budget, onEventsResized };
}

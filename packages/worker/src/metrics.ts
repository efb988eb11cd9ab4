/**
 * A worker's Prometheus metrics, and the small HTTP listener that serves them (`WORKER_METRICS_PORT`). One registry
 * per worker, so several workers in one process (tests, embedding) do not collide.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { ProcessMetrics } from '@taskrelay/shared';

const WAIT_BUCKETS = [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600];
const RUN_BUCKETS = [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600];
const CANCEL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30];

export class WorkerMetrics extends ProcessMetrics {
  readonly jobsStarted = this.counter({
    name: 'taskrelay_worker_jobs_started_total',
    help: 'Runs started by this worker, by tool (a retry or a takeover after a crash is a new run).',
    labelNames: ['tool'] as const,
  });
  readonly queueWait = this.histogram({
    name: 'taskrelay_queue_wait_seconds',
    help: 'From enqueue to the first run starting, by tool.',
    labelNames: ['tool'] as const,
    buckets: WAIT_BUCKETS,
  });
  readonly runDuration = this.histogram({
    name: 'taskrelay_worker_run_seconds',
    help: "One run of a tool's handler on this worker, from start to its slot being free, by tool.",
    labelNames: ['tool'] as const,
    buckets: RUN_BUCKETS,
  });
  readonly cancelLatency = this.histogram({
    name: 'taskrelay_worker_cancel_seconds',
    help: "From a run's signal aborting to its slot being free (how fast handlers honour a cancel), by reason.",
    labelNames: ['reason'] as const,
    buckets: CANCEL_BUCKETS,
  });
  readonly limitWaits = this.counter({
    name: 'taskrelay_worker_limit_waits_total',
    help: 'Runs sent back to wait by a per-key or shared limit (PROTOCOL.md §3.5), by tool and limit (slot, rate).',
    labelNames: ['tool', 'limit'] as const,
  });
  readonly backOffs = this.counter({
    name: 'taskrelay_worker_back_offs_total',
    help: 'Runs that ended with RetryAfterError (or an upstream 429/503 with Retry-After): delayed, no attempt used.',
    labelNames: ['tool'] as const,
  });
  readonly progressWritten = this.counter({
    name: 'taskrelay_worker_progress_writes_total',
    help: 'Progress updates written to Redis (after the throttle).',
  });
  readonly progressCoalesced = this.counter({
    name: 'taskrelay_worker_progress_coalesced_total',
    help: "ctx.progress() values merged by the worker's per-task throttle (a newer value replaced them).",
  });
  readonly batchChildrenReleased = this.counter({
    name: 'taskrelay_worker_batch_children_released_total',
    help: 'Batch children whose jobs a parent added (PROTOCOL.md §26), by child tool.',
    labelNames: ['tool'] as const,
  });
  readonly batchChildren = this.counter({
    name: 'taskrelay_worker_batch_children_total',
    help: 'Batch children recorded by this worker, by child tool and outcome (completed, failed); each child once.',
    labelNames: ['tool', 'outcome'] as const,
  });

  constructor() {
    super('worker');
  }

  /** Busy and idle slots, read at scrape time. */
  watchSlots(busy: () => number, concurrency: number): void {
    this.gauge({
      name: 'taskrelay_worker_slots',
      help: 'Job slots of this worker (WORKER_CONCURRENCY), by state: busy or idle.',
      labelNames: ['state'] as const,
      collect() {
        const n = busy();
        this.set({ state: 'busy' }, n);
        this.set({ state: 'idle' }, Math.max(0, concurrency - n));
      },
    });
  }
}

export interface MetricsServer {
  readonly port: number;
  close(): Promise<void>;
}

/** Serves `GET /metrics` (Prometheus text format) on `host:port`; anything else is 404. */
export function serveMetrics(registry: Registry, host: string, port: number): Promise<MetricsServer> {
  const server: Server = createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found\n');
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'Content-Type': registry.contentType }).end(text),
      (error: unknown) => res.writeHead(500, { 'Content-Type': 'text/plain' }).end(`${String(error)}\n`),
    );
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve({
        port: (server.address() as AddressInfo).port,
        close: () => new Promise<void>((done) => server.close(() => done())),
      });
    });
  });
}

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/** The gateway's Prometheus metrics; one registry per gateway so tests can run several in one process. */
export class GatewayMetrics {
  readonly registry = new Registry();
  readonly tasksCreated = new Counter({
    name: 'taskrelay_tasks_created_total',
    help: 'Tasks created by this gateway, by tool and mode (task or call).',
    labelNames: ['tool', 'mode'] as const,
    registers: [this.registry],
  });
  readonly tasksFinished = new Counter({
    name: 'taskrelay_tasks_finished_total',
    help: 'Tasks created by this gateway that reached a terminal status, by status.',
    labelNames: ['status'] as const,
    registers: [this.registry],
  });
  readonly tasksCancelled = new Counter({
    name: 'taskrelay_cancel_requests_total',
    help: 'Cancels accepted by this gateway, by trigger.',
    labelNames: ['trigger'] as const,
    registers: [this.registry],
  });
  readonly tasksReaped = new Counter({
    name: 'taskrelay_tasks_reaped_total',
    help: 'Tasks the reaper failed, by cause: TIMEOUT (deadline passed) or JOB_LOST (job gone or failed).',
    labelNames: ['code'] as const,
    registers: [this.registry],
  });
  readonly progressForwarded = new Counter({
    name: 'taskrelay_progress_notifications_total',
    help: 'notifications/progress sent to clients.',
    registers: [this.registry],
  });
  readonly progressDropped = new Counter({
    name: 'taskrelay_progress_dropped_total',
    help: 'Progress events dropped: no route on this gateway (unknown, expired, terminal or foreign task).',
    registers: [this.registry],
  });
  readonly sessions = new Gauge({
    name: 'taskrelay_sessions_active',
    help: 'MCP sessions held by this gateway.',
    registers: [this.registry],
  });
  readonly routes = new Gauge({
    name: 'taskrelay_task_routes_active',
    help: 'Running tasks whose progress this gateway forwards.',
    registers: [this.registry],
  });
  readonly sseEventBytes = new Gauge({
    name: 'taskrelay_sse_event_store_bytes',
    help: 'Bytes of SSE events held in memory for Last-Event-ID resumption, over all sessions.',
    registers: [this.registry],
  });
  readonly requestsInFlight = new Gauge({
    name: 'taskrelay_requests_in_flight',
    help: 'MCP POST requests whose response is not finished yet (plain calls, tasks/result waits, ...).',
    registers: [this.registry],
  });
  readonly callDuration = new Histogram({
    name: 'taskrelay_tool_call_seconds',
    help: 'Duration of plain (blocking) tools/call requests.',
    labelNames: ['tool'] as const,
    buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300],
    registers: [this.registry],
  });

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'taskrelay_gateway_' });
  }
}

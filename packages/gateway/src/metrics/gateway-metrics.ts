import { ProcessMetrics } from '@taskrelay/shared';

/**
 * What the fleet gauges read at scrape time. The metrics sit on the gateway's ground floor, so they name what they
 * need here and the operator's read side (`admin/queries.ts`, `AdminQueries`) provides it.
 */
export interface FleetReads {
  /** The tool queues the dashboard shows, with their job counts by state and their live workers. */
  queueDepths(): Promise<FleetQueue[]>;
  liveCounts(): Promise<Array<{ tool: string; status: string; count: number }>>;
  tools(): Promise<FleetTool[]>;
}

/** The part of a queue's view the gauges show. */
export interface FleetQueue {
  queue: string;
  counts: Record<string, number>;
  workers: number;
}

/** The part of a tool's view the gauges show. */
export interface FleetTool {
  name: string;
  paused: boolean;
  concurrency?: number;
  active: number;
  waiting: number;
}

/** `read`, shared by the calls within a second of each other (one scrape's gauges); a failed read counts as empty. */
function oncePerScrape<T>(read: () => Promise<T[]>): () => Promise<T[]> {
  let last: { at: number; value: Promise<T[]> } | undefined;
  return () => {
    if (!last || Date.now() - last.at > 1_000) last = { at: Date.now(), value: read().catch(() => []) };
    return last.value;
  };
}

/** Seconds, from a fast call to a long report: tasks run from milliseconds to hours. */
const DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600];
const CANCEL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

/** The gateway's Prometheus metrics; one registry per gateway so tests can run several in one process. */
export class GatewayMetrics extends ProcessMetrics {
  readonly callsJoined = this.counter({
    name: 'taskrelay_calls_joined_total',
    help: 'Calls that joined an unfinished call of the same tool, principal and dedupe key instead of starting one (PROTOCOL.md §25.2).',
    labelNames: ['tool'] as const,
  });
  readonly tasksCreated = this.counter({
    name: 'taskrelay_tasks_created_total',
    help: 'Tasks created by this gateway, by tool and mode (task or call).',
    labelNames: ['tool', 'mode'] as const,
  });
  readonly tasksFinished = this.counter({
    name: 'taskrelay_tasks_finished_total',
    help: 'Tasks created by this gateway that reached a terminal status, by tool and status.',
    labelNames: ['tool', 'status'] as const,
  });
  readonly tasksCancelled = this.counter({
    name: 'taskrelay_cancel_requests_total',
    help: 'Cancels accepted by this gateway, by trigger.',
    labelNames: ['trigger'] as const,
  });
  readonly tasksReaped = this.counter({
    name: 'taskrelay_tasks_reaped_total',
    help: 'Tasks the reaper failed, by cause: TIMEOUT (deadline passed) or JOB_LOST (job gone or failed).',
    labelNames: ['code'] as const,
  });
  readonly progressForwarded = this.counter({
    name: 'taskrelay_progress_notifications_total',
    help: 'notifications/progress sent to clients.',
  });
  readonly progressDropped = this.counter({
    name: 'taskrelay_progress_dropped_total',
    help: 'Progress events dropped: no route on this gateway (unknown, expired, terminal or foreign task).',
  });
  readonly progressCoalesced = this.counter({
    name: 'taskrelay_progress_coalesced_total',
    help: 'Progress events merged by the per-task throttle before reaching the client (a newer value replaced them).',
  });
  readonly taskDuration = this.histogram({
    name: 'taskrelay_task_duration_seconds',
    help: 'From task creation to its terminal status, for tasks created by this gateway, by tool and status.',
    labelNames: ['tool', 'status'] as const,
    buckets: DURATION_BUCKETS,
  });
  readonly cancelLatency = this.histogram({
    name: 'taskrelay_cancel_seconds',
    help: 'tasks/cancel: from the request to the answer (state written, owning gateway acknowledged), by trigger.',
    labelNames: ['trigger'] as const,
    buckets: CANCEL_BUCKETS,
  });
  readonly streams = this.gauge({
    name: 'taskrelay_sse_streams_active',
    help: 'Standalone GET /mcp SSE streams open on this gateway.',
  });
  readonly sessions = this.gauge({
    name: 'taskrelay_sessions_active',
    help: 'MCP sessions held by this gateway.',
  });
  readonly routes = this.gauge({
    name: 'taskrelay_task_routes_active',
    help: 'Running tasks whose progress this gateway forwards.',
  });
  readonly sseEventBytes = this.gauge({
    name: 'taskrelay_sse_event_store_bytes',
    help: 'Bytes of SSE events held in memory for Last-Event-ID resumption, over all sessions.',
  });
  readonly streamOverflows = this.counter({
    name: 'taskrelay_sse_stream_overflows_total',
    help: 'SSE streams closed because their client did not read and the bytes waiting passed the bound.',
  });
  readonly streamCoalesced = this.counter({
    name: 'taskrelay_sse_progress_coalesced_total',
    help: "Progress notifications replaced by a newer one while their stream's client was behind.",
  });
  readonly streamsShed = this.counter({
    name: 'taskrelay_sse_streams_shed_total',
    help: 'SSE streams closed because the gateway memory budget was reached and their principal held the most in stream buffers.',
  });
  readonly eventStoresTrimmed = this.counter({
    name: 'taskrelay_sse_event_stores_trimmed_total',
    help: 'Session event stores halved (their oldest events dropped) because the gateway memory budget was reached and their principal held the most with no idle session to close.',
  });
  readonly sessionsEvicted = this.counter({
    name: 'taskrelay_sessions_evicted_total',
    help: 'Idle sessions closed because the gateway memory budget was reached.',
  });
  readonly sessionsRefused = this.counter({
    name: 'taskrelay_sessions_refused_total',
    help: 'New sessions refused (503) because the gateway memory budget was reached.',
  });
  readonly requestsInFlight = this.gauge({
    name: 'taskrelay_requests_in_flight',
    help: 'MCP POST requests whose response is not finished yet (plain calls, tasks/result waits, ...).',
  });
  readonly callDuration = this.histogram({
    name: 'taskrelay_tool_call_seconds',
    help: 'Duration of plain (blocking) tools/call requests.',
    labelNames: ['tool'] as const,
    buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300],
  });

  readonly webhookDeliveries = this.counter({
    name: 'taskrelay_webhook_deliveries_total',
    help: 'Webhook tries settled by this gateway, by outcome: delivered (2xx), retried, dead (dead-lettered), gone (410).',
    labelNames: ['outcome'] as const,
  });

  constructor() {
    super('gateway');
  }

  /** The memory budget's use and bound, read at scrape time (§22.2). */
  watchMemoryBudget(budget: { use(): { usedBytes: number; budgetBytes: number } }): void {
    this.gauge({
      name: 'taskrelay_memory_budget_used_bytes',
      help: 'Bytes this gateway counts against TASKRELAY_MEMORY_BUDGET_BYTES (sessions, event stores, routes, listen streams).',
      collect() {
        this.set(budget.use().usedBytes);
      },
    });
    this.gauge({
      name: 'taskrelay_memory_budget_bytes',
      help: 'The memory budget of this gateway (TASKRELAY_MEMORY_BUDGET_BYTES).',
      collect() {
        this.set(budget.use().budgetBytes);
      },
    });
  }

  /**
   * Fleet-wide gauges read from Redis at scrape time (never on a request's path): queue depth by queue and state, and
   * live tasks by tool and status. Every gateway reports the same fleet values; aggregate them with `max`, not `sum`.
   */
  watchFleet(queries: FleetReads): void {
    // Two gauges read each of these views; one scrape reads it once (each read is a few Redis round trips per queue).
    const tools = oncePerScrape(() => queries.tools());
    const queues = oncePerScrape(() => queries.queueDepths());
    this.gauge({
      name: 'taskrelay_queue_jobs',
      help: 'BullMQ jobs per tool queue (PROTOCOL.md §3.2) and state, fleet-wide: the queues live workers consume, and those of remembered pools while a job is in them.',
      labelNames: ['queue', 'state'] as const,
      async collect() {
        this.reset();
        for (const { queue, counts } of await queues()) {
          for (const [state, count] of Object.entries(counts)) this.set({ queue, state }, count);
        }
      },
    });
    this.gauge({
      name: 'taskrelay_tasks_live',
      help: 'Non-terminal tasks (queued or running) by tool and status, fleet-wide (at most 1000 read).',
      labelNames: ['tool', 'status'] as const,
      async collect() {
        this.reset();
        for (const { tool, status, count } of await queries.liveCounts().catch(() => [])) {
          this.set({ tool, status }, count);
        }
      },
    });
    this.gauge({
      name: 'taskrelay_tool_paused',
      help: 'Tools an operator paused (1), by tool, fleet-wide (PROTOCOL.md §3.3).',
      labelNames: ['tool'] as const,
      async collect() {
        this.reset();
        for (const tool of await tools()) this.set({ tool: tool.name }, tool.paused ? 1 : 0);
      },
    });
    this.gauge({
      name: 'taskrelay_runs_waiting',
      help: 'Queued runs per tool and why they wait: paused, concurrency (the tool is at its limit) or queued, fleet-wide.',
      labelNames: ['tool', 'reason'] as const,
      async collect() {
        this.reset();
        for (const tool of await tools()) {
          const atLimit = tool.concurrency !== undefined && tool.active >= tool.concurrency;
          const reason = tool.paused ? 'paused' : atLimit ? 'concurrency' : 'queued';
          this.set({ tool: tool.name, reason }, tool.waiting);
        }
      },
    });
    this.gauge({
      name: 'taskrelay_workers_live',
      help: 'Workers with a live heartbeat, by the tool queue they consume (one per tool, PROTOCOL.md §3.2), fleet-wide; 0 for a queue whose last worker left with jobs in it.',
      labelNames: ['queue'] as const,
      async collect() {
        this.reset();
        for (const { queue, workers } of await queues()) this.set({ queue }, workers);
      },
    });
  }

  /** Fleet-wide webhook outbox gauges, read at scrape time (PROTOCOL.md §27.6); aggregate with `max`. */
  watchWebhooks(counts: () => Promise<{ pending: number; dead: number }>): void {
    const read = () => counts().catch(() => undefined);
    this.gauge({
      name: 'taskrelay_webhooks_pending',
      help: 'Webhook events not settled yet (due, or in a try), fleet-wide.',
      async collect() {
        const c = await read();
        if (c) this.set(c.pending);
      },
    });
    this.gauge({
      name: 'taskrelay_webhooks_dead',
      help: 'Dead-lettered webhook events held (the newest 1000), fleet-wide.',
      async collect() {
        const c = await read();
        if (c) this.set(c.dead);
      },
    });
  }

  /** A task created here ended: count it and observe its duration. */
  taskEnded(tool: string, status: string, createdAt: string): void {
    this.tasksFinished.inc({ tool, status });
    const ms = Date.now() - Date.parse(createdAt);
    if (Number.isFinite(ms)) this.taskDuration.observe({ tool, status }, Math.max(0, ms) / 1000);
  }
}

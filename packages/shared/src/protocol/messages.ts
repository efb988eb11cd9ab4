/**
 * Messages between gateway and worker (docs/PROTOCOL.md). Every message that crosses Redis is parsed with one of
 * these schemas on the receiving side.
 */
import { z } from 'zod';
import { CANCEL_REASONS, LOG_LEVELS, TASK_STATUSES } from './task-model.js';

export const TaskStatusSchema = z.enum(TASK_STATUSES);
export const CancelReasonSchema = z.enum(CANCEL_REASONS);
export const ProgressTokenSchema = z.union([z.string(), z.number().int()]);

/** §6: published by the progress script on the owning gateway's channel. */
export const ProgressEventSchema = z.object({
  type: z.literal('progress'),
  taskId: z.string(),
  progress: z.number(),
  total: z.number().optional(),
  message: z.string().optional(),
});
export type ProgressEvent = z.infer<typeof ProgressEventSchema>;

/** §2, §10.9: published by the transition and reaper scripts on the owner's and every watcher's channel. */
export const StatusEventSchema = z.object({
  type: z.literal('status'),
  taskId: z.string(),
  status: TaskStatusSchema,
  statusMessage: z.string().optional(),
  lastUpdatedAt: z.string(),
  cancelReason: CancelReasonSchema.optional(),
  /** A gateway answering a cancel for a task this gateway owns waits for an `ack` on its own channel. */
  ackTo: z.string().optional(),
  /** On a move to `input_required`: the number of the request now waiting (its params are in the hash, §12.2). */
  inputRequestId: z.string().optional(),
  /**
   * A terminal event that carries the task's outcome (§6.7): `result` and `error` as stored in the hash (JSON text;
   * absent when the task has none), so the gateway that routes the task answers its waiters without reading it.
   * Absent when the outcome is too big to publish: the waiters read the hash.
   */
  final: z.literal(true).optional(),
  /**
   * A terminal event that carries the outcome as JSON values, `resultJson` and `errorJson`: what the transition script
   * sends (the stored text written in place, so Redis does not escape it again). `final` with `result` and `error` as
   * JSON text is what scripts of an earlier version send; a gateway reads either, and a gateway of an earlier version,
   * which does not know `finalJson`, reads the hash.
   */
  finalJson: z.literal(true).optional(),
  /**
   * On a terminal event: the ttl the task is kept for, when the deployment's retention policy (§30.1) replaced the
   * one it was created with. The gateway that holds the ended task answers `tasks/get` from it (§6.7).
   */
  ttl: z.number().int().positive().optional(),
  resultJson: z.unknown().optional(),
  errorJson: z.unknown().optional(),
  result: z.string().optional(),
  error: z.string().optional(),
});
export type StatusEvent = z.infer<typeof StatusEventSchema>;

/** §10.9: the owner retired a cancelled task's route; sent to the gateway that answers the cancel. */
export const AckEventSchema = z.object({
  type: z.literal('ack'),
  taskId: z.string(),
});
export type AckEvent = z.infer<typeof AckEventSchema>;

/** §15: a tool's log message (`ctx.notify`), published by the log script on the owning gateway's channel. */
export const LogEventSchema = z.object({
  type: z.literal('log'),
  taskId: z.string(),
  level: z.enum(LOG_LEVELS),
  data: z.unknown(),
  logger: z.string().optional(),
});
export type LogEvent = z.infer<typeof LogEventSchema>;

/** Everything on one gateway's channel. */
export const GatewayEventSchema = z.discriminatedUnion('type', [
  ProgressEventSchema,
  StatusEventSchema,
  AckEventSchema,
  LogEventSchema,
]);
export type GatewayEvent = z.infer<typeof GatewayEventSchema>;

/** §7: published by the gateway on the cancel channel. */
export const CancelRequestSchema = z.object({
  taskId: z.string(),
  reason: CancelReasonSchema,
});
export type CancelRequest = z.infer<typeof CancelRequestSchema>;

/** §4: BullMQ job data. */
export const JobDataSchema = z.object({
  taskId: z.string(),
  tool: z.string(),
  // Only checked to be an object: the tool's own schema validates its content, once (a record schema would walk and
  // copy every argument a second time per job).
  arguments: z.custom<Record<string, unknown>>((v) => typeof v === 'object' && v !== null && !Array.isArray(v), {
    message: 'must be an object',
  }),
  /** Abort the tool with TIMEOUT this long after it starts; absent means no limit. */
  timeoutMs: z.number().int().positive().optional(),
  /** How long the job may wait in the queue (again) before the reaper fails its task (PROTOCOL.md §10.2). */
  queueTimeoutMs: z.number().int().positive().optional(),
  /** Correlation, so worker log lines carry the same fields as the gateway's (PROTOCOL.md §4). */
  principal: z.string().optional(),
  sessionId: z.string().optional(),
  /** The JSON-RPC id of the tools/call that created the task, as a string. */
  requestId: z.string().optional(),
  /**
   * The principal's open-work cap (`TASKRELAY_MAX_OPEN_TASKS` when authentication is on): a batch's children in flight
   * count toward it (PROTOCOL.md §26.6). Absent: no cap.
   */
  maxOpen: z.number().int().positive().optional(),
  /** The job's priority level, 1 (first) to 5 (PROTOCOL.md §25.1): a batch parent's children take it. Absent: 3. */
  priority: z.number().int().min(1).max(5).optional(),
  /** W3C trace context (`traceparent`, `tracestate`) of the request that created the task. */
  trace: z.record(z.string(), z.string()).optional(),
});
export type JobData = z.infer<typeof JobDataSchema>;

export const TaskSupportSchema = z.enum(['forbidden', 'optional', 'required']);
export type TaskSupport = z.infer<typeof TaskSupportSchema>;

/** §10.7: how long to wait before a retry. `exponential`: delayMs × 2^(retry − 1); jitter is a fraction (0..1). */
export const BackoffSchema = z.object({
  type: z.enum(['exponential', 'fixed']),
  delayMs: z.number().int().nonnegative(),
  jitter: z.number().min(0).max(1).optional(),
});
export type Backoff = z.infer<typeof BackoffSchema>;

/** §3: one tool as a worker advertises it. */
/** The most shards one tool may have (`shards` on `defineTool`). */
export const MAX_TOOL_SHARDS = 64;

export const ToolDescriptorSchema = z.object({
  name: z.string(),
  title: z.string().optional(),
  description: z.string(),
  inputSchema: z.record(z.string(), z.unknown()),
  outputSchema: z.record(z.string(), z.unknown()).optional(),
  taskSupport: TaskSupportSchema,
  timeoutMs: z.number().int().positive().optional(),
  attempts: z.number().int().positive().optional(),
  backoff: BackoffSchema.optional(),
  maxStalls: z.number().int().nonnegative().optional(),
  /**
   * Calls with the same values of these arguments (all of them when `key` is absent), by one principal and in one mode,
   * join the unfinished task of the first (PROTOCOL.md §25.2), for at most `ttlMs`.
   */
  dedupe: z.object({ key: z.array(z.string()).optional(), ttlMs: z.number().int().positive() }).optional(),
  /** The priority level of the tool's calls, 1 (first) to 5; absent: 3 (PROTOCOL.md §25.1). */
  priority: z.number().int().min(1).max(5).optional(),
  /** The tool's version (PROTOCOL.md §12.11): explicit, or derived from its name, schemas and code. */
  version: z.string().optional(),
  /** What a run does with a task another version of the tool started (§12.11). Absent: `resume`. */
  onVersionChange: z.enum(['resume', 'restart', 'fail']).optional(),
  /** At most this many runs of the tool at once, across the fleet (PROTOCOL.md §3.3; BullMQ's global concurrency). */
  concurrency: z.number().int().positive().optional(),
  /** The concurrency holds per value of these arguments (`["(function)"]`: a key function), §3.5. */
  concurrencyKey: z.array(z.string()).optional(),
  /**
   * At most `max` starts of the tool in any window of `perMs`, across the fleet (§3.3; BullMQ's global rate limit),
   * per value of `key`, or shared by every tool of the same `name` (§3.5).
   */
  rateLimit: z
    .object({
      max: z.number().int().positive(),
      perMs: z.number().int().positive(),
      key: z.array(z.string()).optional(),
      name: z.string().optional(),
    })
    .optional(),
  /**
   * Asks for its input before it becomes a task (PROTOCOL.md §17.4): a 2026-07-28 task call runs as a plain call
   * through its input rounds and becomes a task once the answers resume it.
   */
  inputFirst: z.boolean().optional(),
  /**
   * How many queues (tool shards) the tool's calls spread over, each on its own hash tag in the sharded key layout
   * (PROTOCOL.md §1.1); absent: 1. The single layout has one queue per tool whatever this says.
   */
  shards: z.number().int().min(1).max(MAX_TOOL_SHARDS).optional(),
});
export type ToolDescriptor = z.infer<typeof ToolDescriptorSchema>;

/** §3: one worker's catalog. */
export const WorkerCatalogSchema = z.object({
  workerId: z.string(),
  /** The worker's pool (§3.2, §24): its catalog group, not where its jobs queue. */
  queue: z.string(),
  /** Its `TASKRELAY_QUEUE`: each tool it serves is consumed from `toolQueue(queueName, tool)`. */
  queueName: z.string().optional(),
  tools: z.array(ToolDescriptorSchema),
  heartbeatAt: z.number(),
});
export type WorkerCatalog = z.infer<typeof WorkerCatalogSchema>;

/** A worker's `TASKRELAY_QUEUE`: its catalog's `queueName`, or (a worker from before queues per tool) its pool less the digest. */
export function catalogQueueName(catalog: Pick<WorkerCatalog, 'queue' | 'queueName'>): string {
  return catalog.queueName ?? catalog.queue.replace(/\.[0-9a-f]{12}$/, '');
}

/** A pool's tools as its workers last published them (`P:pools` field value, PROTOCOL.md §24). */
export const PoolCatalogSchema = z.object({
  /** The pool (`<queueName>.<digest>`, §3.2). */
  pool: z.string(),
  /** `TASKRELAY_QUEUE` of its workers: a newer pool of the same name supersedes this one. */
  queueName: z.string(),
  tools: z.array(ToolDescriptorSchema),
  /** The newest heartbeat of any of its workers (ms since epoch). */
  lastSeenAt: z.number(),
});
export type PoolCatalog = z.infer<typeof PoolCatalogSchema>;

/** Parses JSON and validates it; returns undefined for anything malformed (pub/sub payloads are untrusted). */
export function parseMessage<T>(schema: z.ZodType<T>, raw: string): T | undefined {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}

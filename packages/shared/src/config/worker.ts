/** The worker's configuration: its environment schema and its resolved shape (`loadWorkerConfig`). */
import { z } from 'zod';
import type { OutputLimits } from '../task-output.js';
import { common, commonShape, parseEnv, workerSettingsShape, type CommonConfig } from './common.js';
import { int, intEnv, type Env } from './values.js';

/** The worker's environment, variable by variable (docs/CONFIGURATION.md is generated from it). */
export const workerEnvSchema = z.object({
  ...commonShape,
  TASKRELAY_PREFIX: workerSettingsShape.prefix,
  TASKRELAY_PROGRESS_INTERVAL_MS: intEnv(workerSettingsShape.progressIntervalMs),
  WORKER_CONCURRENCY: intEnv(workerSettingsShape.concurrency),
  WORKER_LOCK_DURATION_MS: intEnv(workerSettingsShape.lockDurationMs),
  TASKRELAY_TOOLS: z.string().trim().min(1).optional(),
  TASKRELAY_QUEUE: workerSettingsShape.queue,
  WORKER_HEARTBEAT_MS: intEnv(workerSettingsShape.heartbeatMs),
  WORKER_ABORT_GRACE_MS: intEnv(workerSettingsShape.abortGraceMs),
  WORKER_CANCEL_SWEEP_MS: intEnv(workerSettingsShape.cancelSweepMs),
  WORKER_SHUTDOWN_GRACE_MS: intEnv(workerSettingsShape.shutdownGraceMs),
  WORKER_METRICS_PORT: int(1, 65_535).optional(),
  HOST: z.string().trim().min(1).default('127.0.0.1'),
  TASKRELAY_INLINE_RESULT_BYTES: int(1_024, 1024 * 1024 * 1024)
    .default(1024 * 1024)
    .describe(
      'a result, or one content block of it, above this many bytes is stored apart and returned as `resource_link` content, read with `resources/read` ([PROTOCOL.md §34.3](PROTOCOL.md#34-task-output-as-resources))',
    ),
  TASKRELAY_MAX_OUTPUT_BYTES: int(1_024, 512 * 1024 * 1024)
    .default(1024 * 1024)
    .describe(
      "the most bytes a task's partial output (`ctx.output`) keeps: past it the oldest part is dropped (§34.2)",
    ),
  TASKRELAY_BLOB_TTL_MS: int(1_000, 365 * 86_400_000)
    .default(86_400_000)
    .describe(
      "how long a task's output, results stored apart and artifacts stay in Redis after their last write (§34)",
    ),
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK: int(1_024, 1024 * 1024 * 1024 * 1024)
    .default(64 * 1024 * 1024)
    .describe('the most bytes one task stores apart: artifacts and results moved out by reference (§34.4)'),
  TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL: int(1_024, 1024 * 1024 * 1024 * 1024)
    .default(1024 * 1024 * 1024)
    .describe('the most bytes one principal stores apart within `TASKRELAY_BLOB_TTL_MS` of its last store (§34.4)'),
});

export interface WorkerConfig extends CommonConfig {
  /** @default 8 */
  concurrency: number;
  /** @default 30000 */
  lockDurationMs: number;
  /** Module whose exports are tool definitions; undefined serves the demo tools. */
  toolsModule: string | undefined;
  /** @default "default" */
  queue: string;
  /** @default 5000 */
  heartbeatMs: number;
  /** @default 5000 */
  abortGraceMs: number;
  /** @default 2000 */
  cancelSweepMs: number;
  /**
   * On SIGTERM, how long running jobs may finish before they are aborted and handed back. Default 30000 ms.
   * @default 30000
   */
  shutdownGraceMs: number;
  /** When set, Prometheus `/metrics` is served on this port (`WORKER_METRICS_PORT`). Default: unset, no listener. */
  metricsPort: number | undefined;
  /**
   * Address the metrics listener binds (`HOST`, as for the gateway). Default `127.0.0.1`.
   * @default "127.0.0.1"
   */
  metricsHost: string;
  /** Bounds of task output, results by reference and artifacts (PROTOCOL.md §34). */
  output: OutputLimits;
}

export function loadWorkerConfig(env: Env = process.env): WorkerConfig {
  const p = parseEnv(workerEnvSchema, env);
  return {
    ...common(p),
    concurrency: p.WORKER_CONCURRENCY,
    lockDurationMs: p.WORKER_LOCK_DURATION_MS,
    toolsModule: p.TASKRELAY_TOOLS,
    queue: p.TASKRELAY_QUEUE,
    heartbeatMs: p.WORKER_HEARTBEAT_MS,
    abortGraceMs: p.WORKER_ABORT_GRACE_MS,
    cancelSweepMs: p.WORKER_CANCEL_SWEEP_MS,
    shutdownGraceMs: p.WORKER_SHUTDOWN_GRACE_MS,
    metricsPort: p.WORKER_METRICS_PORT,
    metricsHost: p.HOST,
    output: {
      inlineResultBytes: p.TASKRELAY_INLINE_RESULT_BYTES,
      maxOutputBytes: p.TASKRELAY_MAX_OUTPUT_BYTES,
      blobTtlMs: p.TASKRELAY_BLOB_TTL_MS,
      maxTaskBytes: p.TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK,
      maxPrincipalBytes: p.TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL,
    },
  };
}

/**
 * The public face of `@taskrelay/shared`: what the gateway, the worker, the CLI and their tests import, by name. A
 * module's other exports are the package's own (a test of this package imports them from `../src/...`); adding a name
 * here makes it public, so add what another package needs, not a whole module.
 */
export { AuditLog } from './audit-log.js';
export { BatchStore, childShard, MAX_STORED_CHILD_RESULT_CHARS } from './batch-store.js';
export type { BatchCounts, BatchOutcome, BatchShape } from './batch-store.js';
export { BlobObjects } from './blob-objects.js';
export type { BlobStoreConfig } from './blob-objects.js';
export { bullQueueKey, jobOptions } from './protocol/bullmq-layout.js';
export { canonicalDigest } from './canonical.js';
export { backlogBudget, backlogCost, ChannelBacklogStore, MIN_SHARD_BACKLOG_BYTES } from './channel-backlog.js';
export { Coalescer } from './coalescer.js';
export {
  gatewayEnvSchema,
  isLoopbackHost,
  loadGatewayConfig,
  loadWorkerConfig,
  requireRedisUrl,
  resolveGatewayOptions,
  workerEnvSchema,
  workerSettingsShape,
} from './config.js';
export type { GatewayConfig, GatewayOptions, OAuthConfig, WebhookConfig } from './config.js';
export {
  ConfigError,
  ERROR_CODES,
  JSON_RPC,
  NonRetryableError,
  oneLine,
  ProtocolError,
  serializeError,
  TaskrelayError,
} from './protocol/errors.js';
export type { ErrorCode, SerializedError } from './protocol/errors.js';
export { DEFAULT_PRIORITY, FairShare, PRIORITY_LEVELS, priorityBase, priorityLevelOf } from './fair-share.js';
export {
  batchChildId,
  createKeys,
  HOME_TAG,
  isShardCode,
  parseBatchChildId,
  queueOfBullName,
  shardOfBullPrefix,
  toolPool,
  toolQueue,
} from './protocol/keys.js';
export type { Keys } from './protocol/keys.js';
export { createLogger, endLogs } from './logger.js';
export type { Logger } from './logger.js';
export { listenForStopSignals } from './stop-signals.js';
export type { StopSignal, StopSignals } from './stop-signals.js';
export {
  BackoffSchema,
  CancelRequestSchema,
  catalogQueueName,
  GatewayEventSchema,
  JobDataSchema,
  MAX_TOOL_SHARDS,
  parseMessage,
  PoolCatalogSchema,
  TaskSupportSchema,
  WorkerCatalogSchema,
} from './protocol/messages.js';
export type {
  AckEvent,
  Backoff,
  CancelRequest,
  JobData,
  LogEvent,
  PoolCatalog,
  ProgressEvent,
  StatusEvent,
  TaskSupport,
  ToolDescriptor,
  WorkerCatalog,
} from './protocol/messages.js';
export { ProcessMetrics } from './metrics.js';
export { clusterMasters, masterOfSlot, pipelineByShard, ShardPlacement, slotOfCode } from './placement.js';
export type { MasterSlots } from './placement.js';
export {
  clusterPrefixProblem,
  createRedis,
  FAIL_FAST_REDIS_OPTIONS,
  isRedisTarget,
  isRedisUnavailableError,
  keyLayoutOf,
  waitForRedis,
} from './redis.js';
export type { KeyLayoutSetting, RedisClient } from './redis.js';
export { coalesceEveryCommand, setWriteCoalescing } from './protocol/write-coalescing.js';
export { scriptsGeneration } from './protocol/scripts.js';
export type { JobAddScript } from './protocol/scripts.js';
export { MAX_KEPT_LOG_LINE_BYTES, MAX_KEPT_LOG_LINES, RunLogs } from './store/run-logs.js';
export type { KeptLogLine } from './store/run-logs.js';
export { Runs } from './store/runs.js';
export type {
  AnswerOutcome,
  JobLock,
  LogMessage,
  LogOutcome,
  ProgressOutcome,
  ProgressUpdate,
  ReapedTask,
  ReapOutcome,
  RunStart,
  StartOutcome,
  SuspendInput,
  SuspendOutcome,
  TransitionFields,
  TransitionOptions,
  TransitionOutcome,
} from './store/runs.js';
export { newTaskId, terminalRecord } from './store/task-codec.js';
export { OpenCapReached } from './store/task-create.js';
export type { CreateOutcome, CreateTaskInput, PreparedCreate } from './store/task-create.js';
export { TaskRecords } from './store/task-records.js';
export type { TaskPage, TaskRecordsOptions } from './store/task-records.js';
export { TaskStore } from './store/task-store.js';
export { StoreRunner } from './store/store-runner.js';
export type { TaskStoreOptions } from './store/task-store.js';
export { Waitpoints } from './store/waitpoints.js';
export { TASK_FIELDS } from './protocol/task-fields.js';
export {
  CANCEL_REASONS,
  canTransition,
  INPUT_CAPABILITIES,
  inputKeyOf,
  isTerminal,
  LOG_LEVELS,
  MAX_TAGS,
  MIN_SUGGESTED_POLL_MS,
  FIRST_POLL_MS,
  firstPollInterval,
  questionIdentity,
  suggestedPollInterval,
  tagsProblem,
  TASK_STATUSES,
} from './protocol/task-model.js';
export type {
  CancelReason,
  InputMethod,
  InputRequest,
  LogLevel,
  ProgressToken,
  TaskMode,
  TaskRecord,
  TaskStatus,
  ToolResult,
} from './protocol/task-model.js';
export {
  blobUri,
  DEFAULT_OUTPUT_LIMITS,
  newBlobId,
  parseTaskResourceUri,
  StoredBytesLimitError,
  TASK_RESOURCE_TEMPLATES,
  TaskOutputStore,
} from './task-output.js';
export type { BlobMeta, OutputLimits, OutputLock, OutputWriteOutcome } from './task-output.js';
export { SEARCH_MAX_LIMIT, TaskSearch } from './task-search.js';
export type { TaskFilter } from './task-search.js';
export { controlsWaitReason, readToolControls, TOOL_CONTROLS_META, TOOL_VERSION_META } from './tool-controls.js';
export type { ToolControls } from './tool-controls.js';
export { limitKeyDigest, principalScopedKey, ToolLimitStore } from './tool-limit-store.js';
export type { SlotLimit } from './tool-limit-store.js';
export { startTaskSpan, startTracing, withJobSpan } from './tracing.js';
export type { SpanAttributes, Tracing } from './tracing.js';
export {
  announcePublicUrl,
  DEFAULT_WAITPOINT_TIMEOUT_MS,
  MAX_WAITPOINT_TIMEOUT_MS,
  MIN_WAITPOINT_TIMEOUT_MS,
  readPublicUrl,
  WAITPOINT_NAME,
  waitpointMessage,
  WaitpointTokens,
  waitpointUrl,
} from './waitpoints.js';
export type { WaitpointRecord } from './waitpoints.js';
export { WEBHOOK_DEAD_LETTERS_KEPT } from './protocol/webhook-limits.js';
export { DeadLetterSchema, OutboxEventSchema, WebhookOutbox, receiverOf } from './webhook-outbox.js';
export type { Claimed, ClaimFairness, DeadLetter, OutboxEvent, Settlement } from './webhook-outbox.js';
export { messageEvent, publishCommand, publishOn, shardedPubSub, subscribeTo } from './pubsub.js';

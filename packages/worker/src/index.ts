export { defineTool, isToolDefinition, toolJsonSchema } from './define-tool.js';
export type { CancelledTaskInfo, ToolDefinition, ToolInputSchema, ToolOptions, ToolReturn } from './define-tool.js';
export type {
  AskOptions,
  ElicitAnswer,
  ElicitParams,
  ElicitValue,
  SampleAnswer,
  SampleParams,
  RootsAnswer,
  StepOptions,
  ToolContext,
  ToolState,
  Waitpoint,
  WaitpointOutcome,
} from './context-types.js';
export { CancelledError, NonRetryableError, ProtocolError, RetryAfterError, SuspendedError } from './errors.js';
export { startWorker } from './worker.js';
export type { CloseOptions, ResolvedWorkerOptions, WorkerHandle, WorkerOptions } from './worker.js';
export { demoTools } from './demo-tools.js';
export { defineJobApiTool, loadJobApiTools, parseJobApiFile } from './job-api/index.js';
export type {
  CancelledTask,
  ExternalOutcome,
  JobApiToolDefinition,
  JobApiHookInfo,
  JobApiHooks,
  JobApiHttpRequest,
  JobApiHttpResponse,
  JobApiPhase,
  JobApiSpecInput,
  JobApiToolOptions,
  PollReading,
  SubmittedJob,
} from './job-api/index.js';
export { WorkerMetrics, serveMetrics, type MetricsServer } from './metrics.js';
export type { CancelReason, ToolResult } from '@taskrelay/shared';

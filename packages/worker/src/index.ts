export { defineTool, isToolDefinition, toolJsonSchema } from './define-tool.js';
export type { ToolDefinition, ToolInputSchema, ToolOptions, ToolReturn } from './define-tool.js';
export type { ToolContext } from './context.js';
export { CancelledError, NonRetryableError } from './errors.js';
export { startWorker } from './worker.js';
export type { CloseOptions, ResolvedWorkerOptions, WorkerHandle, WorkerOptions } from './worker.js';
export { demoTools } from './demo-tools.js';
export { WorkerMetrics, serveMetrics, type MetricsServer } from './metrics.js';
export type { CancelReason, ToolResult } from '@taskrelay/shared';

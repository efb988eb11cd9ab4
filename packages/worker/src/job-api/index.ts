export { defineJobApiTool } from './define-job-api-tool.js';
export type {
  CancelledTask,
  JobApiHookInfo,
  JobApiToolDefinition,
  JobApiHooks,
  JobApiToolOptions,
  PollReading,
  SubmittedJob,
} from './define-job-api-tool.js';
export type { JobApiHttpRequest, JobApiHttpResponse, JobApiPhase } from './http.js';
export { loadJobApiTools, parseJobApiFile } from './config-file.js';
export type { ExternalOutcome, JobApiSpecInput } from './spec.js';

/**
 * `defineJobApiTool`: a tool that wraps an existing HTTP job service (submit, poll, result, cancel) as an MCP task
 * (docs/JOB-API.md, PROTOCOL.md §12.10). The `TASKRELAY_JOB_APIS` file form is built on it.
 */
import type { z } from 'zod';
import { NonRetryableError, type Backoff, type TaskSupport, type ToolResult } from '@taskrelay/shared';
import type { ToolContext } from '../context-types.js';
import {
  defineTool,
  type CancelledTaskInfo,
  type ToolDefinition,
  type ToolInputSchema,
  type ToolOptions,
} from '../define-tool.js';
import { CancelledError, SuspendedError, cancelReasonOf } from '../errors.js';
import {
  redact,
  sendWithRetry,
  withoutSecrets,
  type HttpPolicy,
  type SecretPolicy,
  type JobApiHttpRequest,
  type JobApiHttpResponse,
  type JobApiPhase,
} from './http.js';
import {
  JobApiSpecSchema,
  firstIssue,
  originOf,
  type ExternalOutcome,
  type JobApiSpec,
  type JobApiSpecInput,
  type RequestSpec,
} from './spec.js';
import {
  PathValueError,
  declaredOnly,
  getPath,
  renderString,
  renderUrl,
  renderValue,
  type TemplateScope,
} from './template.js';

/** What the hooks are told about the request at hand. */
export interface JobApiHookInfo {
  phase: JobApiPhase;
  taskId: string;
  /** The tool's arguments: validated, and only those its `inputSchema` declares (PROTOCOL.md §23.1). */
  args: Record<string, unknown>;
  /** The external job id; absent before the submit answered. */
  id?: string;
}

/** Code where configuration is not enough. */
export interface JobApiHooks {
  /**
   * Called before every try of every request, with the request as it will be sent: return it changed (custom auth, a
   * signature over method + URL + body, a fresh token). May be async.
   */
  request?(request: JobApiHttpRequest, info: JobApiHookInfo): JobApiHttpRequest | Promise<JobApiHttpRequest>;
  /**
   * Turns a successful answer into the value that paths (`id`, `status`, `progress`, `result.path`, ...) read from.
   * Default: the JSON body (or, for `result` with `format: text`, the text). For XML, CSV, envelopes and the like.
   */
  parse?(response: JobApiHttpResponse, info: JobApiHookInfo): unknown;
  /** The fetch to use. Default: the global `fetch`. */
  fetch?: typeof fetch;
}

/**
 * Options of `defineJobApiTool`: the tool's own options (as `defineTool`, without `run`) plus the declarative job API
 * of docs/JOB-API.md and its extensions.
 */
export interface JobApiToolOptions<I extends ToolInputSchema> extends JobApiSpecInput {
  /** Tool name (MCP's rule: 1 to 128 of `A-Z a-z 0-9 _ - .`). Required. */
  name: string;
  title?: string;
  /** What the tool does, for the model. Required. */
  description: string;
  /** A zod object schema for the arguments (`{{args}}`, `{{args.NAME}}` read them). Required. */
  inputSchema: I;
  /** Default `'optional'`. */
  taskSupport?: TaskSupport;
  /**
   * Each run (one stretch of polling) is aborted with `TIMEOUT` after this, which fails the task and cancels the
   * external job; `poll.maxWaitMs` bounds the whole wait instead. Default: the gateway's cap only.
   */
  timeoutMs?: number;
  /**
   * Runs before the task fails, counting the first: an upstream unreachable for a whole retry series fails a run;
   * the next run resumes polling the same external job (never a second submit). Default `3`.
   */
  attempts?: number;
  /** Between runs (`attempts`). Default `{ type: 'exponential', delayMs: 1000, jitter: 0.5 }`. */
  backoff?: Backoff;
  /** Worker crashes survived (takeovers) before the task fails. Default `10`. */
  maxStalls?: number;
  /** At most this many runs at once across the fleet (`defineTool`'s `concurrency`, PROTOCOL.md §3.3). */
  concurrency?: ToolOptions<ToolInputSchema>['concurrency'];
  /** At most `max` starts in any `perMs` across the fleet (`defineTool`'s `rateLimit`). */
  rateLimit?: ToolOptions<ToolInputSchema>['rateLimit'];
  hooks?: JobApiHooks;
}

/**
 * A task cancelled while no run of it was active (its job waited, suspended, between two polls): what the worker
 * hands `onCancelled` when it picks the promoted job up and finds the task cancelled (PROTOCOL.md §12.10).
 */
export type CancelledTask = CancelledTaskInfo;

/** A job-API tool: a tool definition plus what stops its external job when the task is cancelled between runs. */
export type JobApiToolDefinition<I extends ToolInputSchema = ToolInputSchema> = ToolDefinition<I> & {
  /** Calls the external cancel of the task's submitted job, if it has one. Never rejects. */
  onCancelled(task: CancelledTask): Promise<void>;
};

/** What the `submit` step stores with the task: everything a later run needs to find the external job. */
export interface SubmittedJob {
  id: string;
  statusUrl?: string;
  /** When the upstream accepted it (ms since epoch), for `poll.maxWaitMs`. */
  submittedAt?: number;
}

/** One poll answer, read through the status map and paths. */
export interface PollReading {
  status: string;
  outcome: ExternalOutcome;
  progress?: number;
  total?: number;
  message?: string;
  error?: string;
  body: unknown;
}

/**
 * Defines a tool that submits a job to an HTTP job service, stores the external id with the task before it polls
 * (so a crash, restart, hand-back or retry resumes the same external job and never submits twice), reports the
 * upstream's progress, returns its result, and calls its cancel when the task is cancelled.
 *
 * @throws TypeError naming the tool and the field when an option is invalid.
 */
export function defineJobApiTool<I extends ToolInputSchema>(options: JobApiToolOptions<I>): JobApiToolDefinition<I> {
  const label = typeof options?.name === 'string' ? `defineJobApiTool(${options.name})` : 'defineJobApiTool';
  const parsed = JobApiSpecSchema.safeParse({
    headers: options.headers,
    submit: options.submit,
    poll: options.poll,
    result: options.result,
    cancel: options.cancel,
    http: options.http,
  });
  if (!parsed.success) throw new TypeError(`${label}: ${firstIssue(parsed.error)}`);
  const spec = parsed.data;
  const hooks = options.hooks ?? {};
  if (hooks.fetch === undefined && typeof fetch !== 'function') throw new TypeError(`${label}: no global fetch`);
  const secrets = secretPolicy(spec);

  const definition = defineTool({
    name: options.name,
    ...(options.title === undefined ? {} : { title: options.title }),
    description: options.description,
    inputSchema: options.inputSchema,
    taskSupport: options.taskSupport ?? 'optional',
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    attempts: options.attempts ?? 3,
    ...(options.backoff === undefined ? {} : { backoff: options.backoff }),
    ...(options.maxStalls === undefined ? {} : { maxStalls: options.maxStalls }),
    ...(options.concurrency === undefined ? {} : { concurrency: options.concurrency }),
    ...(options.rateLimit === undefined ? {} : { rateLimit: options.rateLimit }),
    run: (input: z.output<I>, ctx: ToolContext) =>
      new JobApiRun(spec, hooks, secrets, declared(input as Record<string, unknown>), ctx).run(ctx),
    onCancelled: (task: CancelledTask) => onCancelled(task),
  });
  async function onCancelled(task: CancelledTask): Promise<void> {
    const job = task.steps['submit'] as SubmittedJob | undefined;
    if (typeof job?.id !== 'string') return; // never submitted: nothing upstream to stop
    const input = options.inputSchema.safeParse(task.arguments);
    const args = declared(input.success ? input.data : task.arguments);
    const base: RunBase = { taskId: task.taskId, log: task.log, signal: new AbortController().signal };
    await new JobApiRun(spec, hooks, secrets, args, base).cancelStored(job);
  }
  /** §23.1: what the upstream may see of the arguments, read off the published schema (file or zod alike). */
  function declared(args: Record<string, unknown>): Record<string, unknown> {
    return declaredOnly(args, definition.descriptor.inputSchema);
  }
  return Object.freeze({ ...definition, onCancelled });
}

/** `SuspendedError` by name too: a tools module may carry its own copy of this package. */
function isSuspended(error: unknown): boolean {
  return error instanceof SuspendedError || (error instanceof Error && error.name === 'SuspendedError');
}

/** The reason that ends a task for good and so must stop the external job: a client cancel or a timeout. */
function endingReason(error: unknown, signal: AbortSignal): 'CLIENT_CANCELLED' | 'TIMEOUT' | undefined {
  // The step write or the suspend script can find the task cancelled before the signal aborts (a missed message).
  const reason = signal.aborted ? cancelReasonOf(signal) : error instanceof CancelledError ? error.reason : undefined;
  return reason === 'CLIENT_CANCELLED' || reason === 'TIMEOUT' ? reason : undefined;
}

/** What a run needs of its context besides polling: who it is, where to log, when to stop. */
type RunBase = Pick<ToolContext, 'taskId' | 'log' | 'signal'>;

/** One run of a job-API tool: resume or submit, then poll until the external job ends or the run suspends. */
class JobApiRun {
  private readonly scope: TemplateScope;
  private readonly policy: HttpPolicy;
  private readonly fetch: typeof fetch;
  private cancelled = false;

  constructor(
    private readonly spec: JobApiSpec,
    private readonly hooks: JobApiHooks,
    private readonly secrets: SecretPolicy,
    private readonly args: Record<string, unknown>,
    private readonly ctx: RunBase,
  ) {
    this.scope = { args, taskId: ctx.taskId };
    this.policy = spec.http;
    this.fetch = hooks.fetch ?? fetch;
  }

  async run(ctx: ToolContext): Promise<ToolResult> {
    try {
      // Stored before the first poll: every later run (resume, takeover, retry) finds it and never submits again.
      // `submit` sets scope.id as soon as the upstream answers, so a cancel seen by the step's own write still
      // reaches the external job.
      const job = await ctx.step<SubmittedJob>('submit', () => this.submit());
      this.scope.id = job.id;
      if (job.statusUrl !== undefined) this.scope.statusUrl = job.statusUrl;
      return await this.pollUntilDone(job, ctx);
    } catch (error) {
      if (isSuspended(error)) throw error;
      const reason = endingReason(error, ctx.signal);
      if (reason !== undefined) await this.cancelExternal(reason);
      throw error;
    }
  }

  /** Polls until the external job ends (its result, or its failure), suspending between polls when they are far apart. */
  private async pollUntilDone(job: SubmittedJob, ctx: ToolContext): Promise<ToolResult> {
    const { intervalMs, suspendFromMs, maxRunMs, maxWaitMs } = this.spec.poll;
    const runStartedAt = Date.now();
    for (;;) {
      ctx.throwIfCancelled();
      const reading = await this.poll();
      report(reading, ctx);
      if (reading.outcome === 'completed') return this.result(reading);
      if (reading.outcome === 'failed') {
        throw new NonRetryableError(reading.error ?? `External job ${job.id} failed (status "${reading.status}")`, {
          data: { externalId: job.id, status: reading.status },
        });
      }
      if (reading.outcome === 'cancelled') {
        throw new NonRetryableError(`External job ${job.id} was cancelled upstream (status "${reading.status}")`, {
          data: { externalId: job.id, status: reading.status },
        });
      }
      if (maxWaitMs !== undefined && job.submittedAt !== undefined && Date.now() - job.submittedAt > maxWaitMs) {
        await this.cancelExternal('TIMEOUT');
        throw new NonRetryableError(`External job ${job.id} did not end within ${maxWaitMs} ms (poll.maxWaitMs)`, {
          data: { externalId: job.id, status: reading.status },
        });
      }
      // §12.10: a long wait holds no slot; a short one waits here, and a run polls here for at most maxRunMs.
      if (intervalMs >= suspendFromMs || Date.now() - runStartedAt + intervalMs > maxRunMs) {
        await ctx.suspend({ forMs: intervalMs });
      }
      await ctx.sleep(intervalMs);
    }
  }

  // ---- requests -----------------------------------------------------------------------------------------------------

  private async submit(): Promise<SubmittedJob> {
    const { submit } = this.spec;
    const extra: Record<string, string> = {};
    if (submit.idempotencyKey !== false) {
      extra[submit.idempotencyKey === true ? 'Idempotency-Key' : submit.idempotencyKey] = this.ctx.taskId;
    }
    const withDefaultBody = submit.body === undefined && submit.method !== 'GET' && submit.method !== 'DELETE';
    // Detached: an answer on its way carries the id of a job the upstream has made; a cancel meanwhile is handled
    // once the id is stored (the poll loop sees the aborted signal and calls cancel).
    const response = await this.send('submit', { ...submit, body: withDefaultBody ? '{{args}}' : submit.body }, extra, {
      detached: true,
    });
    const value = this.parse(response, 'submit');
    const id = submit.id === undefined ? undefined : readId(submit.id, response, value);
    const statusUrl = submit.statusUrl === undefined ? undefined : readId(submit.statusUrl, response, value);
    const resolvedStatusUrl = statusUrl === undefined ? undefined : new URL(statusUrl, response.url).toString();
    const externalId = id ?? resolvedStatusUrl;
    if (externalId === undefined || externalId === '') {
      throw new NonRetryableError(
        `The submit answer has no job id at ${submit.id ?? submit.statusUrl ?? '?'}: ${excerpt(response.text)}`,
      );
    }
    this.scope.id = externalId;
    if (resolvedStatusUrl !== undefined) this.scope.statusUrl = resolvedStatusUrl;
    this.ctx.log.info(
      { externalId, statusUrl: resolvedStatusUrl && redact(resolvedStatusUrl) },
      'external job submitted',
    );
    const job: SubmittedJob = { id: externalId, submittedAt: Date.now() };
    if (resolvedStatusUrl !== undefined) job.statusUrl = resolvedStatusUrl;
    return job;
  }

  private async poll(): Promise<PollReading> {
    const { poll } = this.spec;
    const response = await this.send('poll', { ...poll, url: poll.url ?? '{{statusUrl}}' });
    const body = this.parse(response, 'poll');
    const raw = getPath(body, poll.status);
    const status = scalarText(raw);
    let outcome = Object.prototype.hasOwnProperty.call(poll.statusMap, status) ? poll.statusMap[status] : undefined;
    if (outcome === undefined) {
      // New intermediate states appear in real APIs; polling on is kinder than failing a job that is fine.
      this.ctx.log.warn(
        { externalId: this.scope.id, status, at: poll.status },
        'unmapped external status; still polling',
      );
      outcome = 'working';
    }
    const reading: PollReading = { status, outcome, body };
    const progress = poll.progress === undefined ? undefined : finite(getPath(body, poll.progress));
    const total = poll.total === undefined ? undefined : finite(getPath(body, poll.total));
    const message = poll.message === undefined ? undefined : getPath(body, poll.message);
    const error = poll.error === undefined ? undefined : getPath(body, poll.error);
    if (progress !== undefined) reading.progress = progress;
    if (total !== undefined) reading.total = total;
    if (message !== undefined && message !== null) reading.message = scalarText(message);
    if (error !== undefined && error !== null) reading.error = scalarText(error);
    return reading;
  }

  private async result(last: PollReading): Promise<ToolResult> {
    const spec = this.spec.result;
    let value: unknown;
    let text: string | undefined;
    if (spec?.url === undefined) {
      value = getPath(last.body, spec?.path ?? '.');
    } else {
      const response = await this.send('result', { ...spec, url: spec.url });
      const parsed = this.parseResult(response, spec.format);
      value = getPath(parsed, spec.path);
      if (typeof parsed === 'string' && spec.path === '.') text = parsed;
    }
    const structured =
      typeof value === 'object' && value !== null && !Array.isArray(value)
        ? (value as Record<string, unknown>)
        : { value: value ?? null };
    return {
      content: [{ type: 'text', text: text ?? (typeof value === 'string' ? value : JSON.stringify(value ?? null)) }],
      structuredContent: structured,
    };
  }

  /** The cancel of a job submitted by an earlier run (`onCancelled`). */
  async cancelStored(job: SubmittedJob): Promise<void> {
    this.scope.id = job.id;
    if (job.statusUrl !== undefined) this.scope.statusUrl = job.statusUrl;
    await this.cancelExternal('CLIENT_CANCELLED');
  }

  /** At most once per run; the run that sees the cancel is the one that calls it (PROTOCOL.md §12.10). */
  private async cancelExternal(reason: string): Promise<void> {
    const { cancel } = this.spec;
    if (this.cancelled || cancel === undefined || this.scope.id === undefined) return;
    this.cancelled = true;
    try {
      // The run's signal has aborted: this request must not be, and its retries run on regardless.
      await this.send('cancel', cancel, {}, { detached: true, ignoreAbort: true });
      this.ctx.log.info({ externalId: this.scope.id, reason }, 'external job cancelled');
    } catch (error) {
      this.ctx.log.warn({ err: error, externalId: this.scope.id, reason }, 'external cancel failed');
    }
  }

  // ---- plumbing -----------------------------------------------------------------------------------------------------

  private send(
    phase: JobApiPhase,
    spec: Pick<RequestSpec, 'method' | 'url' | 'query' | 'headers' | 'body'>,
    extraHeaders: Record<string, string> = {},
    flags: { detached?: boolean; ignoreAbort?: boolean } = {},
  ): Promise<JobApiHttpResponse> {
    const info = this.info(phase);
    return sendWithRetry({
      phase,
      policy: this.policy,
      signal: this.ctx.signal,
      fetch: this.fetch,
      secrets: this.secrets,
      ...flags,
      build: async () => {
        const request = this.build(phase, spec, extraHeaders);
        const final = this.hooks.request ? await this.hooks.request(request, info) : request;
        // §23.3: a hook may sign or add auth; none of it goes to a host the tool does not name.
        return this.secrets.trusts(final.url) ? final : withoutSecrets(final, this.secrets);
      },
      onRetry: ({ attempt, delayMs, error }) =>
        this.ctx.log.warn(
          { phase, attempt, delayMs, error, externalId: this.scope.id },
          'upstream request failed; retrying',
        ),
    });
  }

  private build(
    phase: JobApiPhase,
    spec: Pick<RequestSpec, 'method' | 'url' | 'query' | 'headers' | 'body'>,
    extraHeaders: Record<string, string>,
  ): JobApiHttpRequest {
    let url: URL;
    try {
      url = new URL(renderUrl(spec.url, this.scope));
    } catch (error) {
      if (!(error instanceof PathValueError)) throw error;
      throw new NonRetryableError(`Refused to send the ${phase} request: ${error.message}`);
    }
    // The file's query and headers are its secrets' usual places: only for a host the file names (§23.3).
    const trusted = this.secrets.trusts(url.toString());
    for (const [key, value] of Object.entries(trusted ? (spec.query ?? {}) : {})) {
      url.searchParams.append(key, typeof value === 'string' ? renderString(value, this.scope) : String(value));
    }
    const headers: Record<string, string> = { accept: 'application/json, */*;q=0.5' };
    for (const [key, value] of Object.entries(trusted ? { ...this.spec.headers, ...spec.headers } : {})) {
      headers[key.toLowerCase()] = renderString(value, this.scope);
    }
    for (const [key, value] of Object.entries(extraHeaders)) headers[key.toLowerCase()] = value;
    const request: JobApiHttpRequest = { method: spec.method, url: url.toString(), headers };
    if (spec.body !== undefined) {
      const body = renderValue(spec.body, this.scope);
      if (typeof body === 'string' && typeof spec.body === 'string' && !/^\{\{[^}]*\}\}$/.test(spec.body.trim())) {
        request.body = body;
        headers['content-type'] ??= 'text/plain; charset=utf-8';
      } else {
        request.body = JSON.stringify(body ?? null);
        headers['content-type'] ??= 'application/json';
      }
    }
    return request;
  }

  private parse(response: JobApiHttpResponse, phase: JobApiPhase): unknown {
    if (this.hooks.parse) return this.hooks.parse(response, this.info(phase));
    if (response.json === undefined && response.text.trim() !== '') {
      throw new NonRetryableError(`The ${phase} answer is not JSON: ${excerpt(response.text)}`);
    }
    return response.json;
  }

  private parseResult(response: JobApiHttpResponse, format: 'auto' | 'json' | 'text'): unknown {
    if (this.hooks.parse) return this.hooks.parse(response, this.info('result'));
    if (format === 'text') return response.text;
    if (format === 'json') return this.parse(response, 'result');
    return response.json ?? response.text;
  }

  private info(phase: JobApiPhase): JobApiHookInfo {
    const info: JobApiHookInfo = { phase, taskId: this.ctx.taskId, args: this.args };
    if (this.scope.id !== undefined) info.id = this.scope.id;
    return info;
  }
}

/** The upstream's progress as task progress; a completed job reports its total (100/100 before the result). */
function report(reading: PollReading, ctx: Pick<ToolContext, 'progress'>): void {
  if (reading.progress === undefined) return;
  if (reading.outcome === 'completed' && reading.total !== undefined) {
    ctx.progress(reading.total, reading.total, reading.message);
    return;
  }
  ctx.progress(reading.progress, reading.total, reading.message);
}

/** An id or URL from a `header:NAME` or a body path: a string or a number, else undefined. */
function readId(path: string, response: JobApiHttpResponse, body: unknown): string | undefined {
  const value = path.startsWith('header:') ? response.headers.get(path.slice('header:'.length)) : getPath(body, path);
  if (typeof value === 'string' && value !== '') return value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  return undefined;
}

/** A status or message as text: strings as they are, other values as JSON, absent as ''. */
function scalarText(value: unknown): string {
  if (value === undefined || value === null) return '';
  return typeof value === 'string' ? value : JSON.stringify(value);
}

function finite(value: unknown): number | undefined {
  const number = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  return typeof number === 'number' && Number.isFinite(number) ? number : undefined;
}

function excerpt(text: string): string {
  const line = text.replace(/\s+/g, ' ').trim();
  if (line === '') return '(empty)';
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}

/**
 * Where the tool's secrets may go (PROTOCOL.md §23.3): the hosts of the file's own URLs (a URL's host is never a
 * template) and `http.trustedHosts`; a host the upstream names (a status URL, a redirect) is not one of them unless
 * listed there.
 */
function secretPolicy(spec: JobApiSpec): SecretPolicy {
  const origins = new Set<string>();
  const hosts = new Set<string>();
  for (const url of [spec.submit.url, spec.poll.url, spec.result?.url, spec.cancel?.url]) {
    const origin = url === undefined ? undefined : originOf(url);
    if (origin !== undefined) origins.add(origin);
  }
  for (const entry of spec.http.trustedHosts) {
    if (/^https?:\/\//i.test(entry)) origins.add(new URL(entry).origin);
    else hosts.add(entry.toLowerCase());
  }
  const safeHeaders = new Set(['accept', 'content-type', 'user-agent']);
  if (spec.submit.idempotencyKey !== false) {
    safeHeaders.add(spec.submit.idempotencyKey === true ? 'idempotency-key' : spec.submit.idempotencyKey.toLowerCase());
  }
  return {
    redirects: spec.http.redirects,
    safeHeaders,
    trusts(url: string): boolean {
      try {
        const parsed = new URL(url);
        return origins.has(parsed.origin) || hosts.has(parsed.host.toLowerCase());
      } catch {
        return false;
      }
    },
  };
}

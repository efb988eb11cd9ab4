/**
 * The MCP methods, each written once (PROTOCOL.md §16): `tools/list`, `tools/call` (task start, plain call, input
 * rounds), `tasks/get`, `tasks/update`, `tasks/cancel`, `tasks/list`, `tasks/result` and `server/discover`, against
 * `TaskService` and the rendering the request chose. The two transports only build a `RequestContext` from what they
 * carry (an SDK request and its `extra` on a 2025-11-25 session, a POST on the 2026-07-28 endpoint), call the method,
 * and frame what it returns or throws. What differs between the eras is the data of `ERAS` below, not a second copy
 * of a flow.
 */
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import {
  JSON_RPC,
  TOOL_CONTROLS_META,
  TOOL_VERSION_META,
  TaskrelayError,
  firstPollInterval,
  isTerminal,
  type Logger,
  type ProgressToken,
  type TaskRecord,
} from '@taskrelay/shared';
import { capResult } from '../wire/result-cap.js';
import type { GatewayMetrics } from '../metrics/gateway-metrics.js';
import { WEBHOOK_META_KEY } from '../tasks/webhooks/url-policy.js';
import type { CatalogTool } from '../tasks/catalog.js';
import type { CallerSink, ProgressParams } from '../tasks/task-router.js';
import type { TaskService } from '../tasks/task-service.js';
import { WireError, callEndedByShutdown } from '../wire/errors.js';
import { relatedTaskMeta, renderResult, renderTask, replayLinks } from '../wire/task-wire.js';
import {
  CLIENT_CAPABILITIES_META_KEY,
  TASKS_EXTENSION_ID,
  renderCreateTaskExt,
  renderDetailedTask,
  requireTasksExtension,
  type ExtDetailedTask,
} from '../wire/task-wire-ext.js';
import type { InflightCalls } from './inflight-calls.js';
import { TaskSupportMismatchError } from '../tasks/errors.js';
import { callKind } from './call-kind.js';
import { inputRequiredResult } from './mrtr.js';
import { idempotencyKeyOf, priorityOf, START_AT_META_KEY, startAtOf, tagsOf } from './request-meta.js';
import { argumentsDigest, type RequestStateSigner } from './request-state.js';
import { notFound, type ResourceRead, type TaskResources } from './resources.js';

export type Era = '2025-11-25' | '2026-07-28';

/**
 * How a task is written on the wire for this request: the 2025-11-25 `tasks/*` rendering, or the tasks extension
 * (SEP-2663). `undefined` on an era with no rendering of its own when the request did not declare the extension: the
 * task methods then refuse it, naming the extension.
 */
export type Rendering = '2025-11-25' | 'extension' | undefined;

/** Where a 2025-11-25 task's updates go once its `CreateTaskResult` is sent: the session's GET stream. */
export interface SessionTaskRoute {
  sendProgress: (params: ProgressParams, taskId: string) => Promise<void>;
  sendStatus: (record: TaskRecord) => Promise<void>;
  sink: CallerSink;
}

/** One request as the method layer sees it, whichever transport carried it. */
export interface RequestContext {
  era: Era;
  principal: string;
  /** The 2025-11-25 session, or undefined (sessionless). */
  sessionId: string | undefined;
  /** A key that, with `requestId`, names the request on this gateway (the session id, or one per POST). */
  scope: string;
  requestId: string | number;
  rendering: Rendering;
  /** The request's `_meta`. */
  meta: Record<string, unknown> | undefined;
  /** What the client declared it can answer (`elicitation`, `sampling`): `ctx.elicit` refuses the rest. */
  clientCapabilities: string[];
  /** Aborted when the client gives the request up: `notifications/cancelled`, or a closed response stream. */
  signal: AbortSignal;
  /** Progress on the request's own stream, when it carries a progress token the transport can answer on. */
  progress?: { token: ProgressToken; send: (params: ProgressParams) => Promise<void> } | undefined;
  /** A plain call's questions and log messages on its own stream (2025-11-25; on 2026-07-28 a question ends the round). */
  sink?: CallerSink | undefined;
  /** A 2025-11-25 session's route for its tasks. */
  taskRoute?: SessionTaskRoute | undefined;
  /** The transport's own check of the call against the tool (2026-07-28: SEP-2243 `x-mcp-header`); throws to refuse. */
  checkCall?: ((tool: CatalogTool, args: Record<string, unknown>) => void) | undefined;
}

export type Result = Record<string, unknown>;

/** What each era does differently; everything else is one flow. */
interface EraRules {
  /** A plain call's question ends its round with an `InputRequiredResult` (MRTR), rather than going out on its stream. */
  inputRounds: boolean;
  /** Lists carry SEP-2549 caching hints. */
  cachingHints: boolean;
  /** `tools/list` names each tool's `execution.taskSupport` (the 2025-11-25 task negotiation). */
  listsTaskSupport: boolean;
  /** The cancel trigger a request's aborted signal stands for. */
  cancelTrigger: 'notifications/cancelled' | 'stream-closed';
}

const ERAS: Record<Era, EraRules> = {
  '2025-11-25': {
    inputRounds: false,
    cachingHints: false,
    listsTaskSupport: true,
    cancelTrigger: 'notifications/cancelled',
  },
  '2026-07-28': { inputRounds: true, cachingHints: true, listsTaskSupport: false, cancelTrigger: 'stream-closed' },
};

/** SEP-2549 caching hints: tool lists are per principal and change with the fleet, so nothing is cached. */
const NO_CACHE = { ttlMs: 0, cacheScope: 'private' } as const;

export interface ToolCallParams {
  name: string;
  arguments: Record<string, unknown>;
  /** 2025-11-25 task augmentation (`params.task`); ignored by the extension, where the server decides. */
  task?: { ttl?: number | null | undefined } | undefined;
  /** An input round's retry (MRTR, 2026-07-28): the state the last round gave, and the answers. */
  requestState?: string | undefined;
  inputResponses?: Record<string, unknown> | undefined;
}

export interface McpMethodsOptions {
  service: TaskService;
  metrics: GatewayMetrics;
  inflight: InflightCalls;
  /** Signs and verifies the `requestState` of input rounds (PROTOCOL.md §17.2). */
  requestState: RequestStateSigner;
  log: Logger;
  version: string;
  /** Largest tool result delivered, as JSON bytes (TASKRELAY_MAX_RESULT_BYTES). Default: no limit. */
  maxResultBytes?: number;
  /** Authentication on: `tasks/list` is served (requestors can be told apart). */
  authEnabled: boolean;
  /**
   * `TASKRELAY_OPERATORS`: they may ask for any priority level (PROTOCOL.md §25.1). With authentication off everyone
   * may, as everyone may use the operator pages then.
   */
  operators?: ReadonlySet<string>;
  /** How far ahead a call's `_meta["dev.taskrelay/start-at"]` may be (PROTOCOL.md §33.1). Default 30 days. */
  maxStartDelayMs?: number;
  /** Task output as resources (PROTOCOL.md §34). Without it no resource exists (every read is not-found). */
  resources?: TaskResources;
}

/** `McpMethodsOptions.maxStartDelayMs`'s default, as `TASKRELAY_MAX_START_DELAY_MS`'s. */
const DEFAULT_MAX_START_DELAY_MS = 30 * 86_400_000;

/** The versions the 2026-07-28 endpoint serves sessionless, as `server/discover` lists them. */
export const SESSIONLESS_VERSIONS = ['2026-07-28'];
const SERVER_INFO_META_KEY = 'io.modelcontextprotocol/serverInfo';

/** A wait nothing aborts (a round ends with its task, or with the request's signal, handled apart). */
const never = new AbortController().signal;

export class McpMethods {
  private readonly maxResultBytes: number;

  constructor(private readonly o: McpMethodsOptions) {
    this.maxResultBytes = o.maxResultBytes ?? Infinity;
  }

  /** `server/discover` (2026-07-28): what this endpoint serves, sessionless. */
  discover(): Result {
    return {
      supportedVersions: SESSIONLESS_VERSIONS,
      // prompts are declared because they are answered (an empty list, §14.1); resources are task output (§34).
      capabilities: {
        tools: { listChanged: true },
        prompts: {},
        resources: {},
        extensions: { [TASKS_EXTENSION_ID]: {} },
      },
      ...NO_CACHE,
      _meta: { [SERVER_INFO_META_KEY]: { name: 'taskrelay-gateway', version: this.o.version } },
    };
  }

  /**
   * `tools/list`. `execution.taskSupport` is the 2025-11-25 task negotiation: listed for that rendering only (the
   * extension replaces it with "the server decides").
   */
  async listTools(ctx: Pick<RequestContext, 'era'> & { rendering?: Rendering }): Promise<Result> {
    const rules = ERAS[ctx.era];
    const listsTaskSupport = rules.listsTaskSupport && ctx.rendering === '2025-11-25';
    const tools = (await this.o.service.listTools()).map((tool) => {
      const listed: Result = { name: tool.name, description: tool.description, inputSchema: tool.inputSchema };
      if (tool.title !== undefined) listed['title'] = tool.title;
      if (tool.outputSchema !== undefined) listed['outputSchema'] = tool.outputSchema;
      if (listsTaskSupport) listed['execution'] = { taskSupport: tool.taskSupport };
      // What controls its runs (PROTOCOL.md §3.3), for clients and `taskrelay tools`: only when something does.
      if (
        tool.paused ||
        tool.concurrency !== undefined ||
        tool.rateLimit !== undefined ||
        tool.priority !== undefined
      ) {
        const controls: Result = { paused: tool.paused };
        if (tool.priority !== undefined) controls['priority'] = tool.priority;
        if (tool.concurrency !== undefined) controls['concurrency'] = tool.concurrency;
        if (tool.concurrencyKey !== undefined) controls['concurrencyKey'] = tool.concurrencyKey;
        if (tool.rateLimit !== undefined) controls['rateLimit'] = tool.rateLimit;
        listed['_meta'] = { [TOOL_CONTROLS_META]: controls };
      }
      // The version the newest worker of the tool runs (§12.11).
      if (tool.version !== undefined)
        listed['_meta'] = { ...(listed['_meta'] as Result), [TOOL_VERSION_META]: tool.version };
      return listed;
    });
    return rules.cachingHints ? { tools, ...NO_CACHE } : { tools };
  }

  /** `prompts/list`, `resources/list`, `resources/templates/list`: taskrelay serves none, so each list is empty. */
  emptyList(field: 'prompts' | 'resources' | 'resourceTemplates', ctx: Pick<RequestContext, 'era'>): Result {
    return ERAS[ctx.era].cachingHints ? { [field]: [], ...NO_CACHE } : { [field]: [] };
  }

  unknownPrompt(name: unknown): WireError {
    return new WireError(JSON_RPC.INVALID_PARAMS, `Unknown prompt: ${String(name)}`);
  }

  unknownResource(uri: unknown): WireError {
    return notFound(uri);
  }

  /** `resources/templates/list`: the task output templates (PROTOCOL.md §34.1). */
  listResourceTemplates(ctx: Pick<RequestContext, 'era'>): Result {
    const resourceTemplates = this.o.resources?.templates() ?? [];
    return ERAS[ctx.era].cachingHints ? { resourceTemplates, ...NO_CACHE } : { resourceTemplates };
  }

  /**
   * `resources/read` (PROTOCOL.md §34.3): the task's principal only. A stored value comes back as a stream the
   * transport writes (`http/resource-body.ts`); the output inline.
   */
  async readResource(ctx: Pick<RequestContext, 'principal' | 'era'>, uri: unknown): Promise<ResourceRead> {
    if (!this.o.resources) {
      if (typeof uri !== 'string') throw new WireError(JSON_RPC.INVALID_PARAMS, 'params.uri must be a string');
      throw notFound(uri);
    }
    const read = await this.o.resources.read(ctx.principal, uri);
    return read.kind === 'inline' ? { ...read, result: { ...read.result, ...this.cachingHints(ctx) } } : read;
  }

  /** SEP-2549's caching hints on this era's results (none on 2025-11-25): task output changes, and is per principal. */
  cachingHints(ctx: Pick<RequestContext, 'era'>): Result {
    return ERAS[ctx.era].cachingHints ? { ...NO_CACHE } : {};
  }

  /** Whether a `resources/read` of `uri` is answered as a stream (the transport then takes the request itself). */
  streamsRead(uri: unknown): boolean {
    return this.o.resources?.isStreamed(uri) === true;
  }

  /** Follows a task's output (2025-11-25 `resources/subscribe`, a 2026-07-28 listen): the stop, or not-found. */
  async subscribeResource(
    ctx: Pick<RequestContext, 'principal'>,
    uri: unknown,
    onUpdated: (uri: string) => void,
  ): Promise<() => void> {
    if (!this.o.resources) throw notFound(uri);
    return this.o.resources.subscribe(ctx.principal, uri, onUpdated);
  }

  /**
   * `tools/call`: a task (CreateTaskResult in the request's rendering), a plain call (its result), or on 2026-07-28
   * an input round (`InputRequiredResult`, PROTOCOL.md §17).
   */
  async callTool(ctx: RequestContext, params: ToolCallParams): Promise<Result> {
    const { service } = this.o;
    const rules = ERAS[ctx.era];
    const { name, arguments: args } = params;
    const ext = ctx.rendering === 'extension';
    const { tool, invalid } = await service.resolveCall(name, args);
    const kind = callKind({
      extension: ext,
      inputRounds: rules.inputRounds,
      taskRequested: params.task !== undefined,
      requestState: params.requestState !== undefined,
      tool,
    });
    if (kind.kind === 'task-support-mismatch') throw new TaskSupportMismatchError(kind.message);
    ctx.checkCall?.(tool, args);
    if (kind.kind === 'task-required') throw taskRequired(name);
    const { requestState } = params;
    if (kind.kind === 'round-retry' && requestState !== undefined) {
      return this.retryRound(ctx, tool.name, argumentsDigest(args), requestState, params.inputResponses ?? {});
    }
    const asTask = kind.kind === 'task';
    const inputFirst = kind.kind === 'call' && kind.becomesTask;
    const requestedTtlMs = ext ? undefined : (params.task?.ttl ?? undefined);
    const webhook = ctx.meta?.[WEBHOOK_META_KEY];
    const base = {
      tool,
      principal: ctx.principal,
      sessionId: ctx.sessionId,
      requestedTtlMs,
      webhook,
      priority: priorityOf(ctx.meta),
      tags: tagsOf(ctx.meta),
      operator: !this.o.authEnabled || this.o.operators?.has(ctx.principal) === true,
    };
    const startAt = startAtOf(ctx.meta, this.o.maxStartDelayMs ?? DEFAULT_MAX_START_DELAY_MS);
    // A plain call's answer is its result: one that waited hours for its start would hold its request that long.
    if (startAt !== undefined && !asTask) {
      throw new TaskrelayError(
        'INVALID_ARGUMENTS',
        `_meta["${START_AT_META_KEY}"] needs a task call (params.task, or the tasks extension); this call would wait for its start`,
      );
    }

    if (invalid !== undefined) {
      // SEP-1303: a tool execution error the model can read and correct, not a JSON-RPC error.
      if (!asTask && !inputFirst) return { content: [{ type: 'text', text: invalid }], isError: true };
      return renderCreated(await service.rejectTask(base, invalid), ctx.rendering);
    }
    if (asTask) {
      const record = await service.start({
        ...base,
        args,
        mode: 'task',
        requestId: ctx.requestId,
        idempotencyKey: idempotencyKeyOf(ctx.meta),
        startAt,
        clientCapabilities: ctx.clientCapabilities,
        // The extension has no progress notifications (its statusMessage carries progress) and answers questions by
        // tasks/update; a 2025-11-25 task's updates go to the session's GET stream, its request stream being gone.
        ...(ext ? { progressToken: undefined } : { progressToken: ctx.progress?.token, ...ctx.taskRoute }),
      });
      return renderCreated(record, ctx.rendering);
    }

    // The drain is already ending calls: do not start one only to cancel it.
    if (this.o.inflight.ending) throw callEndedByShutdown();
    const record = await service.start({
      ...base,
      args,
      mode: 'call',
      requestId: ctx.requestId,
      progressToken: ctx.progress?.token,
      clientCapabilities: ctx.clientCapabilities,
      ...(ctx.progress ? { sendProgress: ctx.progress.send } : {}),
      ...(ctx.sink ? { sink: ctx.sink } : {}),
    });
    if (record.joined) return this.awaitJoined(ctx, record);
    return this.awaitCall(ctx, record, { becomesTask: inputFirst, argumentsDigest: () => argumentsDigest(args) });
  }

  /**
   * A plain call that joined an unfinished one with the same dedupe key (PROTOCOL.md §25.2): it gets that call's
   * result. Its own abort only stops its wait: the work is the first caller's too.
   */
  private async awaitJoined(ctx: RequestContext, record: TaskRecord): Promise<Result> {
    const done = await this.o.service.waitForJoined(record, ctx.signal);
    if (done.status === 'cancelled' && done.cancelReason === 'GATEWAY_SHUTDOWN') throw callEndedByShutdown();
    return capResult(renderResult(done), this.maxResultBytes);
  }

  /**
   * A plain call until it answers: its task's result, capped; on 2026-07-28 also the end of an input round. The
   * request's abort cancels the call; a draining gateway ends it with `GATEWAY_SHUTDOWN`.
   */
  private async awaitCall(
    ctx: RequestContext,
    record: TaskRecord,
    round: { becomesTask: boolean; argumentsDigest: () => string },
  ): Promise<Result> {
    const { service, inflight } = this.o;
    const rules = ERAS[ctx.era];
    const started = Date.now();
    const call = inflight.track(ctx.scope, ctx.requestId, ctx.signal, {
      shutdown: () => service.cancelCall(record, 'gateway-shutdown', 'GATEWAY_SHUTDOWN'),
    });
    const cancel = () => void service.cancelCall(record, rules.cancelTrigger);
    // The cancel may have arrived while the task was being created.
    if (call.signal.aborted) cancel();
    else call.signal.addEventListener('abort', cancel, { once: true });
    try {
      let done: TaskRecord;
      if (rules.inputRounds) {
        const asked = await service.waitForRound(record.taskId, ctx.principal, never);
        // The arguments' digest only for a round's state: a hash of every call's arguments was 2% of the gateway's
        // busy time in a plain call at C = 1 (issue 46).
        if (asked.asked) {
          return inputRequiredResult(asked.record, this.o.requestState, {
            becomesTask: round.becomesTask,
            argumentsDigest: round.argumentsDigest(),
          });
        }
        done = asked.record;
      } else {
        done = await service.waitForCall(record, never);
      }
      // Whoever ended the task first is in its record: a result that won the race with the drain still goes out.
      if (done.status === 'cancelled' && done.cancelReason === 'GATEWAY_SHUTDOWN') throw callEndedByShutdown();
      if (rules.inputRounds) {
        const missing = missingCapability(done);
        if (missing) throw missing;
      }
      this.o.metrics.callDuration.observe({ tool: record.tool }, (Date.now() - started) / 1000);
      return capResult(renderResult(done), this.maxResultBytes);
    } finally {
      call.signal.removeEventListener('abort', cancel);
      call.done();
    }
  }

  /**
   * The retry of an input round (PROTOCOL.md §17.3): the echoed `requestState` verified (its MAC in constant time, then
   * principal, tool and expiry; any failure is -32602 and changes nothing), the answers stored, then the next round.
   */
  private async retryRound(
    ctx: RequestContext,
    toolName: string,
    digest: string,
    token: string,
    responses: Record<string, unknown>,
  ): Promise<Result> {
    const { service, requestState: signer } = this.o;
    const verified = signer.verify(token, { principal: ctx.principal, tool: toolName, argumentsDigest: digest });
    if (!verified.ok) {
      this.o.log.info({ reason: verified.reason, tool: toolName }, 'requestState refused');
      throw new WireError(
        JSON_RPC.INVALID_PARAMS,
        verified.reason === 'arguments'
          ? 'Invalid requestState: it was issued for a call with other arguments; retry with the same arguments, or call again without requestState'
          : 'Invalid requestState',
      );
    }
    const { state } = verified;
    const record = await service.getCall(state.taskId, ctx.principal);
    if (!record) throw new WireError(JSON_RPC.INVALID_PARAMS, 'Invalid requestState: its call has ended or expired');
    // A call that becomes a task reports no progress (its statusMessage does).
    const progress = state.becomesTask ? undefined : ctx.progress;
    if (!isTerminal(record.status)) {
      // The retry takes the call's route before its answers resume the run: the progress the tool reports from now on
      // goes to this request's stream, on its token, on whichever replica it landed (PROTOCOL.md §17.3).
      await service.routeRetry(record, progress?.token, progress?.send);
      const { resumed } = await service.answerCall(record, responses);
      if (!resumed) {
        // Something is still pending (an answer was missing): asked again at once, with a fresh state.
        const now = await service.getCall(state.taskId, ctx.principal);
        if (now?.status === 'input_required') {
          return inputRequiredResult(now, signer, state);
        }
      } else if (state.becomesTask) {
        // The answers resumed the run: from here on it is a task the client polls (tasks-mrtr-composition).
        const task = await service.becomeTask(record, undefined);
        if (task) return renderCreateTaskExt(task);
      }
    }
    return this.awaitCall({ ...ctx, progress, sink: undefined }, record, {
      becomesTask: state.becomesTask,
      argumentsDigest: () => state.argumentsDigest,
    });
  }

  async getTask(ctx: RequestContext, taskId: string): Promise<Result> {
    const rendering = renderingFor(ctx, 'tasks/get');
    const record = await this.o.service.poll(taskId, ctx.principal);
    const result: Result = rendering === 'extension' ? this.detailedTask(record) : renderTask(record);
    const links = replayLinks(record);
    return links === undefined
      ? result
      : { ...result, _meta: { ...(result._meta as Record<string, unknown> | undefined), ...links } };
  }

  /**
   * A task in the extension's rendering, its inline result capped like every result this gateway delivers (the task
   * keeps its status): `tasks/get`, and each `notifications/tasks` of a listen stream.
   */
  detailedTask(record: TaskRecord): ExtDetailedTask {
    const detailed = renderDetailedTask(record);
    if (detailed.result === undefined) return detailed;
    const capped = capResult(detailed.result as CallToolResult, this.maxResultBytes);
    return capped === detailed.result ? detailed : { ...detailed, result: { resultType: 'complete', ...capped } };
  }

  /** The extension's answer route (PROTOCOL.md §12.3, §13): an ack, nothing more. */
  async updateTask(ctx: RequestContext, taskId: string, inputResponses: Record<string, unknown>): Promise<Result> {
    requireTasksExtension(ctx.meta, 'tasks/update');
    await this.o.service.answer(taskId, ctx.principal, inputResponses);
    return { resultType: 'complete' };
  }

  async cancelTask(ctx: RequestContext, taskId: string): Promise<Result> {
    const { service } = this.o;
    if (renderingFor(ctx, 'tasks/cancel') === '2025-11-25') {
      return renderTask(await service.cancel(taskId, ctx.principal));
    }
    // The extension's cancel is an ack, idempotent on a terminal task; an unknown task is still -32602.
    const record = await service.get(taskId, ctx.principal);
    if (!isTerminal(record.status)) {
      await service.cancel(taskId, ctx.principal).catch((error: unknown) => {
        if (!(error instanceof TaskrelayError && error.code === 'TASK_TERMINAL')) throw error;
      });
    }
    return { resultType: 'complete' };
  }

  /** `tasks/list` (2025-11-25, authentication on): the principal's own tasks, newest first. */
  async listTasks(ctx: RequestContext, cursor: string | undefined): Promise<Result> {
    // The extension has no tasks/list (SEP-2663): the same answer as on 2026-07-28, never the 2025-11-25 list.
    if (ctx.rendering === 'extension') {
      throw new WireError(JSON_RPC.METHOD_NOT_FOUND, 'Method not found: tasks/list is not part of the tasks extension');
    }
    const page = await this.o.service.list(ctx.principal, cursor);
    const tasks = page.tasks.map(renderTask);
    return page.nextCursor === undefined ? { tasks } : { tasks, nextCursor: page.nextCursor };
  }

  /**
   * `tasks/result` (2025-11-25): waits for the task's end and answers its result; the task's questions go out on this
   * request's stream meanwhile (the spec's side channel). `wait` ends the wait, not the task.
   */
  async taskResult(ctx: RequestContext, taskId: string, wait: AbortSignal): Promise<Result> {
    // The extension has no tasks/result: results are inline in tasks/get.
    if (ctx.rendering === 'extension') {
      throw new WireError(
        JSON_RPC.METHOD_NOT_FOUND,
        'Method not found: tasks/result is not part of the tasks extension; use tasks/get',
      );
    }
    const stream = ctx.sink ? { sessionId: ctx.sessionId, sink: ctx.sink } : undefined;
    const record = await this.o.service.waitForTerminal(taskId, ctx.principal, wait, stream);
    const result = capResult(renderResult(record), this.maxResultBytes);
    return { ...result, _meta: { ...result._meta, ...relatedTaskMeta(taskId) } };
  }
}

/** The rendering a task method answers in; on an era without one of its own, the extension must be declared. */
function renderingFor(ctx: RequestContext, method: string): Exclude<Rendering, undefined> {
  if (ctx.rendering === undefined) requireTasksExtension(ctx.meta, method);
  return ctx.rendering ?? 'extension';
}

/** A create's answer: it suggests the first poll's interval (PROTOCOL.md §28.2). */
function renderCreated(record: TaskRecord, rendering: Rendering): Result {
  return rendering === 'extension'
    ? renderCreateTaskExt(record)
    : { task: renderTask(record, firstPollInterval(record)) };
}

/** A task-required tool called plainly on 2026-07-28: the client lacks the extension (SEP-2575's -32021). */
function taskRequired(name: string): WireError {
  return new WireError(
    JSON_RPC.MISSING_CLIENT_CAPABILITY,
    `Tool ${name} runs only as a task: declare the ${TASKS_EXTENSION_ID} extension in _meta["${CLIENT_CAPABILITIES_META_KEY}"]`,
    { requiredCapabilities: { extensions: { [TASKS_EXTENSION_ID]: {} } } },
  );
}

/**
 * A plain call whose tool asked for something the client did not declare (`ctx.sample` without `sampling`): on
 * 2026-07-28 that is the request's -32021, naming the capability (SEP-2575), not a tool error.
 */
function missingCapability(record: TaskRecord): WireError | undefined {
  if (record.status !== 'failed' || record.error?.code !== 'CAPABILITY_MISSING') return undefined;
  const capability = record.error.data?.['capability'];
  const required = typeof capability === 'string' ? { [capability]: {} } : {};
  return new WireError(JSON_RPC.MISSING_CLIENT_CAPABILITY, record.error.message, { requiredCapabilities: required });
}

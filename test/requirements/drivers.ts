/**
 * The drivers of the requirements manifest (manifest.ts): one small uniform interface, `Driver`, over each
 * combination of transport and tasks rendering the gateway serves (docs/PROTOCOL.md §13, §14, §16):
 *
 * - `session-2025`: a 2025-11-25 session (the SDK 1.32.2 `Client`), 2025-11-25 tasks (`params.task`, `tasks/result`);
 * - `session-ext`: the same session, every request declaring the tasks extension (SEP-2663) in its `_meta`;
 * - `sessionless-ext`: the 2026-07-28 sessionless endpoint, raw JSON-RPC over fetch with its routing headers and
 *   per-request `_meta`, every request declaring the extension.
 *
 * A requirement's body is written once against `Driver`; where the eras differ by specification (the shape of a
 * created task, the cancel answer, the error of a task-only tool called plainly) the body reads `combo.rendering` or
 * `combo.transport`, never the driver's class.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { readSse } from '../helpers/raw-mcp.js';
import { waitFor } from '../helpers/wait-for.js';

/** A JSON-RPC result or params object: wire shapes are checked by the expectations. */
export type Json = Record<string, any>;

export const TASKS_EXT = 'io.modelcontextprotocol/tasks';
export const V2026 = '2026-07-28';
export const RELATED_TASK = 'io.modelcontextprotocol/related-task';

export type CombinationId = 'session-2025' | 'session-ext' | 'sessionless-ext';

export interface Combination {
  readonly id: CombinationId;
  readonly title: string;
  readonly transport: 'session' | 'sessionless';
  readonly rendering: '2025-11-25' | 'extension';
}

export const COMBINATIONS: readonly Combination[] = [
  {
    id: 'session-2025',
    title: '2025-11-25 session × 2025-11-25 tasks',
    transport: 'session',
    rendering: '2025-11-25',
  },
  {
    id: 'session-ext',
    title: '2025-11-25 session × tasks extension (SEP-2663, per-request _meta)',
    transport: 'session',
    rendering: 'extension',
  },
  {
    id: 'sessionless-ext',
    title: '2026-07-28 sessionless endpoint × tasks extension',
    transport: 'sessionless',
    rendering: 'extension',
  },
];

export interface RpcError {
  code: number;
  message: string;
  data?: unknown;
}

/** What a request got back: a result or a JSON-RPC error, and the HTTP status where the driver sees it. */
export type Answer = { ok: true; result: Json; status?: number } | { ok: false; error: RpcError; status?: number };

export interface InputRequest {
  /** The request's key: its `inputRequests` key (extension, MRTR), or its position on a session's stream. */
  key: string;
  method: string;
  params: Json;
}

/** Answers one input request (an `ElicitResult` for `elicitation/create`). */
export type Answerer = (request: InputRequest) => Json | Promise<Json>;

export interface CallOptions {
  /** Asks for progress (a progress token on the request) and receives each `notifications/progress` params. */
  onProgress?: (params: Json) => void;
  /** Answers what the tool asks. Without it a question stays unanswered (an MRTR call answers its round 1). */
  answer?: Answerer;
  /** Whether the request declares the tasks extension; default: the combination's rendering decides. */
  declareTasks?: boolean;
  /** More `_meta` for the request. */
  meta?: Json;
}

export interface CallAnswer {
  answer: Answer;
  /** The progress token the request carried, when `onProgress` asked for progress. */
  progressToken?: string | number;
  /** How many `tools/call` requests the call took (MRTR rounds on 2026-07-28; 1 elsewhere). */
  requests: number;
}

export interface Driver {
  readonly combo: Combination;
  /** Methods this combination's era removed (by the 2026-07-28 revision or by the tasks extension). */
  readonly removedMethods: readonly string[];
  /** Any request, with this combination's `_meta` (and headers). */
  request(method: string, params?: Json, options?: { declareTasks?: boolean }): Promise<Answer>;
  listTools(): Promise<Json[]>;
  /** A call as this combination's client makes it without asking for a task: answered with the tool's result. */
  call(name: string, args: Json, options?: CallOptions): Promise<CallAnswer>;
  /** A call that makes a task, as this combination's client asks for one; `taskId` once created. */
  createTask(name: string, args: Json, options?: CallOptions): Promise<{ answer: Answer; taskId: string }>;
  /** `tasks/get` in this combination's rendering. */
  getTask(taskId: string): Promise<Answer>;
  /** `tasks/cancel` in this combination's rendering. */
  cancel(taskId: string): Promise<Answer>;
  /** Polls `tasks/get` until the task has `status` (or any terminal status when `status` is 'terminal'). */
  waitStatus(taskId: string, status: string): Promise<Json>;
  /**
   * The task's outcome as a `CallToolResult`, answering its questions with `answer` on the way: `tasks/result` in
   * the 2025-11-25 rendering (questions on the session's streams), polling `tasks/get` and `tasks/update` in the
   * extension's. Rejects with the JSON-RPC error a task ended with.
   */
  taskResult(taskId: string, options?: { answer?: Answerer }): Promise<Json>;
  /**
   * Questions pushed to this client that it holds unanswered (a 2025-11-25 session's elicitation on the GET stream,
   * waiting for `taskResult`'s answerer). Always 0 where the client pulls its questions (extension, MRTR).
   */
  questionsHeld(): number;
  /** The same combination for another principal (its own client), closed with this one. */
  as(principal: string): Promise<Driver>;
  close(): Promise<void>;
}

export interface DriverTarget {
  url: string;
  /** Bearer token per principal (the gateway runs with TASKRELAY_AUTH_TOKENS). */
  tokens: Record<string, string>;
}

export async function openDriver(combo: Combination, target: DriverTarget, principal = 'alice'): Promise<Driver> {
  const token = target.tokens[principal];
  if (token === undefined) throw new Error(`no token for ${principal}`);
  return combo.transport === 'session'
    ? SessionDriver.open(combo, target, principal)
    : new SessionlessDriver(combo, target, principal);
}

const Loose = z.looseObject({});
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

function statusMatches(task: Json, status: string): boolean {
  return status === 'terminal' ? TERMINAL.has(String(task['status'])) : task['status'] === status;
}

/** The outcome of a finished extension task as a CallToolResult (a failed task's error rejects). */
function extOutcome(task: Json): Json {
  if (task['status'] === 'completed') return task['result'] as Json;
  if (task['status'] === 'failed') throw new TaskFailedError(task['error'] as RpcError);
  return { isError: true, content: [{ type: 'text', text: `Task ${String(task['status'])}` }], status: task['status'] };
}

export class TaskFailedError extends Error {
  constructor(readonly error: RpcError) {
    super(`task failed with JSON-RPC error ${error.code}: ${error.message}`);
  }
}

/** Answers each pending input request of an extension task once, by `tasks/update`. */
async function answerExtTask(
  driver: Driver,
  taskId: string,
  task: Json,
  answered: Set<string>,
  answer: Answerer,
): Promise<void> {
  const requests = (task['inputRequests'] ?? {}) as Record<string, { method: string; params: Json }>;
  const inputResponses: Json = {};
  for (const [key, request] of Object.entries(requests)) {
    if (answered.has(key)) continue;
    answered.add(key);
    inputResponses[key] = await answer({ key, method: request.method, params: request.params });
  }
  if (Object.keys(inputResponses).length === 0) return;
  const ack = await driver.request('tasks/update', { taskId, inputResponses });
  if (!ack.ok) throw new Error(`tasks/update → ${JSON.stringify(ack.error)}`);
}

async function pollExtResult(driver: Driver, taskId: string, answer: Answerer | undefined): Promise<Json> {
  const answered = new Set<string>();
  const task = await waitFor(
    async () => {
      const got = await driver.getTask(taskId);
      if (!got.ok) throw new Error(`tasks/get → ${JSON.stringify(got.error)}`);
      if (got.result['status'] === 'input_required' && answer) {
        await answerExtTask(driver, taskId, got.result, answered, answer);
      }
      return TERMINAL.has(String(got.result['status'])) ? got.result : undefined;
    },
    { timeoutMs: 20_000, intervalMs: 25, message: `task ${taskId} did not end` },
  );
  return extOutcome(task);
}

/**
 * The SDK client sets a request's progress token itself (its message id) and hands a request's `onprogress` only the
 * notifications that carry that token, without it: so a notification that reaches the handler was on the request's
 * own token. The driver puts this marker in its place, the token `call` reports, so one expectation reads both drivers.
 */
export const SDK_ROUTED = 'the-request-token (routed by the SDK)';

function sdkRouted(onProgress: (params: Json) => void): (params: Json) => void {
  return (params) => {
    onProgress({ ...params, progressToken: SDK_ROUTED });
  };
}

class SessionDriver implements Driver {
  readonly removedMethods: readonly string[];
  private answerer: Answerer | undefined;
  private asked = 0;
  private readonly others: Driver[] = [];

  private constructor(
    readonly combo: Combination,
    private readonly target: DriverTarget,
    private readonly client: Client,
  ) {
    // A 2025-11-25 session removes nothing; with the extension declared, tasks/result and tasks/list are not part
    // of it (the extension's methods are tasks/get, tasks/update and tasks/cancel).
    this.removedMethods = combo.rendering === 'extension' ? ['tasks/result', 'tasks/list'] : [];
    // A question that arrives before anyone answers (a task's, on the GET stream, before taskResult) waits for the
    // next answerer, as a user who has not looked yet: it is never answered for them.
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
      this.asked += 1;
      const question: InputRequest = {
        key: String(this.asked),
        method: request.method,
        params: request.params as Json,
      };
      const answer = this.answerer ?? (await new Promise<Answerer>((resolve) => this.waiting.push(resolve)));
      return (await answer(question)) as never;
    });
  }

  private waiting: Array<(answer: Answerer) => void> = [];

  private setAnswerer(answer: Answerer | undefined): void {
    this.answerer = answer;
    if (answer) for (const resolve of this.waiting.splice(0)) resolve(answer);
  }

  static async open(combo: Combination, target: DriverTarget, principal: string): Promise<SessionDriver> {
    const client = new Client(
      { name: `manifest-${combo.id}`, version: '0.0.0' },
      { capabilities: { elicitation: {}, tasks: { list: {}, cancel: {}, requests: {} } } },
    );
    const headers = { authorization: `Bearer ${target.tokens[principal] ?? ''}` };
    await client.connect(new StreamableHTTPClientTransport(new URL(target.url), { requestInit: { headers } }));
    return new SessionDriver(combo, target, client);
  }

  private meta(declareTasks: boolean | undefined, extra: Json = {}): Json | undefined {
    const declare = declareTasks ?? this.combo.rendering === 'extension';
    const meta: Json = { ...extra };
    if (declare) {
      meta['io.modelcontextprotocol/clientCapabilities'] = { elicitation: {}, extensions: { [TASKS_EXT]: {} } };
    }
    return Object.keys(meta).length > 0 ? meta : undefined;
  }

  private async send(
    method: string,
    params: Json,
    options: { onProgress?: (params: Json) => void; timeout?: number } = {},
  ): Promise<Answer> {
    try {
      const result = await this.client.request({ method, params } as never, Loose, {
        timeout: options.timeout ?? 20_000,
        ...(options.onProgress ? { onprogress: options.onProgress as never } : {}),
      });
      return { ok: true, result: result as Json };
    } catch (error) {
      if (error instanceof McpError) {
        return { ok: false, error: { code: error.code, message: error.message, data: error.data } };
      }
      throw error;
    }
  }

  request(method: string, params: Json = {}, options: { declareTasks?: boolean } = {}): Promise<Answer> {
    const meta = this.meta(options.declareTasks, params['_meta'] as Json | undefined);
    return this.send(method, { ...params, ...(meta ? { _meta: meta } : {}) });
  }

  async listTools(): Promise<Json[]> {
    const listed = await this.request('tools/list');
    if (!listed.ok) throw new Error(`tools/list → ${JSON.stringify(listed.error)}`);
    return listed.result['tools'] as Json[];
  }

  async call(name: string, args: Json, options: CallOptions = {}): Promise<CallAnswer> {
    const onProgress = options.onProgress;
    const progressToken = onProgress ? SDK_ROUTED : undefined;
    const meta = this.meta(options.declareTasks, options.meta);
    this.setAnswerer(options.answer);
    try {
      const answer = await this.send(
        'tools/call',
        { name, arguments: args, ...(meta ? { _meta: meta } : {}) },
        onProgress ? { onProgress: sdkRouted(onProgress) } : {},
      );
      return { answer, requests: 1, ...(progressToken !== undefined ? { progressToken } : {}) };
    } finally {
      this.setAnswerer(undefined);
    }
  }

  async createTask(name: string, args: Json, options: CallOptions = {}): Promise<{ answer: Answer; taskId: string }> {
    const meta = this.meta(undefined, options.meta);
    const params: Json = { name, arguments: args, ...(meta ? { _meta: meta } : {}) };
    if (this.combo.rendering === '2025-11-25') params['task'] = { ttl: 60_000 };
    const answer = await this.send(
      'tools/call',
      params,
      options.onProgress ? { onProgress: sdkRouted(options.onProgress) } : {},
    );
    if (!answer.ok) return { answer, taskId: '' };
    const task = (this.combo.rendering === '2025-11-25' ? answer.result['task'] : answer.result) as Json | undefined;
    return { answer, taskId: String(task?.['taskId'] ?? '') };
  }

  getTask(taskId: string): Promise<Answer> {
    return this.request('tasks/get', { taskId });
  }

  cancel(taskId: string): Promise<Answer> {
    return this.request('tasks/cancel', { taskId });
  }

  async waitStatus(taskId: string, status: string): Promise<Json> {
    return waitFor(
      async () => {
        const got = await this.getTask(taskId);
        return got.ok && statusMatches(got.result, status) ? got.result : undefined;
      },
      { timeoutMs: 20_000, intervalMs: 25, message: `task ${taskId} did not become ${status}` },
    );
  }

  async taskResult(taskId: string, options: { answer?: Answerer } = {}): Promise<Json> {
    if (this.combo.rendering === 'extension') return pollExtResult(this, taskId, options.answer);
    this.setAnswerer(options.answer);
    try {
      const got = await this.send('tasks/result', { taskId });
      if (!got.ok) throw new TaskFailedError(got.error);
      return got.result;
    } finally {
      this.setAnswerer(undefined);
    }
  }

  questionsHeld(): number {
    return this.waiting.length;
  }

  async as(principal: string): Promise<Driver> {
    const other = await SessionDriver.open(this.combo, this.target, principal);
    this.others.push(other);
    return other;
  }

  async close(): Promise<void> {
    await Promise.all(this.others.map((o) => o.close()));
    await this.client.close();
  }
}

class SessionlessDriver implements Driver {
  readonly removedMethods = [
    'initialize',
    'ping',
    'logging/setLevel',
    'resources/subscribe',
    'resources/unsubscribe',
    'tasks/result',
    'tasks/list',
  ];
  private nextId = 1;

  constructor(
    readonly combo: Combination,
    private readonly target: DriverTarget,
    private readonly principal: string,
  ) {}

  /** One 2026-07-28 POST; notifications on an SSE answer go to `onNotification`. */
  private async post(
    method: string,
    params: Json,
    options: { declareTasks?: boolean; sse?: boolean; onNotification?: (message: Json) => void } = {},
  ): Promise<Answer> {
    const declare = options.declareTasks ?? this.combo.rendering === 'extension';
    const id = this.nextId++;
    const capabilities: Json = { elicitation: {} };
    if (declare) capabilities['extensions'] = { [TASKS_EXT]: {} };
    const { _meta: extraMeta, ...rest } = params;
    const body = {
      jsonrpc: '2.0',
      id,
      method,
      params: {
        ...rest,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': V2026,
          'io.modelcontextprotocol/clientCapabilities': capabilities,
          'io.modelcontextprotocol/clientInfo': { name: `manifest-${this.combo.id}`, version: '0' },
          ...(extraMeta as Json | undefined),
        },
      },
    };
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      accept: options.sse === false ? 'application/json' : 'application/json, text/event-stream',
      'mcp-protocol-version': V2026,
      'mcp-method': method,
      authorization: `Bearer ${this.target.tokens[this.principal] ?? ''}`,
    };
    const name = method === 'tools/call' ? params['name'] : method.startsWith('tasks/') ? params['taskId'] : undefined;
    if (typeof name === 'string') headers['mcp-name'] = name;
    const res = await fetch(this.target.url, { method: 'POST', headers, body: JSON.stringify(body) });
    let message: Json | undefined;
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
      for await (const event of readSse(res)) {
        const data = event.data as Json;
        if (data['id'] === id && data['method'] === undefined) message = data;
        else if (data['method'] !== undefined) options.onNotification?.(data);
      }
    } else {
      const text = await res.text();
      message = text ? (JSON.parse(text) as Json) : undefined;
    }
    if (message === undefined) throw new Error(`${method}: no JSON-RPC answer (HTTP ${res.status})`);
    if (message['error']) return { ok: false, error: message['error'] as RpcError, status: res.status };
    return { ok: true, result: message['result'] as Json, status: res.status };
  }

  request(method: string, params: Json = {}, options: { declareTasks?: boolean } = {}): Promise<Answer> {
    return this.post(method, params, options);
  }

  async listTools(): Promise<Json[]> {
    const listed = await this.request('tools/list');
    if (!listed.ok) throw new Error(`tools/list → ${JSON.stringify(listed.error)}`);
    return listed.result['tools'] as Json[];
  }

  async call(name: string, args: Json, options: CallOptions = {}): Promise<CallAnswer> {
    const progressToken = options.onProgress ? `p-${this.principal}-${this.nextId}` : undefined;
    const onNotification = (message: Json) => {
      if (message['method'] === 'notifications/progress') options.onProgress?.(message['params'] as Json);
    };
    const params: Json = { name, arguments: args };
    const meta: Json = { ...options.meta };
    if (progressToken !== undefined) meta['progressToken'] = progressToken;
    if (Object.keys(meta).length > 0) params['_meta'] = meta;
    const sendOptions = {
      onNotification,
      ...(options.declareTasks !== undefined ? { declareTasks: options.declareTasks } : {}),
    };
    let answer = await this.post('tools/call', params, sendOptions);
    let requests = 1;
    // MRTR (SEP-2322): answer each round's input requests and retry with the echoed requestState.
    while (answer.ok && answer.result['resultType'] === 'input_required' && options.answer && requests < 10) {
      const inputRequests = answer.result['inputRequests'] as Record<string, { method: string; params: Json }>;
      const inputResponses: Json = {};
      for (const [key, request] of Object.entries(inputRequests)) {
        inputResponses[key] = await options.answer({ key, method: request.method, params: request.params });
      }
      answer = await this.post(
        'tools/call',
        { ...params, inputResponses, requestState: answer.result['requestState'] },
        sendOptions,
      );
      requests += 1;
    }
    return { answer, requests, ...(progressToken !== undefined ? { progressToken } : {}) };
  }

  async createTask(name: string, args: Json, options: CallOptions = {}): Promise<{ answer: Answer; taskId: string }> {
    const params: Json = { name, arguments: args };
    if (options.meta) params['_meta'] = options.meta;
    const answer = await this.post('tools/call', params);
    return { answer, taskId: answer.ok ? String(answer.result['taskId'] ?? '') : '' };
  }

  getTask(taskId: string): Promise<Answer> {
    return this.request('tasks/get', { taskId });
  }

  cancel(taskId: string): Promise<Answer> {
    return this.request('tasks/cancel', { taskId });
  }

  async waitStatus(taskId: string, status: string): Promise<Json> {
    return waitFor(
      async () => {
        const got = await this.getTask(taskId);
        return got.ok && statusMatches(got.result, status) ? got.result : undefined;
      },
      { timeoutMs: 20_000, intervalMs: 25, message: `task ${taskId} did not become ${status}` },
    );
  }

  taskResult(taskId: string, options: { answer?: Answerer } = {}): Promise<Json> {
    return pollExtResult(this, taskId, options.answer);
  }

  questionsHeld(): number {
    return 0;
  }

  as(principal: string): Promise<Driver> {
    return Promise.resolve(new SessionlessDriver(this.combo, this.target, principal));
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}

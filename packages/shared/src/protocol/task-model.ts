/**
 * The task model, independent of any wire format. The 2025-11-25 `tasks/*` methods and the
 * `io.modelcontextprotocol/tasks` extension are two renderings of this one stored record.
 */
export const TASK_STATUSES = ['working', 'input_required', 'completed', 'failed', 'cancelled'] as const;
export type TaskStatus = (typeof TASK_STATUSES)[number];

export const TERMINAL_STATUSES: readonly TaskStatus[] = ['completed', 'failed', 'cancelled'];

/** The state machine, as data: for each status, the statuses it may move to. */
export const TRANSITIONS: Readonly<Record<TaskStatus, readonly TaskStatus[]>> = {
  working: ['input_required', 'completed', 'failed', 'cancelled'],
  input_required: ['working', 'completed', 'failed', 'cancelled'],
  completed: [],
  failed: [],
  cancelled: [],
};

export function isTerminal(status: TaskStatus): boolean {
  return TERMINAL_STATUSES.includes(status);
}

export function canTransition(from: TaskStatus, to: TaskStatus): boolean {
  return TRANSITIONS[from].includes(to);
}

/** The statuses from which `to` may be reached: what the atomic transition script compares against. */
export function allowedSources(to: TaskStatus): TaskStatus[] {
  return TASK_STATUSES.filter((from) => canTransition(from, to));
}

/**
 * Why a running handler's signal was aborted, or why a task was cancelled. A closed set: tools may switch on it.
 * - `CLIENT_CANCELLED`: the client cancelled (tasks/cancel, notifications/cancelled, a closed stream).
 * - `TIMEOUT`: the tool ran past its `timeoutMs`.
 * - `WORKER_SHUTDOWN`: the worker is draining; the job goes back to the queue for another worker.
 * - `GATEWAY_SHUTDOWN`: the gateway holding a plain call is draining; the call is ended (tasks outlive gateways).
 * - `LOCK_LOST`: this worker lost the job's lock (stalled, Redis unreachable, taken over); another run owns the task.
 */
export const CANCEL_REASONS = [
  'CLIENT_CANCELLED',
  'TIMEOUT',
  'WORKER_SHUTDOWN',
  'GATEWAY_SHUTDOWN',
  'LOCK_LOST',
] as const;
export type CancelReason = (typeof CANCEL_REASONS)[number];

/**
 * MCP's log levels (RFC 5424 severities), least severe first: a session's `logging/setLevel` lets through its level
 * and every later one (PROTOCOL.md §15).
 */
export const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** A progress token is opaque: a string or an integer, echoed exactly as received. */
export type ProgressToken = string | number;

/** How the caller is waiting: `task` got a CreateTaskResult, `call` is a plain blocking tools/call. */
export type TaskMode = 'task' | 'call';

/** A tool result as MCP's CallToolResult, kept opaque here so shared does not depend on the SDK. */
export interface ToolResult {
  content: Array<Record<string, unknown>>;
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
  [key: string]: unknown;
}

export interface TaskRecord {
  taskId: string;
  status: TaskStatus;
  statusMessage?: string;
  createdAt: string;
  lastUpdatedAt: string;
  /** Milliseconds the task is kept after it becomes terminal. */
  ttl: number;
  pollInterval: number;
  tool: string;
  queue: string;
  principal: string;
  sessionId?: string;
  gatewayId?: string;
  mode: TaskMode;
  progressToken?: ProgressToken;
  progress?: number;
  total?: number;
  progressMessage?: string;
  result?: ToolResult;
  error?: { code: string; message: string; data?: Record<string, unknown> };
  cancelReason?: CancelReason;
  /** When the reaper fails the task if it is still not terminal (ms since epoch; PROTOCOL.md §10.2). */
  deadlineAt?: number;
  /** Runs started so far (1 on the first; a takeover after a crash is a new run). */
  attempt?: number;
  /** The version of the tool the last run ran (PROTOCOL.md §12.11). */
  toolVersion?: string | undefined;
  /** Input request numbers up to this one were cleared by a restart (§12.11): new ones number above it. */
  inputFloor?: number | undefined;
  /** The tool's durable per-task state (PROTOCOL.md §12.1). */
  state?: unknown;
  /** Results of `ctx.step`, by step name (§12.1). */
  steps?: Record<string, unknown>;
  /** Every input request the task made, by request number (§12.2); answered ones stay, for the timeline. */
  inputRequests?: Record<string, InputRequest>;
  /** The answers so far, by request number (§12.3). */
  inputResponses?: Record<string, unknown>;
  /** The requests waiting for an answer while `status` is `input_required`: their numbers as a comma list. */
  pendingInput?: string;
  /** `pendingInput` as a list. */
  pendingInputs?: string[];
  /**
   * What the caller's client can answer (`elicitation`, `sampling`, ...), as the gateway saw it at creation.
   * Undefined when the creating gateway did not record it (then nothing is refused up front).
   */
  clientCapabilities?: string[];
  /** The completion webhook the creating call named (PROTOCOL.md §27); never shown to another principal. */
  webhookUrl?: string;
  /** The task's tags (PROTOCOL.md §30.2). */
  tags?: string[];
  /** The task this one replays, and the newest task that replays this one (§30.3). */
  replayOf?: string;
  replayedBy?: string;
}

/** The shortest poll interval suggested for a young task (ms): `suggestedPollInterval`'s floor. */
export const MIN_SUGGESTED_POLL_MS = 50;

/**
 * The poll interval a create's answer suggests for a task that is not terminal (ms, PROTOCOL.md §28.2): a client that
 * waits it before its first `tasks/get` (ext-tasks does) reads after 10 ms, not 50, and that read waits for the task's
 * end until the task is `MIN_SUGGESTED_POLL_MS` old (§28.1) on the gateway that routes it. 10 ms is ext-tasks' own
 * floor (`MIN_TASK_POLL_INTERVAL_MS`).
 */
export const FIRST_POLL_MS = 10;

/** What a create's answer suggests (§28.2): `FIRST_POLL_MS`, at most the ceiling; the ceiling for a terminal task. */
export function firstPollInterval(record: TaskRecord): number {
  return isTerminal(record.status) ? record.pollInterval : Math.min(FIRST_POLL_MS, record.pollInterval);
}

/**
 * The poll interval suggested to a client for a task right now (PROTOCOL.md §28): a quarter of the task's age less
 * `MIN_SUGGESTED_POLL_MS`, at least `MIN_SUGGESTED_POLL_MS` and at most the configured `pollInterval` (its ceiling).
 * So a client that polls at the interval it was last given (the SDK's `callToolStream`) reads a task every 50 ms for
 * its first 400 ms (a short task's end is seen within 50 ms), then within about a quarter of its age, and at the
 * configured rate once it is four ceilings old. A terminal task gets the ceiling (nothing more will change). Both
 * task wire formats render it; their specs let it change.
 */
export function suggestedPollInterval(record: TaskRecord, now: number = Date.now()): number {
  const ceiling = record.pollInterval;
  if (isTerminal(record.status)) return ceiling;
  const floor = Math.min(MIN_SUGGESTED_POLL_MS, ceiling);
  const age = now - Date.parse(record.createdAt);
  if (Number.isNaN(age)) return ceiling; // no usable creation time: the configured interval
  if (age <= 0) return floor; // just created, or a clock a little ahead of ours
  return Math.min(ceiling, Math.max(floor, Math.round(age / 4 - MIN_SUGGESTED_POLL_MS)));
}

/** The methods a tool's input request becomes on the wire (§12.2). */
export const INPUT_METHODS = ['elicitation/create', 'sampling/createMessage', 'roots/list'] as const;
export type InputMethod = (typeof INPUT_METHODS)[number];

/** The client capability each input method needs (what a client declares it can answer). */
export const INPUT_CAPABILITIES: Readonly<Record<InputMethod, string>> = {
  'elicitation/create': 'elicitation',
  'sampling/createMessage': 'sampling',
  'roots/list': 'roots',
};

/** A question a task asks its client: the MCP request's method and params, kept as given. */
export interface InputRequest {
  method: InputMethod;
  params: Record<string, unknown>;
  /**
   * The tool's own name for the request (`ctx.elicit(params, { key })`): the key of `inputRequests` and
   * `inputResponses` on the 2026-07-28 wire (PROTOCOL.md §17.6). Without one the request number is the key.
   */
  key?: string;
  /**
   * Which ask of its run made it (1 for the run's first `ctx.elicit`/`sample`/`listRoots`, …): an unkeyed question is
   * matched to its stored answer by this position, a keyed one by its key, and either only while the question is the
   * same (method, key, requested schema; PROTOCOL.md §12.3). Requests stored before positions were recorded have
   * `position` = their number.
   */
  position?: number;
}

/**
 * What makes two asks the same question, whatever their wording: the method, the tool's key, and for an elicitation the
 * schema of the answer it asks for. A stored answer is handed only to the same question (PROTOCOL.md §12.3).
 */
export function questionIdentity(request: Pick<InputRequest, 'method' | 'params' | 'key'>): string {
  const schema = request.method === 'elicitation/create' ? request.params['requestedSchema'] : undefined;
  return JSON.stringify([request.method, request.key ?? null, canonical(schema ?? null)]);
}

/** `value` with every object's keys in order, so equal JSON values give equal text. */
function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, canonical((value as Record<string, unknown>)[k])]),
  );
}

/** The key of request `n` on the wire: the tool's name for it, or its number (PROTOCOL.md §17.6). */
export function inputKeyOf(n: string, request: InputRequest | undefined): string {
  return request?.key ?? n;
}

/** The most tags a task carries (PROTOCOL.md §30.2), the call's and the tool's together. */
export const MAX_TAGS = 10;
/** What a tag may be: 1 to 64 characters of letters, digits and `_.:/=@+-` (never a comma: tags are stored as a list). */
export const TAG_PATTERN = /^[A-Za-z0-9_.:/=@+-]{1,64}$/;

/** `tags` checked against the rules of §30.2: the problem in one sentence, or undefined when they are fine. */
export function tagsProblem(tags: readonly unknown[]): string | undefined {
  if (tags.length > MAX_TAGS) return `at most ${MAX_TAGS} tags; got ${tags.length}`;
  const bad = tags.find((t) => typeof t !== 'string' || !TAG_PATTERN.test(t));
  if (bad !== undefined) {
    return `each tag must be 1 to 64 characters of letters, digits and _.:/=@+-; got ${JSON.stringify(bad)}`;
  }
  return undefined;
}

/**
 * The fields of a task hash (PROTOCOL.md §1), named once. The TS side reads and writes them through these constants;
 * the Lua scripts get them as the table `F` of a generated include (scripts.ts), so a field renamed here is renamed in
 * every script.
 */
export const TASK_FIELDS = {
  taskId: 'taskId',
  status: 'status',
  statusMessage: 'statusMessage',
  createdAt: 'createdAt',
  lastUpdatedAt: 'lastUpdatedAt',
  /** Milliseconds the hash is kept after the task ends. */
  ttl: 'ttl',
  pollInterval: 'pollInterval',
  tool: 'tool',
  /** The worker pool (BullMQ queue) the task's job is in. */
  queue: 'queue',
  principal: 'principal',
  mode: 'mode',
  sessionId: 'sessionId',
  /** The gateway that routes the task's events: it holds the caller's session. */
  gatewayId: 'gatewayId',
  progressToken: 'progressToken',
  progress: 'progress',
  total: 'total',
  progressMessage: 'progressMessage',
  /** Log messages not published since the last one that was: the gateway's backlog was full (PROTOCOL.md §22.4). */
  logsDropped: 'logsDropped',
  result: 'result',
  error: 'error',
  cancelReason: 'cancelReason',
  /** When the reaper fails the task if it is still not terminal (ms since epoch). */
  deadlineAt: 'deadlineAt',
  /** Runs started so far. */
  attempt: 'attempt',
  /** The version of the tool the last run ran (PROTOCOL.md §12.11). */
  toolVersion: 'toolVersion',
  /** Set while a run backs off (`RetryAfterError`, §3.4): the next start clears it and the back-off message. */
  backOff: 'backOff',
  /** When the first run started (ISO); a task that never started frees its idempotency key when it ends. */
  startedAt: 'startedAt',
  /** The idempotency key that names this task, if any. */
  idemKey: 'idemKey',
  /** '1' when `idemKey` is a dedupe key (§25.2): freed when the task ends. */
  dedupe: 'dedupe',
  /** What the caller's client can answer, as a comma list. */
  clientCaps: 'clientCaps',
  /** The tool's durable state (JSON). */
  state: 'state',
  /** `ctx.step` results by step name (JSON). */
  steps: 'steps',
  /** The highest input request number a restart (onVersionChange, §12.11) cleared: new requests number above it. */
  inputFloor: 'inputFloor',
  /** Numbers of the input requests waiting for an answer, as a comma list. */
  pendingInput: 'pendingInput',
  /** Other gateways waiting on the task, as a comma list: each gets its status events too. */
  watchers: 'watchers',
  /** The completion webhook URL the creating call named (PROTOCOL.md §27). */
  webhook: 'webhook',
  /** The most webhook events of the task's principal that may wait for delivery at once. */
  webhookCap: 'webhookCap',
  /** Webhook events made for this task so far (each event's id ends with it). */
  webhookSeq: 'webhookSeq',
  /** The task's tags, as a comma list (PROTOCOL.md §30.2): the call's and the tool's (`ctx.tag`). */
  tags: 'tags',
  /** The task this one replays (PROTOCOL.md §30.3). */
  replayOf: 'replayOf',
  /** The newest task that replays this one. */
  replayedBy: 'replayedBy',
  /**
   * '1' once a run wrote a key that ends with the task (its output or stored values, §34, or kept log lines, §30.4):
   * the task's end looks at those keys only then (issue 46).
   */
  sideKeys: 'sideKeys',
} as const;

export type TaskField = (typeof TASK_FIELDS)[keyof typeof TASK_FIELDS];

/** Families of fields, one per input request number `n`: `input:<n>` the request, `answer:<n>` its answer. */
export const TASK_FIELD_PREFIXES = {
  input: 'input:',
  answer: 'answer:',
  /** `wp:<name>`: a waitpoint the tool opened (PROTOCOL.md §32), JSON `{token, timeoutAt, state[, completedAt, value]}`. */
  waitpoint: 'wp:',
} as const;

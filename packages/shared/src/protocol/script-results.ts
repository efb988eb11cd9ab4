/**
 * The result codes of taskrelay's Lua scripts (PROTOCOL.md §20), one enum for all of them, as BullMQ keeps its
 * `ErrorCode`. Every script answers `{code, ...values}`; the scripts get these names as the table `R` of a generated
 * include, so Lua and TS cannot disagree on a number.
 */
import { TaskrelayError } from './errors.js';

export enum ResultCode {
  /** Done as asked. */
  OK = 1,
  /** The task hash does not exist (never created, or expired). */
  TASK_MISSING = -1,
  /** The job's lock is not held with the caller's token: another run owns the task now. */
  LOCK_LOST = -2,
  /** The transition table does not allow the move from the task's status (which follows the code). */
  TRANSITION_REFUSED = -3,
  /** The task is terminal; a terminal task never changes (its status follows the code). */
  TASK_TERMINAL = -4,
  /** Progress not above the last value recorded: dropped. */
  PROGRESS_STALE = -5,
  /** No gateway holds the task's session: nobody to publish to. */
  UNROUTED = -6,
  /** The input request is not pending: answered already, never asked, or the task moved on (its status follows). */
  INPUT_NOT_PENDING = -7,
  /** A task with this id exists already. */
  TASK_EXISTS = -8,
  /** The idempotency key names a live task of the principal: nothing created (its id and tool follow). */
  IDEMPOTENT_REPLAY = -9,
  /** Another process holds the reaper lease. */
  LEASE_HELD = -10,
  /** A batch child's outcome is recorded already (PROTOCOL.md §26.3): this run records nothing. */
  OUTCOME_RECORDED = -11,
  /** The batch exists already (a replay of the parent): nothing written. */
  BATCH_EXISTS = -12,
  /** The principal is at its open-work cap (PROTOCOL.md §25): nothing created (how many are open follows). */
  OPEN_CAP = -13,
  /** The task records another version of its tool (PROTOCOL.md §12.11): the run did not start (the version follows). */
  VERSION_OTHER = -14,
  /** A per-key or shared limit has no room now (PROTOCOL.md §3.5): the wait in ms follows. */
  LIMIT_FULL = -15,
  /** No waitpoint of the task with that token (PROTOCOL.md §32.4). */
  WAITPOINT_UNKNOWN = -16,
  /** The waitpoint was called already: single use. */
  WAITPOINT_USED = -17,
  /** The waitpoint timed out before it was called. */
  WAITPOINT_EXPIRED = -18,
  /** The gateway's channel backlog is full (PROTOCOL.md §22.4): the message was not published. */
  CHANNEL_FULL = -19,
}

/** The codes as a Lua table (`R.OK`, `R.LOCK_LOST`, ...), for the generated include. */
export function resultCodesLua(): string {
  const entries = Object.entries(ResultCode)
    .filter(([, value]) => typeof value === 'number')
    .map(([name, value]) => `${name} = ${String(value)}`);
  return `local R = {${entries.join(', ')}}\n`;
}

/** One decoded script reply: its code, and what followed it. */
export interface ScriptReply {
  code: ResultCode;
  values: unknown[];
}

/**
 * The one mapper from a script's raw reply to a `ScriptReply`: refuses (as an INTERNAL error) a reply that is not a
 * list starting with one of the codes the script declares, so a script and its caller that disagree fail loudly at
 * the first call instead of being read as some other outcome.
 */
export function decodeReply(script: string, expected: readonly ResultCode[], raw: unknown): ScriptReply {
  const list = Array.isArray(raw) ? (raw as unknown[]) : undefined;
  const code = list?.[0];
  if (typeof code !== 'number' || !expected.includes(code)) {
    throw new TaskrelayError(
      'INTERNAL',
      `Lua script ${script} answered ${describe(code)}, not one of its codes (${expected.map((c) => ResultCode[c]).join(', ')})`,
    );
  }
  return { code: code, values: list?.slice(1) ?? [] };
}

function describe(code: unknown): string {
  if (typeof code === 'number') return `code ${code}${ResultCode[code] ? ` (${ResultCode[code]})` : ''}`;
  return code === undefined ? 'nothing' : JSON.stringify(code);
}

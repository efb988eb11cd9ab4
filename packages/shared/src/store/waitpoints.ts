import { TaskrelayError } from '../protocol/errors.js';
import { parseMessage } from '../protocol/messages.js';
import { ResultCode } from '../protocol/script-results.js';
import { SCRIPTS } from '../protocol/scripts.js';
import { TASK_FIELD_PREFIXES } from '../protocol/task-fields.js';
import { WaitpointRecordSchema, type WaitpointRecord } from '../waitpoints.js';
import type { JobLock } from './runs.js';
import type { StoreRunner } from './store-runner.js';

/** A task's waitpoints as its hash keeps them (PROTOCOL.md §32): opened by a run, resolved by a URL's caller. */
export class Waitpoints {
  constructor(private readonly runner: StoreRunner) {}

  /**
   * Opens waitpoint `name` of a running task (PROTOCOL.md §32.1), lock-checked: the stored one when an earlier run
   * opened it (ended as `timedOut` here once past its time), else a new one with `token` that waits `timeoutMs`.
   */
  async open(
    taskId: string,
    lock: JobLock,
    name: string,
    token: string,
    timeoutMs: number,
  ): Promise<{ ok: true; record: WaitpointRecord } | { ok: false; reason: 'gone' | 'lock_lost' }> {
    const reply = await this.runner.call(SCRIPTS.waitpointOpen, {
      keys: {
        task: this.runner.forTask(taskId).task(taskId),
        lock: this.runner.forTask(taskId).bullJobLock(lock.queue, taskId),
      },
      args: { lockToken: lock.token, field: `${TASK_FIELD_PREFIXES.waitpoint}${name}`, token, timeoutMs },
    });
    if (reply.code === ResultCode.LOCK_LOST) return { ok: false, reason: 'lock_lost' };
    if (reply.code !== ResultCode.OK) return { ok: false, reason: 'gone' };
    const record = parseMessage(WaitpointRecordSchema, String(reply.values[0]));
    if (!record) throw new TaskrelayError('INTERNAL', `waitpoint ${name} of task ${taskId} is not a waitpoint record`);
    return { ok: true, record };
  }

  /** Waitpoint `name` of a task as stored, if any. */
  async read(taskId: string, name: string): Promise<WaitpointRecord | undefined> {
    const raw = await this.runner.redis.hget(
      this.runner.forTask(taskId).task(taskId),
      `${TASK_FIELD_PREFIXES.waitpoint}${name}`,
    );
    return raw === null ? undefined : parseMessage(WaitpointRecordSchema, raw);
  }

  /**
   * A waitpoint's URL was called with `value` (JSON text the caller checked; PROTOCOL.md §32.4). `queue`, when
   * stored: the task's job queue, whose delayed job the caller promotes.
   */
  async resolve(
    taskId: string,
    name: string,
    token: string,
    value: string,
  ): Promise<{ ok: true; queue: string } | { ok: false; reason: 'gone' | 'ended' | 'unknown' | 'used' | 'expired' }> {
    const reply = await this.runner.call(SCRIPTS.waitpointResolve, {
      keys: { task: this.runner.forTask(taskId).task(taskId) },
      args: { field: `${TASK_FIELD_PREFIXES.waitpoint}${name}`, token, value },
    });
    switch (reply.code) {
      case ResultCode.OK:
        return { ok: true, queue: typeof reply.values[0] === 'string' ? reply.values[0] : '' };
      case ResultCode.TASK_TERMINAL:
        return { ok: false, reason: 'ended' };
      case ResultCode.WAITPOINT_UNKNOWN:
        return { ok: false, reason: 'unknown' };
      case ResultCode.WAITPOINT_USED:
        return { ok: false, reason: 'used' };
      case ResultCode.WAITPOINT_EXPIRED:
        return { ok: false, reason: 'expired' };
      default:
        return { ok: false, reason: 'gone' };
    }
  }
}

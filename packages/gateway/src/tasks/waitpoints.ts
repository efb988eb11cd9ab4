/**
 * The callback side of waitpoints (PROTOCOL.md §32.4): a POST to a waitpoint's URL stores its body as the waitpoint's
 * value, once, and promotes the task's suspended job so a worker resumes the tool at once.
 */
import type { Logger, WaitpointTokens, Waitpoints } from '@taskrelay/shared';
import type { JobDispatcher } from './job-dispatcher.js';

/** How a callback ended; never anything about the task itself. */
export type WaitpointCallbackOutcome = 'accepted' | 'unknown' | 'used' | 'expired';

export class WaitpointCallbacks {
  constructor(
    private readonly tokens: WaitpointTokens,
    private readonly store: Pick<Waitpoints, 'resolve'>,
    private readonly dispatcher: Pick<JobDispatcher, 'promote'>,
    private readonly log: Logger,
  ) {}

  /** `value`: the body as JSON text, already parsed once by the caller (so it is JSON, and bounded). */
  async call(token: string, value: string): Promise<WaitpointCallbackOutcome> {
    // A token this deployment did not seal is refused before Redis is asked.
    const sealed = await this.tokens.open(token);
    if (!sealed) return 'unknown';
    const outcome = await this.store.resolve(sealed.taskId, sealed.name, token, value);
    if (!outcome.ok) {
      this.log.debug({ taskId: sealed.taskId, waitpoint: sealed.name, reason: outcome.reason }, 'waitpoint refused');
      if (outcome.reason === 'gone' || outcome.reason === 'unknown') return 'unknown';
      return outcome.reason === 'used' ? 'used' : 'expired';
    }
    this.log.info({ taskId: sealed.taskId, waitpoint: sealed.name }, 'waitpoint called; resuming the task');
    // Refused while the run is still active (it promotes itself after suspending, §32.3).
    await this.dispatcher.promote(sealed.taskId, outcome.queue);
    return 'accepted';
  }
}

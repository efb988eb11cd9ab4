/**
 * The creation-time checks of a task's webhook (PROTOCOL.md §27.1), run by the task service before anything is
 * stored: a refusal is a JSON-RPC error naming the reason, and no task exists.
 */
import type { TaskMode, WebhookOutbox } from '@taskrelay/shared';
import {
  PendingWebhooksCapError,
  WEBHOOK_META_KEY,
  WebhookLookupError,
  WebhookRefusedError,
  type WebhookPolicy,
} from './url-policy.js';

/** What the task store keeps with the task: the URL and the principal's pending cap. */
export interface AcceptedWebhook {
  url: string;
  cap: number;
}

export class WebhookIntake {
  constructor(
    private readonly policy: WebhookPolicy,
    private readonly outbox: Pick<WebhookOutbox, 'pendingFor'>,
    /** Events of one principal that may wait for delivery at once (`TASKRELAY_WEBHOOK_MAX_PENDING`). */
    private readonly maxPending: number,
  ) {}

  /**
   * `value` is the request's `_meta["dev.taskrelay/webhook"]` as sent (undefined when absent).
   * @throws WebhookRefusedError naming the reason, or PendingWebhooksCapError when the principal's cap is reached.
   */
  async accept(value: unknown, mode: TaskMode, principal: string): Promise<AcceptedWebhook | undefined> {
    if (value === undefined) return undefined;
    const raw = this.policy.urlOf({ [WEBHOOK_META_KEY]: value });
    if (raw === undefined) return undefined;
    if (mode !== 'task') {
      throw new WebhookRefusedError(
        'webhooks are sent for tasks only; this call does not create a task (send params.task, or declare the tasks extension)',
      );
    }
    try {
      await this.policy.check(raw);
    } catch (error) {
      // A name that does not resolve now is far more often a typo than a passing outage: say so before any task.
      if (error instanceof WebhookLookupError) throw new WebhookRefusedError(error.message);
      throw error;
    }
    const held = await this.outbox.pendingFor(principal);
    if (held >= this.maxPending) {
      throw new PendingWebhooksCapError(
        `Too many pending webhook deliveries: this principal has ${held} events not yet delivered (at most ${this.maxPending}); wait for them or fix the receiver`,
      );
    }
    return { url: raw, cap: this.maxPending };
  }
}

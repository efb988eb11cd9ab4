/**
 * The gateway's side of the webhook outbox (PROTOCOL.md §27.2, §27.3, §27.5): the store lives in `@taskrelay/shared`
 * with the other Lua-backed stores (`webhook-outbox.ts`, scripts `webhookClaim-1` and `webhookSettle-3`).
 */
export {
  WEBHOOK_DEAD_LETTERS_KEPT as DEAD_LETTERS_KEPT,
  WebhookOutbox,
  OutboxEventSchema,
  DeadLetterSchema,
  type ClaimFairness,
  type Claimed,
  type DeadLetter,
  type OutboxEvent,
  type Settlement,
} from '@taskrelay/shared';

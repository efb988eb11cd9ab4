/**
 * The webhook outbox's vocabulary (PROTOCOL.md §27) that the Lua scripts share with the TS side: the fields of an event
 * hash and the outbox's bounds. The scripts get them as the generated include `webhookLimits` (scripts.ts): `W.<name>`
 * for a field, `WEBHOOK_DEAD_LETTERS_KEPT` for the bound, so no script restates a name or a number.
 */

/** The fields of one outbox event's hash (`<prefix>:webhook:event:<id>`). */
export const WEBHOOK_EVENT_FIELDS = {
  id: 'id',
  taskId: 'taskId',
  principal: 'principal',
  url: 'url',
  status: 'status',
  statusMessage: 'statusMessage',
  timestamp: 'timestamp',
  /** Tries so far. */
  attempts: 'attempts',
  /** The try that holds the event: `<gateway>:<try>`, or empty between tries. */
  lease: 'lease',
  /** When the event was appended (ms, Redis time). */
  createdAt: 'createdAt',
  /** Why the last try failed. */
  lastError: 'lastError',
} as const;

/** Dead letters kept, newest first; older ones are dropped. */
export const WEBHOOK_DEAD_LETTERS_KEPT = 1_000;

/** The `webhookLimits` include. */
export function webhookLimitsLua(): string {
  const fields = Object.entries(WEBHOOK_EVENT_FIELDS).map(([k, v]) => `${k} = '${v}'`);
  return `local W = {${fields.join(', ')}}\nlocal WEBHOOK_DEAD_LETTERS_KEPT = ${WEBHOOK_DEAD_LETTERS_KEPT}\n`;
}

/**
 * Standard Webhooks signatures (PROTOCOL.md §27.4): `webhook-signature: v1,<base64 HMAC-SHA256(key,
 * "<id>.<timestamp>.<body>")>`, made by the `standardwebhooks` package, so a receiver verifying with it (or any other
 * Standard Webhooks library) agrees byte for byte.
 */
import { Webhook } from 'standardwebhooks';

const SECRET_PREFIX = 'whsec_';

/**
 * The signing key of `TASKRELAY_WEBHOOK_SECRET`: the base64-decoded rest after a `whsec_` prefix (the form Standard
 * Webhooks libraries print), otherwise the UTF-8 bytes of the value. The package's own string form would read a
 * plain secret as base64 and its "raw" form as Latin-1, so the bytes are made here and handed over raw.
 */
export function webhookKey(secret: string): Uint8Array {
  const key = secret.startsWith(SECRET_PREFIX)
    ? Buffer.from(secret.slice(SECRET_PREFIX.length), 'base64')
    : Buffer.from(secret, 'utf8');
  if (key.length === 0) throw new RangeError('TASKRELAY_WEBHOOK_SECRET gives an empty key');
  return new Uint8Array(key);
}

/** The three Standard Webhooks headers of one try. */
export interface SignedHeaders {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
}

export class WebhookSigner {
  private readonly webhook: Webhook;

  constructor(secret: string) {
    this.webhook = new Webhook(webhookKey(secret), { format: 'raw' });
  }

  /** Headers for one try of event `id` with `body`, timestamped `at` (Unix seconds on the wire). */
  sign(id: string, body: string, at: Date = new Date()): SignedHeaders {
    return {
      'webhook-id': id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': this.webhook.sign(id, at, body),
    };
  }
}

import { describe, expect, it } from 'vitest';
import { Webhook, WebhookVerificationError } from 'standardwebhooks';
import { createHmac } from 'node:crypto';
import { WebhookSigner, webhookKey } from '../src/tasks/webhooks/signer.js';

const body = JSON.stringify({
  type: 'task.status',
  taskId: 't1',
  status: 'completed',
  timestamp: '2026-01-01T00:00:00Z',
});

describe('§27.4 webhook signatures (Standard Webhooks)', () => {
  it('a whsec_ secret signs so that a stock Standard Webhooks receiver verifies it', () => {
    const secret = 'whsec_' + Buffer.from('a 32-byte key for the test suite').toString('base64');
    const headers = new WebhookSigner(secret).sign('msg_t1_1', body);
    expect(headers['webhook-id']).toBe('msg_t1_1');
    expect(headers['webhook-timestamp']).toMatch(/^\d{10}$/);
    expect(headers['webhook-signature']).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
    expect(new Webhook(secret).verify(body, { ...headers })).toEqual(JSON.parse(body));
  });

  it('a plain secret keys the HMAC with its UTF-8 bytes, non-ASCII included', () => {
    const secret = 'geheimnis-ß-密钥';
    const at = new Date('2026-12-01T10:00:00Z');
    const headers = new WebhookSigner(secret).sign('msg_x_2', body, at);
    const expected = createHmac('sha256', Buffer.from(secret, 'utf8'))
      .update(`msg_x_2.${Math.floor(at.getTime() / 1000)}.${body}`)
      .digest('base64');
    expect(headers['webhook-signature']).toBe(`v1,${expected}`);
    expect(headers['webhook-timestamp']).toBe(String(Math.floor(at.getTime() / 1000)));
  });

  it('a receiver with another key, or a changed body, rejects the signature', () => {
    const headers = new WebhookSigner('right-secret').sign('msg_a_1', body);
    const receiver = new Webhook(webhookKey('wrong-secret'), { format: 'raw' });
    expect(() => receiver.verify(body, { ...headers })).toThrow(WebhookVerificationError);
    const right = new Webhook(webhookKey('right-secret'), { format: 'raw' });
    expect(() => right.verify(body.replace('completed', 'failed'), { ...headers })).toThrow(WebhookVerificationError);
    expect(right.verify(body, { ...headers })).toEqual(JSON.parse(body));
  });

  it('an empty key is refused', () => {
    expect(() => webhookKey('whsec_')).toThrow(RangeError);
  });
});

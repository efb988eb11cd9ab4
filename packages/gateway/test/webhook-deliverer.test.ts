import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { startWebhookReceiver, type WebhookReceiver } from '../../../test/helpers/webhook-receiver.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { postOnce, retryDelayMs, settlementOf, eventBody } from '../src/tasks/webhooks/deliverer.js';
import { WebhookSigner } from '../src/tasks/webhooks/signer.js';

const SECRET = 'unit-test-secret';
const policy = { maxAttempts: 5, retryBaseMs: 1_000, retryMaxMs: 60_000 };
const body = eventBody({ taskId: 't1', status: 'completed', timestamp: '2026-12-01T00:00:00.000Z' });
const headers = () => new WebhookSigner(SECRET).sign('msg_t1_1', body);

const receivers: WebhookReceiver[] = [];
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(receivers.splice(0).map((r) => r.close()));
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    s.close();
  }
});

async function receiver(): Promise<WebhookReceiver> {
  const r = await startWebhookReceiver(SECRET);
  receivers.push(r);
  return r;
}

describe('§27.5 what an answer decides', () => {
  const mid = () => 0.5;
  it('2xx delivers, 410 stops, 408/425/429/5xx retry, other 3xx/4xx dead-letter at once', () => {
    for (const status of [200, 201, 204, 299])
      expect(settlementOf({ kind: 'answer', status }, 1, policy)).toEqual({ outcome: 'delivered' });
    expect(settlementOf({ kind: 'answer', status: 410 }, 1, policy)).toEqual({ outcome: 'gone' });
    for (const status of [408, 425, 429, 500, 502, 503, 504]) {
      expect(settlementOf({ kind: 'answer', status }, 1, policy, mid)).toMatchObject({ outcome: 'retry' });
    }
    for (const status of [301, 302, 307, 308]) {
      expect(settlementOf({ kind: 'answer', status }, 1, policy)).toEqual({
        outcome: 'dead',
        reason: `the receiver answered ${status} (redirects are not followed)`,
      });
    }
    for (const status of [400, 401, 403, 404, 413, 422]) {
      expect(settlementOf({ kind: 'answer', status }, 1, policy)).toMatchObject({
        outcome: 'dead',
        reason: expect.stringMatching(/only 408, 425, 429 and 5xx answers are retried/),
      });
    }
    expect(
      settlementOf({ kind: 'error', message: 'could not reach the receiver (ECONNREFUSED)' }, 2, policy, mid),
    ).toEqual({
      outcome: 'retry',
      delayMs: 1_500,
      reason: 'could not reach the receiver (ECONNREFUSED)',
    });
  });

  it('the last try that fails dead-letters the event', () => {
    expect(settlementOf({ kind: 'answer', status: 500 }, 5, policy)).toEqual({
      outcome: 'dead',
      reason: 'gave up after 5 tries; the last: the receiver answered 500',
    });
  });

  it('backs off exponentially between half and all of the step, capped, and honours a longer Retry-After', () => {
    expect(retryDelayMs(1, policy, () => 0)).toBe(500);
    expect(retryDelayMs(1, policy, () => 1)).toBe(1_000);
    expect(retryDelayMs(4, policy, () => 1)).toBe(8_000);
    expect(retryDelayMs(30, policy, () => 1)).toBe(60_000);
    expect(settlementOf({ kind: 'answer', status: 429, retryAfterMs: 20_000 }, 1, policy, () => 1)).toMatchObject({
      delayMs: 20_000,
    });
    expect(settlementOf({ kind: 'answer', status: 503, retryAfterMs: 3_600_000 }, 1, policy, () => 1)).toMatchObject({
      delayMs: 60_000,
    });
  });

  it('the body is the contract shape, no result, a long message cut', () => {
    expect(
      JSON.parse(eventBody({ taskId: 't', status: 'failed', statusMessage: 'x'.repeat(5_000), timestamp: 'T' })),
    ).toEqual({
      type: 'task.status',
      taskId: 't',
      status: 'failed',
      statusMessage: 'x'.repeat(1_024),
      timestamp: 'T',
    });
    expect(Object.keys(JSON.parse(body))).toEqual(['type', 'taskId', 'status', 'timestamp']);
  });
});

describe('§27.4 one try', () => {
  it('connects to the checked address only: a name that no DNS knows still reaches the pinned address', async () => {
    const r = await receiver();
    const url = new URL(`http://hooks.rebinding.invalid:${r.port}/hook`);
    const result = await postOnce({ url, address: '127.0.0.1', family: 4 }, headers(), body, {
      timeoutMs: 5_000,
      userAgent: 'test',
    });
    expect(result).toEqual({ kind: 'answer', status: 200 });
    expect(r.received).toHaveLength(1);
    expect(r.received[0]).toMatchObject({ verified: true, id: 'msg_t1_1', body, path: '/hook' });
    expect(r.received[0]!.headers['host']).toBe(`hooks.rebinding.invalid:${r.port}`);
    expect(r.received[0]!.headers['content-type']).toBe('application/json');
  });

  it('follows no redirect', async () => {
    const target = await receiver();
    const redirecting = await receiver();
    redirecting.answer(() => ({ status: 307, headers: { location: `${target.origin}/elsewhere` } }));
    const url = new URL(`${redirecting.origin}/hook`);
    const result = await postOnce({ url, address: '127.0.0.1', family: 4 }, headers(), body, {
      timeoutMs: 5_000,
      userAgent: 'test',
    });
    expect(result).toEqual({ kind: 'answer', status: 307 });
    expect(redirecting.received).toHaveLength(1);
    expect(target.received).toHaveLength(0);
  });

  it('a receiver that never answers ends the try at the timeout', async () => {
    const r = await receiver();
    r.answer(() => 'hang');
    const url = new URL(`${r.origin}/hook`);
    const result = await postOnce({ url, address: '127.0.0.1', family: 4 }, headers(), body, {
      timeoutMs: 300,
      userAgent: 'test',
    });
    expect(result).toEqual({ kind: 'error', message: 'no answer within 300 ms' });
  });

  it('a refused connection is an error to retry', async () => {
    const r = await receiver();
    const url = new URL(`${r.origin}/hook`);
    await r.close();
    receivers.splice(receivers.indexOf(r), 1);
    const result = await postOnce({ url, address: '127.0.0.1', family: 4 }, headers(), body, {
      timeoutMs: 2_000,
      userAgent: 'test',
    });
    expect(result).toEqual({ kind: 'error', message: 'could not reach the receiver (ECONNREFUSED)' });
  });

  it('reads at most 64 KiB of an endless answer, then closes the connection', async () => {
    let closed = false;
    let sent = 0;
    const server = createServer((_req, res) => {
      res.writeHead(200);
      const chunk = Buffer.alloc(16 * 1024, 'x');
      const pump = setInterval(() => {
        if (res.destroyed) return;
        res.write(chunk);
        sent += chunk.length;
      }, 1);
      res.on('close', () => {
        closed = true;
        clearInterval(pump);
      });
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`);
    const result = await postOnce({ url, address: '127.0.0.1', family: 4 }, headers(), body, {
      timeoutMs: 5_000,
      userAgent: 'test',
    });
    expect(result).toEqual({ kind: 'answer', status: 200 });
    await waitFor(() => closed, { timeoutMs: 5_000, message: 'the endless answer was never cut off' });
    expect(sent).toBeLessThan(4 * 1024 * 1024);
  });
});

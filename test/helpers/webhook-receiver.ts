/**
 * A loopback webhook receiver for the completion-webhook tests (PROTOCOL.md §27): records every POST, verifies its
 * Standard Webhooks signature with the stock `standardwebhooks` package, and answers as the test scripts it (a status,
 * a redirect, or no answer at all).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

export interface ReceivedWebhook {
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  /** The body parsed, when it is JSON. */
  event: Record<string, unknown> | undefined;
  /** The signature verified against the receiver's key (and the timestamp within 5 minutes). */
  verified: boolean;
  headers: IncomingMessage['headers'];
  path: string;
}

/** What the receiver does with request number `n` (1-based, over all requests). */
/**
 * How a request is answered: a status (with headers), `hang` (no answer at all), or `stall-body` (the status line and
 * headers, a first chunk of body, then nothing: the receiver that once kept a socket per try open).
 */
export type Answer = number | { status: number; headers?: Record<string, string> } | 'hang' | 'stall-body';

export interface WebhookReceiver {
  /** `http://127.0.0.1:<port>` */
  readonly origin: string;
  readonly port: number;
  readonly received: ReceivedWebhook[];
  /** Sets how the next requests are answered (default 200). */
  answer(fn: (n: number, hook: ReceivedWebhook) => Answer): void;
  /** Answers every request left hanging with `status`. */
  release(status?: number): void;
  /** Connections open to the receiver now. */
  openConnections(): Promise<number>;
  close(): Promise<void>;
}

/** `key` is what the gateway signs with: a `whsec_` secret as is, or a plain secret (its UTF-8 bytes). */
export async function startWebhookReceiver(secret: string): Promise<WebhookReceiver> {
  const verifier = secret.startsWith('whsec_')
    ? new Webhook(secret)
    : new Webhook(new Uint8Array(Buffer.from(secret, 'utf8')), { format: 'raw' });
  const received: ReceivedWebhook[] = [];
  const hanging = new Set<ServerResponse>();
  let answerFn: (n: number, hook: ReceivedWebhook) => Answer = () => 200;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const header = (name: string) => String(req.headers[name] ?? '');
      let verified: boolean;
      try {
        verifier.verify(body, {
          'webhook-id': header('webhook-id'),
          'webhook-timestamp': header('webhook-timestamp'),
          'webhook-signature': header('webhook-signature'),
        });
        verified = true;
      } catch {
        verified = false;
      }
      let event: Record<string, unknown> | undefined;
      try {
        event = JSON.parse(body) as Record<string, unknown>;
      } catch {
        event = undefined;
      }
      const hook: ReceivedWebhook = {
        id: header('webhook-id'),
        timestamp: header('webhook-timestamp'),
        signature: header('webhook-signature'),
        body,
        event,
        verified,
        headers: req.headers,
        path: req.url ?? '',
      };
      received.push(hook);
      const answer = answerFn(received.length, hook);
      if (answer === 'hang' || answer === 'stall-body') {
        hanging.add(res);
        res.on('close', () => hanging.delete(res));
        if (answer === 'stall-body') res.writeHead(200, { 'content-length': '1000' }).write('the rest never comes');
        return;
      }
      const { status, headers } = typeof answer === 'number' ? { status: answer, headers: {} } : answer;
      res.writeHead(status, headers).end(status >= 200 && status < 300 ? 'ok' : `answered ${status}`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    origin: `http://127.0.0.1:${port}`,
    port,
    received,
    answer: (fn) => {
      answerFn = fn;
    },
    openConnections: () =>
      new Promise<number>((resolve, reject) => server.getConnections((e, n) => (e ? reject(e) : resolve(n)))),
    release: (status = 200) => {
      for (const res of hanging) if (!res.headersSent) res.writeHead(status).end();
      hanging.clear();
    },
    close: async () => {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

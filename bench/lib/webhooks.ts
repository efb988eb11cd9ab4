/**
 * `pnpm bench --webhooks`: webhook fairness under hanging receivers (PROTOCOL.md §27.3, issue 48 F1). One gateway's
 * deliverer, in process, with the default settings (16 slots, 10 s try timeout, 500 ms poll, 2 s first backoff step),
 * against loopback receivers. For 1, 4 and 16 principals whose receivers never answer (40 events each, all due):
 * - cold: dave's event is due behind all of theirs when delivery starts, so their first tries (to receivers never
 *   seen to fail) are all under way; the time until his receiver has it;
 * - warm: 12 s later (their first tries have timed out and their receivers are suspected), dave's second event; the
 *   time from its status change until his receiver has it.
 * Also the hanging receivers' POSTs over the run: what the circuits left them.
 */
import { TaskStore, WebhookOutbox, createKeys, createLogger } from '@taskrelay/shared';
import { Redis } from 'ioredis';
import { GatewayMetrics } from '../../packages/gateway/src/metrics/gateway-metrics.js';
import { WebhookDeliverer } from '../../packages/gateway/src/tasks/webhooks/deliverer.js';
import { WebhookSigner } from '../../packages/gateway/src/tasks/webhooks/signer.js';
import { WebhookPolicy } from '../../packages/gateway/src/tasks/webhooks/url-policy.js';
import type { TestRedis } from '../../test/helpers/redis.js';
import { uniquePrefix } from '../../test/helpers/redis.js';
import { startWebhookReceiver, type WebhookReceiver } from '../../test/helpers/webhook-receiver.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { machine, writeResults } from './report.js';

const SECRET = 'whsec_' + Buffer.from('bench webhook key, 32 bytes long').toString('base64');
const EVENTS_PER_ABUSER = 40;
const WARM_AFTER_MS = 12_000;

interface Row {
  hangingPrincipals: number;
  coldMs: number;
  warmMs: number;
  hangingPosts: number;
}

async function scenario(redis: Redis, abusers: number): Promise<Row> {
  const keys = createKeys(uniquePrefix(`wh-bench-${abusers}`));
  const store = new TaskStore(redis, keys, { reaperIntervalMs: 0 });
  const outbox = new WebhookOutbox(store.runner);
  const receivers: WebhookReceiver[] = [];
  const base = { tool: 'b', queue: 'default', mode: 'task' as const, ttl: 600_000, pollInterval: 1000 };
  const deliverer = { d: undefined as WebhookDeliverer | undefined };
  try {
    const hanging: WebhookReceiver[] = [];
    for (let p = 0; p < abusers; p++) {
      const r = await startWebhookReceiver(SECRET);
      r.answer(() => 'hang');
      receivers.push(r);
      hanging.push(r);
      for (let i = 0; i < EVENTS_PER_ABUSER; i++) {
        const t = await store.records.create({
          ...base,
          principal: `abuser${p}`,
          webhook: { url: `${r.origin}/h`, cap: 1000 },
        });
        await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
      }
    }
    const live = await startWebhookReceiver(SECRET);
    receivers.push(live);
    const hook = { url: `${live.origin}/h`, cap: 1000 };
    const first = await store.records.create({ ...base, principal: 'dave', webhook: hook });
    await store.runs.transition(first.taskId, 'completed', { result: { content: [] } });
    deliverer.d = new WebhookDeliverer(
      outbox,
      new WebhookPolicy({ secretSet: true, allowedHosts: receivers.map((r) => `127.0.0.1:${r.port}`) }),
      new WebhookSigner(SECRET),
      new GatewayMetrics(),
      createLogger('gateway', { level: 'silent' }),
      {
        maxAttempts: 10,
        retryBaseMs: 2_000,
        retryMaxMs: 600_000,
        timeoutMs: 10_000,
        pollMs: 500,
        gatewayId: 'bench',
        userAgent: 'bench',
      },
    );
    const started = performance.now();
    deliverer.d.start();
    await waitFor(() => live.received.length === 1, { timeoutMs: 120_000, intervalMs: 5 });
    const coldMs = performance.now() - started;
    await new Promise((resolve) => setTimeout(resolve, WARM_AFTER_MS));
    const second = await store.records.create({ ...base, principal: 'dave', webhook: hook });
    const changed = performance.now();
    await store.runs.transition(second.taskId, 'completed', { result: { content: [] } });
    await waitFor(() => live.received.length === 2, { timeoutMs: 120_000, intervalMs: 5 });
    const warmMs = performance.now() - changed;
    const hangingPosts = hanging.reduce((n, r) => n + r.received.length, 0);
    for (const r of hanging) r.release(200);
    return { hangingPrincipals: abusers, coldMs: Math.round(coldMs), warmMs: Math.round(warmMs), hangingPosts };
  } finally {
    await deliverer.d?.stop();
    await Promise.all(receivers.map((r) => r.close()));
  }
}

export async function runWebhooks(o: { redis: TestRedis; log: (m: string) => void }): Promise<number> {
  const startedAt = new Date();
  const redis = new Redis(o.redis.url);
  try {
    const rows: Row[] = [];
    for (const abusers of [1, 4, 16]) {
      const row = await scenario(redis, abusers);
      rows.push(row);
      o.log(
        `webhooks: ${abusers} hanging principal(s) × ${EVENTS_PER_ABUSER} events: dave's first event ${row.coldMs} ms, ` +
          `his event ${WARM_AFTER_MS / 1000} s later ${row.warmMs} ms; POSTs to the hanging receivers ${row.hangingPosts}`,
      );
    }
    const version = String((await redis.info('server')).match(/redis_version:(\S+)/)?.[1] ?? 'unknown');
    const file = await writeResults({ kind: 'webhooks', machine: machine(version), rows }, startedAt);
    o.log(`written to ${file}`);
    return 0;
  } finally {
    redis.disconnect();
  }
}

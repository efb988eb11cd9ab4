/**
 * The webhook outbox against a real Redis (PROTOCOL.md §27.2, §27.3, §27.5): events are written by the status-change
 * scripts themselves, claimed under a lease that a dead gateway's successor takes over, and settled once.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { StoreRunner, TaskStore, WebhookOutbox, createKeys, createLogger, type Keys } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { startWebhookReceiver, type WebhookReceiver } from '../../../test/helpers/webhook-receiver.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { absenceWindow } from '../../../test/helpers/load.js';
import { GatewayMetrics } from '../src/metrics/gateway-metrics.js';
import {
  DELIVERY_SLOTS,
  PER_PRINCIPAL_SLOTS,
  RESERVED_SLOTS,
  SUSPECT_SLOTS,
  WebhookDeliverer,
} from '../src/tasks/webhooks/deliverer.js';
import { WebhookSigner } from '../src/tasks/webhooks/signer.js';
import { WebhookPolicy } from '../src/tasks/webhooks/url-policy.js';

const SECRET = 'whsec_' + Buffer.from('outbox test key, 32 bytes long!!').toString('base64');

let server: TestRedis;
let redis: Redis;
const receivers: WebhookReceiver[] = [];
const deliverers: WebhookDeliverer[] = [];

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});
afterEach(async () => {
  await Promise.all(deliverers.splice(0).map((d) => d.stop()));
  await Promise.all(receivers.splice(0).map((r) => r.close()));
});
afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

const base = {
  tool: 'build_report',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 60_000,
  pollInterval: 1000,
};

function setup(label: string) {
  const keys = createKeys(uniquePrefix(label));
  return {
    keys,
    store: new TaskStore(redis, keys, { reaperIntervalMs: 0 }),
    outbox: new WebhookOutbox(new StoreRunner(redis, keys)),
  };
}

async function receiver(): Promise<WebhookReceiver> {
  const r = await startWebhookReceiver(SECRET);
  receivers.push(r);
  return r;
}

function deliverer(
  outbox: WebhookOutbox,
  r: WebhookReceiver | WebhookReceiver[],
  overrides: Partial<{
    maxAttempts: number;
    timeoutMs: number;
    gatewayId: string;
    retryBaseMs: number;
    retryMaxMs: number;
  }> = {},
) {
  const metrics = new GatewayMetrics();
  const d = new WebhookDeliverer(
    outbox,
    new WebhookPolicy({ secretSet: true, allowedHosts: [r].flat().map((x) => `127.0.0.1:${x.port}`) }),
    new WebhookSigner(SECRET),
    metrics,
    createLogger('gateway', { level: 'silent' }),
    {
      maxAttempts: 5,
      retryBaseMs: 10,
      retryMaxMs: 20,
      timeoutMs: 2_000,
      pollMs: 20,
      gatewayId: 'g1',
      userAgent: 'test',
      ...overrides,
    },
  );
  deliverers.push(d);
  return { d, metrics };
}

async function outcomes(metrics: GatewayMetrics): Promise<Record<string, number>> {
  const metric = await metrics.webhookDeliveries.get();
  return Object.fromEntries(metric.values.map((v) => [String(v.labels['outcome']), v.value]));
}

async function due(keys: Keys): Promise<string[]> {
  return redis.zrange(keys.webhooks.due, 0, -1);
}

describe('§27.2 the outbox is written in the status change', () => {
  it('a task ending writes one event with its status; a task without a webhook writes none', async () => {
    const { keys, store } = setup('ob-append');
    const hooked = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 10 } });
    const plain = await store.records.create(base);
    await store.runs.transition(plain.taskId, 'completed', { result: { content: [] } });
    expect(await due(keys)).toEqual([]);
    await store.runs.transition(hooked.taskId, 'failed', {
      statusMessage: 'boom',
      result: { content: [], isError: true },
    });
    const id = `msg_${hooked.taskId}_1`;
    expect(await due(keys)).toEqual([id]);
    expect(await redis.hgetall(keys.webhooks.event(id))).toMatchObject({
      id,
      taskId: hooked.taskId,
      principal: 'alice',
      url: 'http://127.0.0.1:1/h',
      status: 'failed',
      statusMessage: 'boom',
      attempts: '0',
    });
    expect(await redis.hget(keys.webhooks.pending, 'alice')).toBe('1');
    // A terminal task never changes, so a refused write appends nothing.
    await store.runs.transition(hooked.taskId, 'cancelled');
    expect(await due(keys)).toEqual([id]);
    expect((await store.records.get(hooked.taskId))?.webhookUrl).toBe('http://127.0.0.1:1/h');
  });

  it('input_required once per change (not for another question while waiting), nothing on the way back to working', async () => {
    const { keys, store } = setup('ob-input');
    const { taskId } = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 10 } });
    await redis.set(keys.bullJobLock('default', taskId), 'tok', 'PX', 60_000);
    const lock = { queue: 'default', token: 'tok' };
    const ask = (n: number) => ({ method: 'elicitation/create' as const, params: { message: `q${n}` }, n });
    await store.runs.suspend(taskId, lock, { requests: [ask(1)], deadlineAt: Date.now() + 60_000 });
    await store.runs.suspend(taskId, lock, { requests: [ask(2)], deadlineAt: Date.now() + 60_000 });
    expect(await due(keys)).toEqual([`msg_${taskId}_1`]);
    await store.runs.answerInput(taskId, 1, { action: 'accept' }, Date.now() + 60_000);
    await store.runs.answerInput(taskId, 2, { action: 'accept' }, Date.now() + 60_000);
    expect((await store.records.get(taskId))?.status).toBe('working');
    expect(await due(keys)).toHaveLength(1);
    await store.runs.transition(taskId, 'completed', { result: { content: [] } }, { lock });
    const ids = await due(keys);
    expect(ids.sort()).toEqual([`msg_${taskId}_1`, `msg_${taskId}_2`].sort());
    expect(await redis.hget(keys.webhooks.event(`msg_${taskId}_1`), 'status')).toBe('input_required');
    expect(await redis.hget(keys.webhooks.event(`msg_${taskId}_2`), 'status')).toBe('completed');
  });

  it('the reaper failing a task writes its event', async () => {
    const { keys, store } = setup('ob-reap');
    const { taskId } = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 10 } });
    const outcome = await store.runs.reap('g1');
    expect(outcome.reaped.map((r) => r.taskId)).toEqual([taskId]);
    expect(await redis.hgetall(keys.webhooks.event(`msg_${taskId}_1`))).toMatchObject({
      status: 'failed',
      statusMessage: expect.stringMatching(/lost/),
    });
  });

  it("an event past the principal's pending cap is dead-lettered at once", async () => {
    const { keys, store, outbox } = setup('ob-cap');
    const a = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 1 } });
    const b = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 1 } });
    await store.runs.transition(a.taskId, 'completed', { result: { content: [] } });
    await store.runs.transition(b.taskId, 'completed', { result: { content: [] } });
    expect(await due(keys)).toEqual([`msg_${a.taskId}_1`]);
    expect(await outbox.counts()).toEqual({ pending: 1, dead: 1 });
    expect(await outbox.deadLetters()).toEqual([
      expect.objectContaining({ id: `msg_${b.taskId}_1`, reason: expect.stringMatching(/pending cap/) }),
    ]);
    expect(await outbox.pendingFor('alice')).toBe(1);
  });
});

describe('§27.3 claims, leases and takeover', () => {
  it('a claimed event is hidden until its lease ends, then another holder takes it; the first cannot settle it', async () => {
    const { store, outbox } = setup('ob-lease');
    const { taskId } = await store.records.create({ ...base, webhook: { url: 'http://127.0.0.1:1/h', cap: 10 } });
    await store.runs.transition(taskId, 'completed', { result: { content: [] } });
    const [first] = (await outbox.claim('dead-gateway', 10, 200)).events;
    expect(first).toMatchObject({ id: `msg_${taskId}_1`, attempts: 1, lease: 'dead-gateway:1' });
    expect((await outbox.claim('g2', 10, 200)).events).toEqual([]);
    const second = await waitFor(async () => (await outbox.claim('g2', 10, 5_000)).events[0], { timeoutMs: 5_000 });
    expect(second).toMatchObject({ id: first!.id, attempts: 2, lease: 'g2:2' });
    expect(await outbox.settle(first!, { outcome: 'delivered' })).toBe(false);
    expect(await outbox.settle(second, { outcome: 'delivered' })).toBe(true);
    expect(await outbox.counts()).toEqual({ pending: 0, dead: 0 });
    expect(await outbox.pendingFor('alice')).toBe(0);
  });
});

describe('§27.4 §27.5 delivery end to end (in process)', () => {
  it('through a receiver outage (500, 500, then 200) the event arrives with one id and a valid signature each time', async () => {
    const { store, outbox } = setup('ob-outage');
    const r = await receiver();
    r.answer((n) => (n <= 2 ? 500 : 200));
    const { taskId } = await store.records.create({ ...base, webhook: { url: `${r.origin}/hook`, cap: 10 } });
    await store.runs.transition(taskId, 'completed', { statusMessage: 'done', result: { content: [] } });
    const { d, metrics } = deliverer(outbox, r);
    d.start();
    await waitFor(async () => (await outcomes(metrics))['delivered'] === 1, { timeoutMs: 10_000 });
    expect(r.received).toHaveLength(3);
    expect(new Set(r.received.map((h) => h.id))).toEqual(new Set([`msg_${taskId}_1`]));
    expect(r.received.every((h) => h.verified)).toBe(true);
    expect(new Set(r.received.map((h) => h.body)).size).toBe(1);
    expect(r.received[0]!.event).toEqual({
      type: 'task.status',
      taskId,
      status: 'completed',
      statusMessage: 'done',
      timestamp: expect.any(String),
    });
    expect(await outcomes(metrics)).toEqual({ retried: 2, delivered: 1 });
    expect(await outbox.counts()).toEqual({ pending: 0, dead: 0 });
  });

  it('a gateway that died holding the lease leaves the event to another, which delivers it', async () => {
    const { store, outbox } = setup('ob-takeover');
    const r = await receiver();
    const { taskId } = await store.records.create({ ...base, webhook: { url: `${r.origin}/hook`, cap: 10 } });
    await store.runs.transition(taskId, 'completed', { result: { content: [] } });
    // The first gateway claims it and is gone before it settles anything.
    expect((await outbox.claim('killed-gateway', 16, 300)).events).toHaveLength(1);
    const { d, metrics } = deliverer(outbox, r, { gatewayId: 'g2' });
    d.start();
    await waitFor(async () => (await outcomes(metrics))['delivered'] === 1, { timeoutMs: 10_000 });
    expect(r.received.map((h) => [h.id, h.verified])).toEqual([[`msg_${taskId}_1`, true]]);
  });

  it('410 stops at once; another 4xx dead-letters at once; always 500 dead-letters after the last try', async () => {
    const { store, outbox } = setup('ob-outcomes');
    const gone = await receiver();
    gone.answer(() => 410);
    const missing = await receiver();
    missing.answer(() => 404);
    const broken = await receiver();
    broken.answer(() => 500);
    for (const r of [gone, missing, broken]) {
      const { taskId } = await store.records.create({ ...base, webhook: { url: `${r.origin}/hook`, cap: 10 } });
      await store.runs.transition(taskId, 'completed', { result: { content: [] } });
    }
    const metrics = new GatewayMetrics();
    const d = new WebhookDeliverer(
      outbox,
      new WebhookPolicy({ secretSet: true, allowedHosts: [gone, missing, broken].map((r) => `127.0.0.1:${r.port}`) }),
      new WebhookSigner(SECRET),
      metrics,
      createLogger('gateway', { level: 'silent' }),
      {
        maxAttempts: 3,
        retryBaseMs: 10,
        retryMaxMs: 20,
        timeoutMs: 2_000,
        pollMs: 20,
        gatewayId: 'g1',
        userAgent: 'test',
      },
    );
    deliverers.push(d);
    d.start();
    await waitFor(async () => (await outbox.counts()).pending === 0, { timeoutMs: 10_000 });
    expect([gone.received.length, missing.received.length, broken.received.length]).toEqual([1, 1, 3]);
    expect(await outcomes(metrics)).toEqual({ gone: 1, dead: 2, retried: 2 });
    const dead = await outbox.deadLetters();
    expect(dead.map((l) => l.reason).sort()).toEqual([
      'gave up after 3 tries; the last: the receiver answered 500',
      'the receiver answered 404 (only 408, 425, 429 and 5xx answers are retried)',
    ]);
    expect(dead.find((l) => l.attempts === 3)?.url).toBe(`${broken.origin}/hook`);
  });

  it('an event whose host left the allow-list since creation is dead-lettered, never sent', async () => {
    const { store, outbox } = setup('ob-revoked');
    const r = await receiver();
    const { taskId } = await store.records.create({
      ...base,
      webhook: { url: `http://localhost:${r.port}/hook`, cap: 10 },
    });
    await store.runs.transition(taskId, 'completed', { result: { content: [] } });
    const metrics = new GatewayMetrics();
    const d = new WebhookDeliverer(
      outbox,
      // localhost is allowed by name, but it resolves to a loopback address that is not on the list.
      new WebhookPolicy({ secretSet: true, allowedHosts: [`localhost:${r.port}`] }),
      new WebhookSigner(SECRET),
      metrics,
      createLogger('gateway', { level: 'silent' }),
      {
        maxAttempts: 3,
        retryBaseMs: 10,
        retryMaxMs: 20,
        timeoutMs: 2_000,
        pollMs: 20,
        gatewayId: 'g1',
        userAgent: 'test',
      },
    );
    deliverers.push(d);
    d.start();
    await waitFor(async () => (await outbox.counts()).dead === 1, { timeoutMs: 10_000 });
    expect(r.received).toHaveLength(0);
    expect((await outbox.deadLetters())[0]?.reason).toMatch(/resolves to .*loopback address/);
  });
});

describe('§27.3 delivery is fair between principals and bounded per try', () => {
  it("one principal's events to a receiver that stops answering do not hold another principal's (R2)", async () => {
    const { store, outbox } = setup('ob-fair');
    const dead = await receiver();
    // It answers its first try, so it is trusted with several tries at once (slow start), and then never again.
    dead.answer((n) => (n === 1 ? 200 : 'hang'));
    const live = await receiver();
    for (let i = 0; i < 40; i++) {
      const t = await store.records.create({
        ...base,
        principal: 'alice',
        webhook: { url: `${dead.origin}/h`, cap: 100 },
      });
      await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
    }
    const d = await store.records.create({
      ...base,
      principal: 'dave',
      webhook: { url: `${live.origin}/h`, cap: 100 },
    });
    await store.runs.transition(d.taskId, 'completed', { result: { content: [] } });
    // Tries time out after 30 s (far beyond this test on any machine): dave's event must not wait for them to end.
    const { d: deliv, metrics } = deliverer(outbox, [dead, live], { timeoutMs: 30_000 });
    deliv.start();
    await waitFor(() => live.received.length === 1, { message: "dave's webhook did not arrive" });
    expect(live.received[0]?.event).toMatchObject({ taskId: d.taskId, status: 'completed' });
    // Alice holds PER_PRINCIPAL_SLOTS of the 16 slots, no more, however many of her events are due (after her first,
    // answered, try).
    await waitFor(() => dead.received.length === 1 + PER_PRINCIPAL_SLOTS, { message: "alice's tries did not start" });
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(dead.received.length).toBe(1 + PER_PRINCIPAL_SLOTS);
    // Settled: dave's event and alice's first; none of her hanging tries has ended. (The receiver has the request
    // before the deliverer counts the answer: wait for the count, or a loaded machine reads it in between.)
    await waitFor(async () => (await outcomes(metrics))['delivered'] === 2, { message: "dave's event not counted" });
    expect(await outcomes(metrics)).toEqual({ delivered: 2 });
    dead.release(200);
  });

  it('slow start: a receiver that has not answered yet gets one try at a time, whatever is due for it', async () => {
    const { store, outbox } = setup('ob-slow-start');
    const silent = await receiver();
    silent.answer(() => 'hang');
    for (let i = 0; i < 20; i++) {
      const t = await store.records.create({ ...base, webhook: { url: `${silent.origin}/h`, cap: 100 } });
      await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
    }
    const { d } = deliverer(outbox, silent, { timeoutMs: 30_000 });
    d.start();
    await waitFor(() => silent.received.length === 1, { message: 'the first try did not start' });
    // 50 polls of 20 ms: none sends it a second try while the first has not answered.
    await absenceWindow(1_000);
    expect(silent.received.length).toBe(1);
    // Once it answers, the rest go out several at a time.
    silent.answer(() => 200);
    silent.release(200);
    await waitFor(() => silent.received.length === 20, { message: 'the rest were not sent' });
  });

  // F1 (issue 48): with 4 such principals, each holding PER_PRINCIPAL_SLOTS, dave's webhooks were not delivered in 90 s.
  it.each([1, 4, 16])(
    "with %i principals whose receivers hang, another principal's webhook still arrives (F1)",
    async (abusers) => {
      const { store, outbox } = setup(`ob-fair-${abusers}`);
      const hanging: WebhookReceiver[] = [];
      for (let p = 0; p < abusers; p++) {
        const r = await receiver();
        r.answer(() => 'hang');
        hanging.push(r);
        for (let i = 0; i < 8; i++) {
          const t = await store.records.create({
            ...base,
            principal: `abuser${p}`,
            webhook: { url: `${r.origin}/h`, cap: 100 },
          });
          await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
        }
      }
      const live = await receiver();
      const d = await store.records.create({
        ...base,
        principal: 'dave',
        webhook: { url: `${live.origin}/h`, cap: 100 },
      });
      await store.runs.transition(d.taskId, 'completed', { result: { content: [] } });
      // Up to 12 hanging principals leave a reserved slot free, so their tries may take 30 s (far beyond this test);
      // 16 fill every slot with first tries, and then dave's is the first event taken when one ends (2 s).
      const timeoutMs = abusers <= DELIVERY_SLOTS - RESERVED_SLOTS ? 30_000 : 2_000;
      const { d: deliv, metrics } = deliverer(outbox, [...hanging, live], { timeoutMs });
      deliv.start();
      await waitFor(() => live.received.length === 1, { message: "dave's webhook did not arrive" });
      expect(live.received[0]?.event).toMatchObject({ taskId: d.taskId, status: 'completed' });
      if (timeoutMs === 30_000) {
        await waitFor(async () => (await outcomes(metrics))['delivered'] === 1, {
          message: "dave's event not counted",
        });
        expect(await outcomes(metrics)).toEqual({ delivered: 1 });
      } else {
        // Dave's went out when the first slots came free. A hanging receiver got a second try only as a probe of its
        // circuit: one at a time, and at most SUSPECT_SLOTS of them at once.
        const tries = hanging.map((r) => r.received.length);
        expect(Math.max(...tries)).toBeLessThanOrEqual(2);
        expect(tries.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(abusers + SUSPECT_SLOTS);
      }
      for (const r of hanging) r.release(200);
    },
  );

  it('a receiver that keeps failing is backed off as a whole: its other events are deferred unsent, then it is probed', async () => {
    const { keys, store, outbox } = setup('ob-backoff');
    const broken = await receiver();
    broken.answer(() => 503);
    for (let i = 0; i < 30; i++) {
      const t = await store.records.create({ ...base, webhook: { url: `${broken.origin}/h`, cap: 100 } });
      await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
    }
    // A 4 s first backoff step: the circuit stays open 2 s after the first failures, the events' own retries 2–4 s.
    const { d, metrics } = deliverer(outbox, broken, { retryBaseMs: 4_000, retryMaxMs: 60_000 });
    d.start();
    // Every event is settled once (tried, or deferred because its receiver had just failed) ...
    await waitFor(async () => (await outcomes(metrics))['retried'] === 30, { message: 'not every event settled once' });
    // ... while the receiver got the first round of one principal's tries only, not 30 POSTs.
    expect(broken.received.length).toBeLessThanOrEqual(PER_PRINCIPAL_SLOTS);
    const errors = await Promise.all((await due(keys)).map((id) => redis.hget(keys.webhooks.event(id), 'lastError')));
    expect(errors.filter((e) => e?.startsWith('not sent: the receiver is backed off')).length).toBeGreaterThanOrEqual(
      30 - PER_PRINCIPAL_SLOTS,
    );
    // When the circuit half-opens, it is probed again (one try, with the short deadline of a suspected receiver).
    const firstRound = broken.received.length;
    await waitFor(() => broken.received.length > firstRound, { message: 'the receiver was never probed again' });
  });

  it('a receiver that sends its headers and stalls the body gets its socket closed at the try deadline (R4)', async () => {
    const { store, outbox } = setup('ob-stall');
    const stalling = await receiver();
    stalling.answer(() => 'stall-body');
    for (let i = 0; i < 10; i++) {
      const t = await store.records.create({ ...base, webhook: { url: `${stalling.origin}/h`, cap: 100 } });
      await store.runs.transition(t.taskId, 'completed', { result: { content: [] } });
    }
    const { d, metrics } = deliverer(outbox, stalling, { timeoutMs: 300 });
    d.start();
    // The status line decides the outcome: each event is delivered (200).
    await waitFor(async () => (await outcomes(metrics))['delivered'] === 10, { message: 'not all delivered' });
    // And the body that never comes holds no socket past the try's deadline.
    await waitFor(async () => (await stalling.openConnections()) === 0, {
      timeoutMs: 5_000,
      message: 'sockets left open after the try deadline',
    });
  });
});

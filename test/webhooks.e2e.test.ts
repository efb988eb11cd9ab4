/**
 * Issue 24, PROTOCOL.md §27: completion webhooks end to end, with real gateways, a worker, Redis and loopback
 * receivers that verify every Standard Webhooks signature with the stock `standardwebhooks` package.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { connectClient, type GatewayProcess } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { startWebhookReceiver, type ReceivedWebhook, type WebhookReceiver } from './helpers/webhook-receiver.js';

const SECRET = 'whsec_' + Buffer.from('taskrelay e2e webhook key, 32 b.').toString('base64');
const TOKENS = 'alice:alice-token,bob:bob-token,carol:carol-token,ops:ops-token';
const V = '2026-07-28';
const EXT = 'io.modelcontextprotocol/tasks';
const META_KEY = 'dev.taskrelay/webhook';
type Json = Record<string, any>;

let stack: TestStack;
/** Stacks a test starts for itself, stopped after the file. */
const stacks: TestStack[] = [];
let gateway: GatewayProcess;
let noSecret: GatewayProcess;
/** Receivers by role; every one is on the allow-list except `stranger`. */
const r: Record<'alice' | 'bob' | 'flaky' | 'redirect' | 'target' | 'gone' | 'broken' | 'stranger', WebhookReceiver> =
  {} as never;
let prefix: string;
let nextId = 1;

beforeAll(async () => {
  for (const name of Object.keys({
    alice: 1,
    bob: 1,
    flaky: 1,
    redirect: 1,
    target: 1,
    gone: 1,
    broken: 1,
    stranger: 1,
  })) {
    r[name as keyof typeof r] = await startWebhookReceiver(SECRET);
  }
  const allowed = Object.entries(r)
    .filter(([name]) => name !== 'stranger')
    .map(([, rec]) => `127.0.0.1:${rec.port}`);
  stack = await startStack({
    name: 'webhooks',
    env: { TASKRELAY_AUTH_TOKENS: TOKENS, TASKRELAY_OPERATORS: 'ops' },
    gateways: [
      {
        TASKRELAY_WEBHOOK_SECRET: SECRET,
        // `localhost` by name too, on a port whose loopback address is not itself allowed.
        TASKRELAY_WEBHOOK_ALLOWED_HOSTS: [...allowed, `localhost:${r.stranger.port}`].join(','),
        TASKRELAY_WEBHOOK_MAX_ATTEMPTS: '3',
        TASKRELAY_WEBHOOK_RETRY_BASE_MS: '100',
        TASKRELAY_WEBHOOK_RETRY_MAX_MS: '200',
        TASKRELAY_WEBHOOK_TIMEOUT_MS: '2000',
        TASKRELAY_WEBHOOK_POLL_MS: '50',
      },
      { TASKRELAY_WEBHOOK_ALLOWED_HOSTS: allowed.join(',') },
    ],
  });
  [gateway, noSecret] = stack.gateways as [GatewayProcess, GatewayProcess];
  ({ prefix } = stack);
});

afterAll(async () => {
  await Promise.all([stack, ...stacks].map((s) => s?.stop()));
  await Promise.all(Object.values(r).map((rec) => rec?.close()));
});

/** One 2026-07-28 request with the tasks extension declared, as `principal`. */
async function modern(url: string, principal: string, method: string, params: Json, meta: Json = {}): Promise<Json> {
  const res = await fetch(url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${principal}-token`,
      'mcp-protocol-version': V,
      'mcp-method': method,
      ...(method === 'tools/call' ? { 'mcp-name': String(params['name']) } : {}),
      ...(method.startsWith('tasks/') ? { 'mcp-name': String(params['taskId']) } : {}),
    },
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: nextId++,
      method,
      params: {
        ...params,
        _meta: {
          'io.modelcontextprotocol/protocolVersion': V,
          'io.modelcontextprotocol/clientCapabilities': { elicitation: {}, extensions: { [EXT]: {} } },
          'io.modelcontextprotocol/clientInfo': { name: 'webhooks-e2e', version: '0' },
          ...meta,
        },
      },
    }),
  });
  const text = await res.text();
  if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
    const data = text
      .split('\n')
      .filter((l) => l.startsWith('data:') && l.length > 5)
      .map((l) => JSON.parse(l.slice(5)) as Json);
    return data.at(-1) ?? {};
  }
  return JSON.parse(text) as Json;
}

async function session(principal: string, url = gateway.url): Promise<Client> {
  return connectClient(url, { authorization: `Bearer ${principal}-token` });
}

const hook = (rec: WebhookReceiver, path = '/hook') => ({ [META_KEY]: { url: `${rec.origin}${path}` } });

/** A demo task through the extension, with a webhook; returns its id. */
async function extTask(principal: string, tool: string, args: Json, meta: Json, url = gateway.url): Promise<string> {
  const reply = await modern(url, principal, 'tools/call', { name: tool, arguments: args }, meta);
  if (reply['error']) throw new Error(`tools/call failed: ${JSON.stringify(reply['error'])}`);
  return String(reply['result']['taskId']);
}

async function until(principal: string, taskId: string, status: string): Promise<void> {
  await waitFor(
    async () => (await modern(gateway.url, principal, 'tasks/get', { taskId }))['result']?.['status'] === status,
    { timeoutMs: 15_000, message: `task ${taskId} did not become ${status}` },
  );
}

function forTask(rec: WebhookReceiver, taskId: string): ReceivedWebhook[] {
  return rec.received.filter((h) => h.event?.['taskId'] === taskId);
}

async function metrics(url: string): Promise<string> {
  const res = await fetch(url.replace(/\/mcp$/, '/metrics'), { headers: { authorization: 'Bearer ops-token' } });
  return res.text();
}

function sample(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}

async function taskCount(): Promise<number> {
  const { Redis } = await import('ioredis');
  const client = new Redis(stack.redis.url);
  try {
    return (await client.keys(`${prefix}:task:*`)).length;
  } finally {
    client.disconnect();
  }
}

describe('§27 completion webhooks', () => {
  it('each event reaches the receiver signed, with one id, through a receiver outage (500, then 200), in both eras', async () => {
    // Every event's first try gets 500; its retry 200.
    r.flaky.answer((_n, h) => (r.flaky.received.filter((x) => x.id === h.id).length === 1 ? 500 : 200));
    // The extension era: a task that asks a question, then ends.
    const asking = await extTask('alice', 'wait_for_approval', { question: 'Ship it?' }, hook(r.flaky));
    await waitFor(() => forTask(r.flaky, asking).filter((h) => h.event?.['status'] === 'input_required').length >= 2, {
      timeoutMs: 15_000,
      message: 'input_required was not delivered after the outage',
    });
    const answered = await modern(gateway.url, 'alice', 'tasks/update', {
      taskId: asking,
      inputResponses: { '1': { action: 'accept', content: { approved: true } } },
    });
    expect(answered['error']).toBeUndefined();
    // The 2025-11-25 era: a task-augmented call on a session.
    const client = await session('alice');
    const created = await client.request(
      {
        method: 'tools/call',
        params: {
          name: 'build_report',
          arguments: { report: 'r', items: 2, delayMs: 5 },
          task: { ttl: 60_000 },
          _meta: hook(r.flaky),
        },
      },
      CreateTaskResultSchema,
    );
    const built = created.task.taskId;
    await waitFor(
      () =>
        forTask(r.flaky, asking).some((h) => h.event?.['status'] === 'completed') &&
        forTask(r.flaky, built).filter((h) => h.event?.['status'] === 'completed').length >= 2,
      { timeoutMs: 15_000, message: 'completed events were not delivered' },
    );
    await waitFor(() => forTask(r.flaky, asking).filter((h) => h.event?.['status'] === 'completed').length >= 2, {
      timeoutMs: 15_000,
    });
    await client.close();

    expect(r.flaky.received.every((h) => h.verified)).toBe(true);
    const byId = new Map<string, ReceivedWebhook[]>();
    for (const h of r.flaky.received) byId.set(h.id, [...(byId.get(h.id) ?? []), h]);
    expect(byId.size).toBe(3);
    for (const tries of byId.values()) {
      expect(tries.length).toBeGreaterThanOrEqual(2);
      expect(new Set(tries.map((t) => t.body)).size).toBe(1);
    }
    const statuses = [...byId.values()].map(
      (t) => `${t[0]!.event?.['taskId'] === asking ? 'asking' : 'built'}:${t[0]!.event?.['status']}`,
    );
    expect(statuses.sort()).toEqual(['asking:completed', 'asking:input_required', 'built:completed']);
    const event = forTask(r.flaky, built)[0]!.event!;
    expect(event).toMatchObject({ type: 'task.status', taskId: built, status: 'completed' });
    expect(Date.parse(String(event['timestamp']))).toBeGreaterThan(0);
    expect(
      Object.keys(event).every((k) => ['type', 'taskId', 'status', 'statusMessage', 'timestamp'].includes(k)),
    ).toBe(true);
  });

  it("goes only to the URL the task's own principal named", async () => {
    const alices = await extTask(
      'alice',
      'build_report',
      { report: 'a', items: 1, delayMs: 1 },
      { ...hook(r.alice), 'dev.taskrelay/idempotency-key': 'k-1' },
    );
    const bobs = await extTask('bob', 'build_report', { report: 'b', items: 1, delayMs: 1 }, hook(r.bob));
    // The same idempotency key again, naming bob's receiver: the same task, still going to alice's URL only.
    const again = await extTask(
      'alice',
      'build_report',
      { report: 'a', items: 1, delayMs: 1 },
      { ...hook(r.bob), 'dev.taskrelay/idempotency-key': 'k-1' },
    );
    expect(again).toBe(alices);
    await waitFor(() => forTask(r.alice, alices).length > 0 && forTask(r.bob, bobs).length > 0, { timeoutMs: 15_000 });
    await until('alice', alices, 'completed');
    expect(r.alice.received.map((h) => h.event?.['taskId'])).toEqual([alices]);
    expect(r.bob.received.map((h) => h.event?.['taskId'])).toEqual([bobs]);
    expect([...r.alice.received, ...r.bob.received].every((h) => h.verified)).toBe(true);
  });

  it('refuses at creation, with the reason and no task: a host not allowed, a name resolving to loopback, no secret, a plain call', async () => {
    const before = await taskCount();
    // Each refused with -32602 and its reason.
    const refusals: Array<[string, Record<string, unknown>, RegExp]> = [
      [gateway.url, hook(r.stranger), /Webhook refused: host 127\.0\.0\.1:\d+ is not allowed/],
      [
        gateway.url,
        { [META_KEY]: { url: `http://localhost:${r.stranger.port}/hook` } },
        /resolves to (127\.0\.0\.1|::1), a loopback address/,
      ],
      [noSecret.url, hook(r.alice), /TASKRELAY_WEBHOOK_SECRET is not set/],
    ];
    for (const [url, meta, reason] of refusals) {
      const answer = await modern(
        url,
        'carol',
        'tools/call',
        { name: 'build_report', arguments: { report: 'x', items: 1 } },
        meta,
      );
      expect(answer['error']).toMatchObject({ code: -32602, message: expect.stringMatching(reason) });
    }
    const client = await session('carol');
    await expect(
      client.request(
        {
          method: 'tools/call',
          params: {
            name: 'build_report',
            arguments: { report: 'x', items: 1 },
            task: { ttl: 60_000 },
            _meta: hook(r.stranger),
          },
        },
        CreateTaskResultSchema,
      ),
    ).rejects.toThrow(/Webhook refused: host 127\.0\.0\.1:\d+ is not allowed/);
    await expect(
      client.request(
        {
          method: 'tools/call',
          params: { name: 'build_report', arguments: { report: 'x', items: 1 }, _meta: hook(r.alice) },
        },
        CreateTaskResultSchema,
      ),
    ).rejects.toThrow(/webhooks are sent for tasks only/);
    await client.close();
    expect(await taskCount()).toBe(before);
    expect(r.stranger.received).toEqual([]);
  });

  it('§27.6 an operator lists the dead webhooks and sends one again: delivered under its own id, the letter gone', async () => {
    r.broken.answer(() => 503);
    const failed = await extTask('alice', 'fail_after', { delayMs: 1, message: 'resend me' }, hook(r.broken));
    const api = (path: string, token: string, method = 'GET') =>
      fetch(gateway.url.replace(/\/mcp$/, `/admin/api/webhooks${path}`), {
        method,
        headers: {
          authorization: `Bearer ${token}`,
          ...(method === 'POST' ? { 'content-type': 'application/json' } : {}),
        },
        ...(method === 'POST' ? { body: '{}' } : {}),
      });
    const letter = await waitFor(
      async () => {
        const body = (await (await api('/dead?limit=1000', 'ops-token')).json()) as { deadLetters: Json[] };
        return body.deadLetters.find((d) => d['taskId'] === failed);
      },
      { timeoutMs: 20_000, message: 'the webhook did not die' },
    );
    expect(letter).toMatchObject({ status: 'failed', attempts: 3, timestamp: expect.any(String) as string });
    expect((await api('/dead', 'alice-token')).status).toBe(403);
    // The receiver is back; the operator sends it again.
    r.broken.answer(() => 200);
    const resent = await api(`/dead/${String(letter['id'])}/resend`, 'ops-token', 'POST');
    expect(resent.status).toBe(200);
    expect(await resent.json()).toEqual({ resent: [letter['id']] });
    await waitFor(() => forTask(r.broken, failed).length === 4, { timeoutMs: 10_000, message: 'not sent again' });
    const last = forTask(r.broken, failed).at(-1)!;
    expect(last.id).toBe(letter['id']);
    expect(last.verified).toBe(true);
    expect(last.event).toMatchObject({ taskId: failed, status: 'failed' });
    const after = (await (await api('/dead?limit=1000', 'ops-token')).json()) as { deadLetters: Json[] };
    expect(after.deadLetters.some((d) => d['id'] === letter['id'])).toBe(false);
    expect((await api(`/dead/${String(letter['id'])}/resend`, 'ops-token', 'POST')).status).toBe(404);
    r.broken.answer(() => 503);
  });

  it('§30.3 a replay asks for the webhook its original asked for', async () => {
    const original = await extTask('alice', 'build_report', { report: 'again', items: 1, delayMs: 1 }, hook(r.alice));
    await waitFor(() => forTask(r.alice, original).some((h) => h.event?.['status'] === 'completed'), {
      timeoutMs: 10_000,
      message: 'the original’s webhook did not come',
    });
    const res = await fetch(gateway.url.replace(/\/mcp$/, `/admin/api/tasks/${original}/replay`), {
      method: 'POST',
      headers: { authorization: 'Bearer ops-token', 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(201);
    const replay = ((await res.json()) as { task: { taskId: string } }).task.taskId;
    await waitFor(() => forTask(r.alice, replay).some((h) => h.event?.['status'] === 'completed' && h.verified), {
      timeoutMs: 10_000,
      message: 'the replay’s webhook did not come',
    });
  });

  it('follows no redirect; 410 stops at once; after the last try the event is dead-lettered, in metrics and on the dashboard', async () => {
    r.redirect.answer(() => ({ status: 307, headers: { location: `${r.target.origin}/stolen` } }));
    r.gone.answer(() => 410);
    r.broken.answer(() => 503);
    const before = await metrics(gateway.url);
    const redirected = await extTask('alice', 'build_report', { report: 'r', items: 1, delayMs: 1 }, hook(r.redirect));
    const gone = await extTask('alice', 'build_report', { report: 'g', items: 1, delayMs: 1 }, hook(r.gone));
    const broken = await extTask('alice', 'fail_after', { delayMs: 1, message: 'nope' }, hook(r.broken));
    const admin = gateway.url.replace(/\/mcp$/, '/admin/api/overview');
    const overview = await waitFor(
      async () => {
        const body = (await (await fetch(admin, { headers: { authorization: 'Bearer ops-token' } })).json()) as Json;
        const dead = (body['webhooks']?.['deadLetters'] ?? []) as Json[];
        return dead.some((d) => d['taskId'] === broken) && dead.some((d) => d['taskId'] === redirected)
          ? body
          : undefined;
      },
      { timeoutMs: 20_000, message: 'the dead letters did not show on the dashboard' },
    );
    await waitFor(() => forTask(r.gone, gone).length === 1, { timeoutMs: 10_000 });
    const dead = overview['webhooks']['deadLetters'] as Json[];
    expect(dead.find((d) => d['taskId'] === broken)).toMatchObject({
      status: 'failed',
      attempts: 3,
      url: `${r.broken.origin}/hook`,
      reason: 'gave up after 3 tries; the last: the receiver answered 503',
    });
    expect(dead.find((d) => d['taskId'] === redirected)).toMatchObject({
      attempts: 1,
      reason: expect.stringMatching(/307 \(redirects are not followed\)/),
    });
    expect(dead.some((d) => d['taskId'] === gone)).toBe(false);
    expect(overview['webhooks']['dead']).toBeGreaterThanOrEqual(2);
    expect(forTask(r.broken, broken)).toHaveLength(3);
    expect(forTask(r.redirect, redirected)).toHaveLength(1);
    expect(r.target.received).toEqual([]);
    const after = await metrics(gateway.url);
    const delta = (outcome: string) =>
      sample(after, `taskrelay_webhook_deliveries_total{outcome="${outcome}"}`) -
      sample(before, `taskrelay_webhook_deliveries_total{outcome="${outcome}"}`);
    expect(delta('dead')).toBe(2);
    expect(delta('gone')).toBe(1);
    expect(delta('retried')).toBe(2);
    expect(sample(after, 'taskrelay_webhooks_dead')).toBeGreaterThanOrEqual(2);
    // 410 ended it: no later try.
    expect(forTask(r.gone, gone)).toHaveLength(1);
    expect(sample(after, 'taskrelay_webhooks_pending')).toBe(0);
  });
});

describe('§27.3 a gateway killed before it delivers', () => {
  it('leaves the event to another gateway, which delivers it with the same id', async () => {
    const receiver = await startWebhookReceiver(SECRET);
    try {
      const kill = await startStack({
        name: 'webhooks-kill',
        env: {
          TASKRELAY_AUTH_TOKENS: TOKENS,
          TASKRELAY_OPERATORS: 'ops',
          TASKRELAY_WEBHOOK_SECRET: SECRET,
          TASKRELAY_WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${receiver.port}`,
          TASKRELAY_WEBHOOK_TIMEOUT_MS: '1000',
          TASKRELAY_WEBHOOK_RETRY_BASE_MS: '100',
          TASKRELAY_WEBHOOK_RETRY_MAX_MS: '200',
          TASKRELAY_WEBHOOK_POLL_MS: '50',
        },
      });
      stacks.push(kill);
      const first = kill.gateway;
      // The first try is left hanging: the first gateway holds the event's lease when it dies.
      receiver.answer(() => 'hang');
      const taskId = await extTask(
        'alice',
        'build_report',
        { report: 'k', items: 1, delayMs: 1 },
        hook(receiver),
        first.url,
      );
      await waitFor(() => receiver.received.length === 1, {
        timeoutMs: 15_000,
        message: 'the first gateway never tried',
      });
      await first.kill('SIGKILL');
      receiver.answer(() => 200);
      const second = await kill.addGateway();
      await waitFor(() => receiver.received.length >= 2, {
        timeoutMs: 15_000,
        message: 'no other gateway took the event over',
      });
      await waitFor(
        async () => sample(await metrics(second.url), 'taskrelay_webhook_deliveries_total{outcome="delivered"}') === 1,
        {
          timeoutMs: 10_000,
        },
      );
      expect(receiver.received.map((h) => [h.id, h.verified, h.event?.['taskId'], h.event?.['status']])).toEqual([
        [`msg_${taskId}_1`, true, taskId, 'completed'],
        [`msg_${taskId}_1`, true, taskId, 'completed'],
      ]);
      expect(sample(await metrics(second.url), 'taskrelay_webhooks_pending')).toBe(0);
      await second.kill();
    } finally {
      await receiver.close();
    }
  });
});

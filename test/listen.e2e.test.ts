/**
 * PROTOCOL.md §18 (issue 19, 20): `subscriptions/listen` on the 2026-07-28 endpoint as a push fed by the task router,
 * across replicas. Two gateways on one Redis: tasks made through gateway A are followed on gateway B. Measured (not
 * asserted): the time from a task's terminal write to its frame on B. Asserted: an idle stream reads nothing from
 * Redis (the old stream re-read every task every 250 ms), the per-principal stream cap, the rate limit counting each
 * opening, and a reader that never reads ends bounded, told with `notifications/cancelled` naming its request.
 */
import { connect, type Socket } from 'node:net';
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { resolve } from 'node:path';
import { uniquePrefix } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import { FIXTURE_TOOLS, ROOT, type GatewayProcess } from './helpers/processes.js';
import { TASKS_EXT, modernRequest, readSse } from './helpers/raw-mcp.js';
import { useStack } from './helpers/stack.js';
import { createKeys } from '@taskrelay/shared';
import { absenceWindow } from './helpers/load.js';

const ABUSE_TOOLS = resolve(ROOT, 'test/fixtures/abuse-tools.mjs');
type Json = Record<string, any>;

const RESULT_CAP = 65_536;
const stack = useStack({
  name: 'listen',
  redis: { owned: true },
  gateways: [
    // A's results are capped small: a listen frame inlines a task's result under the same cap as tasks/get.
    { TASKRELAY_MAX_RESULT_BYTES: String(RESULT_CAP) },
    {},
    {
      TASKRELAY_AUTH_TOKENS: 'alice:alice-token',
      TASKRELAY_RATE_LIMIT_TASK_OPS: '3',
      TASKRELAY_RATE_LIMIT_WINDOW_MS: '60000',
    },
  ],
  workers: [
    { TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_CONCURRENCY: '50' },
    { TASKRELAY_TOOLS: ABUSE_TOOLS, TASKRELAY_QUEUE: 'abuse', WORKER_CONCURRENCY: '100' },
  ],
});
let r: Redis;
let a: GatewayProcess;
let b: GatewayProcess;
let limited: GatewayProcess;
let keys: ReturnType<typeof createKeys>;

beforeAll(() => {
  r = stack.r;
  keys = createKeys(stack.prefix);
  [a, b, limited] = stack.gateways as [GatewayProcess, GatewayProcess, GatewayProcess];
});

/** The headers and body of one 2026-07-28 request with the tasks extension declared. */
function request(method: string, params: Json = {}, token?: string) {
  return modernRequest(method, params, {
    capabilities: { extensions: { [TASKS_EXT]: {} } },
    headers: token ? { authorization: `Bearer ${token}` } : {},
  });
}

function post(
  gateway: GatewayProcess,
  method: string,
  params: Json = {},
  options: { token?: string; signal?: AbortSignal } = {},
) {
  const { id, body, headers } = request(method, params, options.token);
  const init: RequestInit = { method: 'POST', headers, body };
  if (options.signal) init.signal = options.signal;
  return { id, response: fetch(gateway.url, init) };
}

async function result(gateway: GatewayProcess, method: string, params: Json = {}): Promise<Json> {
  const res = await post(gateway, method, params).response;
  const body = (await res.json()) as Json;
  if (body['error']) throw new Error(`${method}: ${JSON.stringify(body['error'])}`);
  return body['result'] as Json;
}

async function createTask(gateway: GatewayProcess, name: string, args: Json): Promise<string> {
  const created = await result(gateway, 'tools/call', { name, arguments: args });
  return String(created['taskId']);
}

const hgetallCalls = async () => Number(/cmdstat_hgetall:calls=(\d+)/.exec(await r.info('commandstats'))?.[1] ?? 0);
const rssMb = (pid: number) =>
  Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;

describe('§18.1 a push across replicas', () => {
  it('brings each task that ends through gateway A to a listen stream on gateway B; an idle stream reads nothing', async () => {
    const count = 20;
    // Ends staggered, so each frame is its own measurement; long enough to measure an idle stretch first.
    const ids = await Promise.all(
      Array.from({ length: count }, (_, i) => createTask(a, 'sleepy', { ms: 2_500 + i * 60, stepMs: 10_000 })),
    );
    const controller = new AbortController();
    const { id: listenId, response } = post(
      b,
      'subscriptions/listen',
      { notifications: { taskIds: ids } },
      { signal: controller.signal },
    );
    const res = await response;
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const latencies: number[] = [];
    const frames: Json[] = [];
    const reading = (async () => {
      for await (const event of readSse(res)) {
        const message = event.data as Json;
        frames.push(message);
        const params = message['params'] as Json | undefined;
        if (message['method'] === 'notifications/tasks' && params?.['status'] === 'completed') {
          latencies.push(Date.now() - Date.parse(String(params['lastUpdatedAt'])));
        }
      }
    })();
    await waitFor(() => frames.filter((f) => f['method'] === 'notifications/tasks').length === count, {
      message: 'the first frame of each task did not come',
    });
    // Once every run has started (a start is a status event), nothing changes for a second and a half.
    await waitFor(async () => (await Promise.all(ids.map((id) => r.hget(keys.task(id), 'attempt')))).every(Boolean), {
      message: 'not every task started',
    });
    // Every task is working: for a second and a half, nothing changes, so nothing needs reading.
    const before = await hgetallCalls();
    // Not stretched by the load: the bound below counts reads in this window, and a longer one takes in the
    // stream's periodic re-read (a 9 s window at load 40 read each task once: 20 reads).
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const idleReads = (await hgetallCalls()) - before;
    await reading;
    controller.abort();

    const sorted = [...latencies].sort((x, y) => x - y);
    const median = sorted[Math.floor(sorted.length / 2)];
    console.log(
      `listen push across replicas: terminal write → frame on the other gateway, median ${median} ms, ` +
        `min ${sorted[0]} ms, max ${sorted.at(-1)} ms (${count} tasks); Redis HGETALLs while idle: ${idleReads}`,
    );
    expect(frames[0]).toMatchObject({
      method: 'notifications/subscriptions/acknowledged',
      params: { notifications: { taskIds: ids } },
    });
    expect(latencies).toHaveLength(count);
    expect(frames.at(-1)).toMatchObject({ id: listenId, result: { resultType: 'complete' } });
    // The 250 ms poll read each of the 20 tasks 6 times in this stretch (120 reads).
    expect(idleReads).toBeLessThan(count);
  });
});

describe('§18.2 frames', () => {
  it("inlines a task's result capped like tasks/get: a result over TASKRELAY_MAX_RESULT_BYTES is an isError result", async () => {
    const taskId = await createTask(a, 'big_result', { bytes: RESULT_CAP * 2, ms: 200 });
    const res = await post(a, 'subscriptions/listen', { notifications: { taskIds: [taskId] } }).response;
    let completed: Json | undefined;
    for await (const event of readSse(res)) {
      const message = event.data as Json;
      if (message['method'] === 'notifications/tasks' && message['params']?.['status'] === 'completed') {
        completed = message;
        expect(JSON.stringify(message).length).toBeLessThan(RESULT_CAP);
      }
    }
    expect(completed?.['params']?.['result']).toMatchObject({
      resultType: 'complete',
      isError: true,
      content: [{ type: 'text', text: expect.stringMatching(/larger than this gateway delivers/) }],
    });
    // tasks/get says the same.
    expect((await result(a, 'tasks/get', { taskId }))['result']).toEqual(completed?.['params']?.['result']);
  });
});

describe('§18.1 a task that ends at once', () => {
  it('ends every stream opened right after its task was created: an end during the first read is not lost', async () => {
    // Before: the status event that came while the listen read its task found no entry yet (2 of 30 hung).
    const runs = 30;
    for (let i = 0; i < runs; i += 10) {
      await Promise.all(
        Array.from({ length: 10 }, async () => {
          const taskId = await createTask(a, 'sleepy', { ms: 1, stepMs: 10_000 });
          const { id, response } = post(
            a,
            'subscriptions/listen',
            { notifications: { taskIds: [taskId] } },
            { signal: AbortSignal.timeout(15_000) },
          );
          const frames: Json[] = [];
          for await (const event of readSse(await response)) frames.push(event.data as Json);
          expect(frames.some((f) => f['params']?.['status'] === 'completed')).toBe(true);
          expect(frames.at(-1)).toMatchObject({ id, result: { resultType: 'complete' } });
        }),
      );
    }
  });
});

describe('§18.3 bounds', () => {
  it('refuses more than 100 task ids in one stream (-32602)', async () => {
    const ids = Array.from({ length: 101 }, (_, i) => i.toString(16).padStart(32, '0'));
    const res = await post(b, 'subscriptions/listen', { notifications: { taskIds: ids } }).response;
    expect(((await res.json()) as Json)['error']).toMatchObject({ code: -32602 });
  });

  it('holds a principal to 32 open listen streams per gateway; closing one makes room', async () => {
    const controllers: AbortController[] = [];
    // Each open stream's Response is kept: undici cancels the body of a Response that is garbage collected, which
    // closed one of the 32 mid-test, let a 33rd through, and failed this test now and then.
    const responses: Response[] = [];
    /** Opens a tools-only listen stream; its answer's content type (an event stream, or JSON with the error). */
    const open = async (gateway: GatewayProcess, step: string) => {
      const controller = new AbortController();
      controllers.push(controller);
      const signal = AbortSignal.any([controller.signal, AbortSignal.timeout(10_000)]);
      const res = await post(
        gateway,
        'subscriptions/listen',
        { notifications: { toolsListChanged: true } },
        { signal },
      ).response.catch((error: unknown) => {
        throw new Error(`${step}: no answer (${String(error)})`);
      });
      responses.push(res);
      const type = res.headers.get('content-type') ?? '';
      return { type, body: type.includes('json') ? ((await res.json()) as Json) : undefined, controller };
    };
    try {
      for (let i = 0; i < 32; i++) expect((await open(a, `stream ${i + 1}`)).type).toContain('text/event-stream');
      const refused = await open(a, 'stream 33');
      expect(refused.body?.['error']).toMatchObject({
        code: -32000,
        message: expect.stringMatching(/^Too many listen streams: at most 32/),
      });
      // Another gateway counts its own.
      expect((await open(b, 'stream 1 on B')).type).toContain('text/event-stream');
      controllers[0]?.abort();
      await waitFor(async () => (await open(a, 'a stream after one closed')).type.includes('text/event-stream'), {
        timeoutMs: 5_000,
        message: 'a closed stream did not make room',
      });
    } finally {
      for (const controller of controllers) controller.abort();
      responses.length = 0;
    }
  });

  it('counts each opening against the task-ops rate limit', async () => {
    const controllers: AbortController[] = [];
    const statuses: number[] = [];
    try {
      for (let i = 0; i < 4; i++) {
        const controller = new AbortController();
        controllers.push(controller);
        const res = await post(
          limited,
          'subscriptions/listen',
          { notifications: { toolsListChanged: true } },
          {
            token: 'alice-token',
            signal: controller.signal,
          },
        ).response;
        statuses.push(res.status);
      }
    } finally {
      for (const controller of controllers) controller.abort();
    }
    expect(statuses).toEqual([200, 200, 200, 429]);
  });

  it('a reader that never reads stays bounded: told with notifications/cancelled naming its request, then closed', async () => {
    const count = 100;
    // 100 × 200 KB final frames (20 MB), all ending at about the same time.
    const ids = await Promise.all(
      Array.from({ length: count }, () => createTask(a, 'big_result', { bytes: 200_000, ms: 1_500 })),
    );
    const { id: listenId, body, headers } = request('subscriptions/listen', { notifications: { taskIds: ids } });
    const rssBefore = rssMb(b.pid);
    const socket: Socket = connect(Number(new URL(b.url).port), '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    const head = Object.entries({
      ...headers,
      host: '127.0.0.1',
      connection: 'close',
      'content-length': String(Buffer.byteLength(body)),
    })
      .map(([k, v]) => `${k}: ${v}`)
      .join('\r\n');
    socket.write(`POST /mcp HTTP/1.1\r\n${head}\r\n\r\n${body}`);
    socket.pause(); // never reads while the tasks end
    await waitFor(
      async () => {
        const got = await Promise.all(ids.map((id) => result(a, 'tasks/get', { taskId: id })));
        return got.every((task) => task['status'] === 'completed');
      },
      { timeoutMs: 30_000, intervalMs: 200, message: 'the big tasks did not complete' },
    );
    await absenceWindow(1_000);
    const rssAfter = rssMb(b.pid);
    const chunks: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    const closed = new Promise((resolve) => socket.once('close', resolve));
    socket.resume();
    await closed;
    const text = Buffer.concat(chunks).toString('utf8');
    const messages = text
      .split('\n')
      .filter((line) => line.startsWith('data: '))
      .map((line) => JSON.parse(line.slice('data: '.length)) as Json);
    const completed = messages.filter(
      (m) => m['method'] === 'notifications/tasks' && m['params']?.['status'] === 'completed',
    );
    console.log(
      `never-reading listen reader: ${completed.length} of ${count} final frames delivered, ${(text.length / 1e6).toFixed(1)} MB read; ` +
        `gateway B RSS ${rssBefore.toFixed(0)} → ${rssAfter.toFixed(0)} MB`,
    );
    expect(messages[0]?.['method']).toBe('notifications/subscriptions/acknowledged');
    expect(completed.length).toBeLessThan(count);
    expect(messages.at(-1)).toMatchObject({
      method: 'notifications/cancelled',
      params: { requestId: listenId, reason: expect.stringMatching(/fell behind/) },
    });
    // The gateway is fine, and serves the same principal again.
    expect((await fetch(new URL('/readyz', b.url))).status).toBe(200);
  });
});

describe('§18.4 endings', () => {
  it('a draining gateway ends a listen stream with notifications/cancelled naming it, then closes it', async () => {
    const draining = await stack.addGateway({
      TASKRELAY_PREFIX: uniquePrefix('listen-drain'),
      GATEWAY_SHUTDOWN_GRACE_MS: '200',
    });
    const taskId = await createTask(a, 'sleepy', { ms: 30_000, stepMs: 10_000 });
    const { id: listenId, response } = post(draining, 'subscriptions/listen', {
      notifications: { taskIds: [taskId], toolsListChanged: true },
    });
    const res = await response;
    const frames: Json[] = [];
    const reading = (async () => {
      for await (const event of readSse(res)) frames.push(event.data as Json);
    })();
    await waitFor(() => frames.length >= 1, { message: 'no acknowledgement' });
    const exited = draining.kill('SIGTERM');
    await reading;
    expect(await exited).toBe(0);
    expect(frames.at(-1)).toMatchObject({
      method: 'notifications/cancelled',
      params: { requestId: listenId, reason: expect.stringMatching(/shutting down/) },
    });
    await result(a, 'tasks/cancel', { taskId });
  });
});

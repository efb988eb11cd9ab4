/**
 * Issue 35 item 2, PROTOCOL.md §32: a tool hands a CI system a waitpoint URL and waits, holding no slot; the CI
 * system's POST resumes it with the body as the value. Real processes: Redis, a gateway, a worker with one slot, the
 * SDK client, and a fake CI system (an HTTP server here) that calls back.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const stack = useStack({
  name: 'waitpoints',
  gateways: [{ TASKRELAY_WAITPOINT_MAX_BYTES: '1024' }],
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/waitpoint-tools.mjs'), WORKER_CONCURRENCY: '1' }],
});

/** The fake CI system: records each pipeline it is asked to start; `immediate` calls back before it answers. */
interface Started {
  callback: string;
  run: number;
}
let ci: Server;
let ciUrl = '';
const started: Started[] = [];
let immediate: unknown;

beforeAll(async () => {
  ci = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      const job = JSON.parse(body) as Started;
      started.push(job);
      const answer = () => {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"pipeline":1}');
      };
      if (immediate === undefined) return answer();
      void callback(job.callback, immediate).then(answer, answer);
    });
  });
  await new Promise<void>((ok) => ci.listen(0, '127.0.0.1', ok));
  ciUrl = `http://127.0.0.1:${(ci.address() as AddressInfo).port}/pipelines`;
});
afterAll(async () => {
  await new Promise((ok) => ci.close(ok));
});

function callback(url: string, body: unknown, contentType = 'application/json') {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': contentType },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  }).then(async (res) => ({ status: res.status, text: await res.text() }));
}

/** Starts a pipeline task and waits for the fake CI to be asked; resolves with the task and the callback URL. */
async function startPipeline(args: Record<string, unknown> = {}) {
  const client = await stack.client();
  const before = started.length;
  const taskId = await startTask(client, 'run_pipeline', { ci: ciUrl, ...args });
  await waitFor(() => started.length > before, { message: 'the CI system was never asked' });
  return { client, taskId, url: started.at(-1)!.callback };
}

describe('§32 waitpoints: a tool waits for a CI-style callback', () => {
  it('suspends without a slot, says it waits, and resumes with the callback body on the same URL', async () => {
    const { client, taskId, url } = await startPipeline();
    expect(url).toMatch(new RegExp(`^http://localhost:\\d+/waitpoints/[\\w-]+\\.\\.[\\w-]+\\.[\\w-]+\\.[\\w-]+$`));
    // The token names nothing of the task.
    expect(url).not.toContain(taskId);
    await waitFor(async () => (await getTask(client, taskId)).statusMessage === 'waiting for an external event (ci)', {
      message: 'the task never said it waits for an external event',
    });
    // The worker's one slot is free while the pipeline waits.
    expect((await taskResult(client, await startTask(client, 'quick', {}))).content).toEqual([
      { type: 'text', text: 'done' },
    ]);
    const posted = await callback(url, { status: 'passed', build: 42 });
    expect(posted).toEqual({ status: 202, text: '{"accepted":true}' });
    const result = await taskResult(client, taskId);
    expect(result.structuredContent).toEqual({
      outcome: { ok: true, value: { status: 'passed', build: 42 } },
      url,
      runs: 2,
    });
    // Single use: a second call is refused, and says nothing of the task.
    const again = await callback(url, { status: 'passed' });
    expect(again.status).toBe(409);
    expect(again.text).not.toContain(taskId);
    expect(again.text).not.toContain('run_pipeline');
  });

  it('resumes when the callback comes before the run has suspended (no lost wake-up)', async () => {
    immediate = { status: 'passed', fast: true };
    try {
      const { client, taskId } = await startPipeline();
      const result = await taskResult(client, taskId);
      expect(result.structuredContent).toMatchObject({
        outcome: { ok: true, value: { status: 'passed', fast: true } },
      });
    } finally {
      immediate = undefined;
    }
  });

  it('gives the tool a timeout outcome, and a later callback 410', async () => {
    const { client, taskId, url } = await startPipeline({ timeoutMs: 1_500 });
    const result = await taskResult(client, taskId);
    expect(result.structuredContent).toMatchObject({ outcome: { ok: false, reason: 'timeout' }, url });
    expect((await callback(url, { late: true })).status).toBe(410);
  });

  it('refuses a wrong token, a body too big or not JSON, and a call after a cancel, each with a clear 4xx', async () => {
    const { client, taskId, url } = await startPipeline();
    const base = url.slice(0, url.lastIndexOf('/') + 1);
    const token = url.slice(base.length);
    const tampered = token.slice(0, -3) + (token.endsWith('AAA') ? 'BBB' : 'AAA');
    for (const wrong of [`${base}nope`, `${base}${tampered}`, `${base}${'x'.repeat(5_000)}`]) {
      const answer = await callback(wrong, { status: 'passed' });
      expect(answer.status, wrong.slice(0, 80)).toBe(404);
      expect(JSON.parse(answer.text)).toEqual({ error: 'unknown waitpoint' });
    }
    expect((await callback(url, { log: 'x'.repeat(2_000) })).status).toBe(413);
    expect((await callback(url, '{"status":', 'application/json')).status).toBe(400);
    expect((await callback(url, 'status=passed', 'application/x-www-form-urlencoded')).status).toBe(415);
    expect((await fetch(url)).status).toBe(405);
    // None of those used it up: the task still waits. A cancel ends it; the URL is then refused with 410.
    expect((await getTask(client, taskId)).status).toBe('working');
    await client.experimental.tasks.cancelTask(taskId);
    await waitFor(async () => (await getTask(client, taskId)).status === 'cancelled');
    expect((await callback(url, { status: 'passed' })).status).toBe(410);
  });
});

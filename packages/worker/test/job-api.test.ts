/**
 * Job-API tools (docs/JOB-API.md, PROTOCOL.md §12.9) run directly against the example fake batch service, with an
 * in-memory stand-in for the durable half of the context (state, step, suspend) that replays runs the way the worker
 * does: a suspended run ends, the next one starts from the top with the stored state.
 */
import { readFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, createLogger, type TaskRecord, type ToolResult } from '@taskrelay/shared';
import { RetryAfterError, SuspendedError } from '../src/errors.js';
import { TaskContext } from '../src/context.js';
import type { ToolDefinition } from '../src/define-tool.js';
import { defineJobApiTool, parseJobApiFile, type JobApiToolDefinition } from '../src/job-api/index.js';
import { getPath, renderString, renderValue } from '../src/job-api/template.js';
import {
  JOB_API_CONFIG,
  startBatchService,
  type BatchService,
  type BatchStats,
} from '../../../test/fixtures/job-api-service.js';
import { stopAll } from '../../../test/helpers/processes.js';
import { waitFor } from '../../../test/helpers/wait-for.js';

interface Driven {
  result?: ToolResult;
  error?: unknown;
  runs: number;
  suspends: number[];
  progress: Array<{ progress: number; total?: number; message?: string }>;
  /** The task's stored step results, as the task hash would hold them. */
  steps: Record<string, unknown>;
}

/**
 * Runs a tool to its end the way the worker does across suspensions (PROTOCOL.md §12.6): each run gets a fresh
 * `TaskContext` over the steps stored so far; a suspended run ends and the next starts from the top after `forMs`.
 * `controller` aborts the current run (a cancel); `cancelledInStore` makes the store refuse durable writes as for a
 * terminal task.
 */
async function drive(
  tool: ToolDefinition,
  args: Record<string, unknown>,
  options: { taskId?: string; controller?: AbortController; cancelledInStore?: () => boolean } = {},
): Promise<Driven> {
  const taskId = options.taskId ?? `task-${Math.random().toString(16).slice(2)}`;
  const controller = options.controller ?? new AbortController();
  const out: Driven = { runs: 0, suspends: [], progress: [], steps: {} };
  const gone = () => options.cancelledInStore?.() ?? false;
  const input = tool.inputSchema.parse(args);
  for (;;) {
    out.runs += 1;
    if (out.runs > 200) throw new Error('too many runs');
    let suspendedFor: number | undefined;
    const ctx = new TaskContext({
      taskId,
      tool: tool.name,
      attempt: out.runs,
      signal: controller.signal,
      store: {
        recordProgress: (_id, update) => {
          out.progress.push(update);
          return Promise.resolve('accepted' as const);
        },
      },
      progressIntervalMs: 0,
      logger: createLogger('worker', { level: 'silent' }),
      record: { steps: structuredClone(out.steps) } as unknown as TaskRecord,
      durable: {
        addTags: () => Promise.resolve('written' as const),
        setState: (_id, _lock, field, value) => {
          if (gone()) return Promise.resolve('gone' as const);
          if (field === 'steps') out.steps = structuredClone(value) as Record<string, unknown>;
          return Promise.resolve('written' as const);
        },
        suspend: () =>
          Promise.resolve(
            gone()
              ? { outcome: 'gone' as const, status: 'cancelled' as const }
              : { outcome: 'suspended' as const, answers: {} },
          ),
      },
    });
    try {
      out.result = (await tool.run(input, ctx)) as ToolResult;
      await ctx.flushProgress();
      return out;
    } catch (error) {
      await ctx.flushProgress();
      if (error instanceof SuspendedError) {
        suspendedFor = ctx.suspension?.kind === 'time' ? ctx.suspension.until - Date.now() : 0;
        out.suspends.push(suspendedFor);
        await new Promise((resolve) => setTimeout(resolve, Math.max(0, suspendedFor ?? 0)));
        continue;
      }
      out.error = error;
      return out;
    }
  }
}

let service: BatchService;
const env = () => ({ BATCH_URL: service.url, BATCH_TOKEN: 'secret-token' });
let tools: Map<string, ToolDefinition>;

beforeAll(async () => {
  service = await startBatchService({ BATCH_TOKEN: 'secret-token' });
  tools = new Map(
    parseJobApiFile(readFileSync(JOB_API_CONFIG, 'utf8'), { yaml: true, env: env() }).map((t) => [t.name, t]),
  );
});
afterAll(() => stopAll());
beforeEach(() => service.control({ reset: true }));

const tool = (name: string) => tools.get(name) as ToolDefinition;

describe('templates and paths', () => {
  const scope = { args: { clip: 'a b/c', n: 3, nested: { x: [1, 2] } }, taskId: 't1', id: 'j/1' };

  it('URL-encodes values inside URLs, and keeps a lone token typed in a body', () => {
    expect(renderString('http://h/jobs/{{id}}?c={{args.clip}}', scope, { encode: true })).toBe(
      'http://h/jobs/j%2F1?c=a%20b%2Fc',
    );
    expect(renderValue({ count: '{{args.n}}', all: '{{args}}', text: 'n={{args.n}}' }, scope)).toEqual({
      count: 3,
      all: scope.args,
      text: 'n=3',
    });
  });

  it('reads dot paths into objects and arrays, and undefined for a missing step', () => {
    expect(getPath({ a: { b: [{ c: 7 }] } }, 'a.b.0.c')).toBe(7);
    expect(getPath({ a: 1 }, 'a.b')).toBeUndefined();
    expect(getPath({ a: 1 }, '.')).toEqual({ a: 1 });
  });
});

describe('the TASKRELAY_JOB_APIS file', () => {
  const minimal = (patch: Record<string, unknown> = {}) =>
    JSON.stringify({
      tools: [
        {
          name: 'render_video',
          description: 'Renders.',
          submit: { url: 'http://127.0.0.1:1/jobs', id: 'job.id' },
          poll: { url: 'http://127.0.0.1:1/jobs/{{id}}', status: 'state', statusMap: { done: 'completed' } },
          ...patch,
        },
      ],
    });
  const error = (text: string, env: Record<string, string> = {}) => {
    try {
      parseJobApiFile(text, { env });
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
      return (e as Error).message;
    }
    throw new Error('accepted');
  };

  it('builds tools whose published inputSchema is the file one', () => {
    const loaded = parseJobApiFile(readFileSync(JOB_API_CONFIG, 'utf8'), { yaml: true, env: env() });
    expect(loaded.map((t) => t.name)).toEqual(['batch_job', 'batch_job_suspending']);
    expect(loaded[0]?.descriptor.inputSchema).toMatchObject({ type: 'object', required: ['label'] });
    expect(loaded[0]?.descriptor.taskSupport).toBe('optional');
  });

  it('names the tool and the field of a bad value, in one line', () => {
    const message = error(minimal({ poll: { url: 'http://h/{{id}}', status: 's', statusMap: { done: 'finished' } } }));
    expect(message).toMatch(/tool render_video: poll\.statusMap\.done: must be one of working, completed/);
    expect(message).not.toMatch(/\n/);
  });

  it('takes the fleet-wide limits a tool takes (PROTOCOL.md §3.3), and names a bad one', () => {
    const [tool] = parseJobApiFile(minimal({ concurrency: 2, rateLimit: { max: 10, perMs: 1000 } }), { env: {} });
    expect(tool?.descriptor).toMatchObject({ concurrency: 2, rateLimit: { max: 10, perMs: 1000 } });
    expect(error(minimal({ concurrency: { limit: 2, key: 'tenant' } }))).toMatch(/tool render_video: concurrency/);
    // Per key (argument names) and shared by name (PROTOCOL.md §3.5).
    const [keyed] = parseJobApiFile(
      minimal({
        inputSchema: { type: 'object', properties: { label: { type: 'string' } } },
        concurrency: { limit: 2, key: ['label'] },
        rateLimit: { max: 10, perMs: 1000, name: 'render-api' },
      }),
      { env: {} },
    );
    expect(keyed?.descriptor).toMatchObject({ concurrencyKey: ['label'], rateLimit: { name: 'render-api' } });
    expect(keyed?.admitted.rate?.scope).toBe('name:render-api');
  });

  it('names an unknown field, an unknown template and a URL that is none', () => {
    expect(error(minimal({ pol: {} }))).toMatch(/tool render_video: pol: unknown field/);
    expect(error(minimal({ cancel: { url: 'http://h/{{jobid}}' } }))).toMatch(
      /tool render_video: cancel\.url: unknown template \{\{jobid\}\}/,
    );
    expect(error(minimal({ cancel: { url: 'render.internal/x' } }))).toMatch(
      /tool render_video: cancel\.url: must be an http/,
    );
    expect(error('{"tools": [{"description": "x"}]}')).toMatch(/tools\.0: name:/);
    expect(error('{"tools": [')).toMatch(/not valid JSON/);
  });

  it('names a missing environment variable and the field that needs it', () => {
    const message = error(minimal({ headers: { Authorization: 'Bearer ${env:RENDER_TOKEN}' } }));
    expect(message).toMatch(/tool render_video: headers\.Authorization needs environment variable RENDER_TOKEN/);
    expect(() =>
      parseJobApiFile(minimal({ headers: { Authorization: 'Bearer ${env:RENDER_TOKEN}' } }), {
        env: { RENDER_TOKEN: 'x' },
      }),
    ).not.toThrow();
  });
});

describe('§12.9 polling an external job', () => {
  it('submits once, reports the upstream progress and returns the result', async () => {
    const pending = drive(tool('batch_job'), { label: 'a', steps: 4, manual: true });
    await waitForStats((s) => s.polls >= 1);
    await service.advance('latest', 2);
    const polled = (await service.stats()).polls;
    await waitForStats((s) => s.polls > polled + 1);
    await service.advance('latest', 2);
    const run = await pending;
    expect(run.error).toBeUndefined();
    expect(run.result?.structuredContent).toMatchObject({ steps: 4, input: { label: 'a', steps: 4 } });
    expect(run.progress).toEqual([
      { progress: 0, total: 4, message: 'step 0 of 4' },
      { progress: 2, total: 4, message: 'step 2 of 4' },
      { progress: 4, total: 4, message: 'finished' },
    ]);
    expect((await service.stats()).submits).toBe(1);
  });

  it('suspends between long polls and replays without a second submit', async () => {
    const pending = drive(tool('batch_job_suspending'), { label: 'b', steps: 3, manual: true });
    await waitForStats((s) => s.polls >= 2);
    await service.advance('latest', 3);
    const run = await pending;
    expect(run.error).toBeUndefined();
    expect(run.runs).toBeGreaterThan(1);
    expect(run.suspends.every((ms) => ms > 100 && ms <= 200)).toBe(true);
    expect(run.result?.structuredContent).toMatchObject({ steps: 3 });
    expect((await service.stats()).submits).toBe(1);
    expect(run.steps).toMatchObject({ submit: { id: expect.any(String), statusUrl: expect.any(String) } });
  });

  it('sends the task id as Idempotency-Key, so a submit repeated after a crash finds the same job', async () => {
    const taskId = 'task-idem';
    await drive(tool('batch_job'), { label: 'c', steps: 1, stepMs: 10 }, { taskId });
    // A run that crashed after the upstream accepted but before the step was stored submits again, same key:
    await drive(tool('batch_job'), { label: 'c', steps: 1, stepMs: 10 }, { taskId });
    expect(await service.stats()).toMatchObject({ submits: 2, jobsCreated: 1 });
  });

  it('fails with the upstream message when the external job fails', async () => {
    const run = await drive(tool('batch_job'), { label: 'd', steps: 2, stepMs: 20, fail: 'render node on fire' });
    expect((run.error as Error).message).toBe('render node on fire');
    expect((run.error as { code?: string }).code).toBe('NON_RETRYABLE');
  });

  it('fails without retry, with the upstream message, on a permanent 4xx', async () => {
    const bad = defineJobApiTool({
      name: 'bad_steps',
      description: 'x',
      inputSchema: z.object({}),
      headers: { Authorization: 'Bearer secret-token' },
      submit: { url: `${service.url}/jobs`, body: { steps: -1 }, id: 'job.id' },
      poll: { url: `${service.url}/jobs/{{id}}`, status: 'state', statusMap: { done: 'completed' } },
    });
    const failed = await drive(bad, {});
    expect((failed.error as Error).message).toMatch(/HTTP 422: steps must be an integer 0\.\.100000/);
    expect((failed.error as { code?: string }).code).toBe('NON_RETRYABLE');
    expect((await service.stats()).submits).toBe(1);
  });

  it('rides out a flaky upstream: 5xx, answers that never come, slow answers', async () => {
    await service.control({ flaky: ['500', 'timeout', 'slow', 'ok', '500', 'ok'], slowMs: 150, hangMs: 5_000 });
    const run = await drive(tool('batch_job'), { label: 'f', steps: 3, stepMs: 50 });
    expect(run.error).toBeUndefined();
    expect(run.result?.structuredContent).toMatchObject({ steps: 3 });
    const stats = await service.stats();
    expect(stats.jobsCreated).toBe(1);
  });

  it('ends the run on a 429 with Retry-After (PROTOCOL.md §3.4): RetryAfterError, not a retry inside the run', async () => {
    await service.control({ flaky: ['429'] });
    const started = Date.now();
    const run = await drive(tool('batch_job'), { label: 'q', steps: 2, stepMs: 20 });
    expect(run.error).toBeInstanceOf(RetryAfterError);
    expect((run.error as RetryAfterError).retryAfterMs).toBe(1_000);
    expect((run.error as Error).message).toMatch(
      /^Upstream asked to retry later: submit POST .*HTTP 429: quota exhausted/,
    );
    // The run did not wait out the second itself (the worker delays the job instead, holding no slot).
    expect(Date.now() - started).toBeLessThan(1_000);
    expect((await service.stats()).jobsCreated).toBe(0);
  });

  it('calls the external cancel once when the task is cancelled, and stops polling', async () => {
    const controller = new AbortController();
    const pending = drive(tool('batch_job'), { label: 'g', steps: 1000, stepMs: 50 }, { controller });
    await waitForStats((s) => s.polls >= 2);
    controller.abort('CLIENT_CANCELLED');
    const run = await pending;
    expect((run.error as { reason?: string }).reason).toBe('CLIENT_CANCELLED');
    const after = await service.stats();
    expect(after.cancels).toBe(1);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect((await service.stats()).polls).toBe(after.polls);
  });

  it('does not cancel the external job when the run only hands its job back (shutdown)', async () => {
    const controller = new AbortController();
    const pending = drive(tool('batch_job'), { label: 'h', steps: 1000, stepMs: 50 }, { controller });
    await waitForStats((s) => s.polls >= 1);
    controller.abort('WORKER_SHUTDOWN');
    const run = await pending;
    expect((run.error as { reason?: string }).reason).toBe('WORKER_SHUTDOWN');
    expect((await service.stats()).cancels).toBe(0);
  });

  it('a cancel seen by the durable write (no abort yet) still cancels the external job', async () => {
    let cancelled = false;
    const pending = drive(
      tool('batch_job_suspending'),
      { label: 'j', steps: 1000, stepMs: 50 },
      { cancelledInStore: () => cancelled },
    );
    await waitForStats((s) => s.polls >= 2);
    cancelled = true;
    const run = await pending;
    expect((run.error as { reason?: string }).reason).toBe('CLIENT_CANCELLED');
    expect((await service.stats()).cancels).toBe(1);
  });

  it('onCancelled cancels the job an earlier run submitted, and does nothing before a submit', async () => {
    const controller = new AbortController();
    const pending = drive(tool('batch_job_suspending'), { label: 'k', steps: 1000, stepMs: 50 }, { controller });
    await waitForStats((s) => s.polls >= 1);
    controller.abort('WORKER_SHUTDOWN');
    const { steps } = await pending;
    const definition = tool('batch_job_suspending') as JobApiToolDefinition;
    const log = createLogger('worker', { level: 'silent' });
    await definition.onCancelled({ taskId: 't-none', arguments: { label: 'k' }, steps: {}, state: undefined, log });
    expect((await service.stats()).cancels).toBe(0);
    await definition.onCancelled({ taskId: 't-k', arguments: { label: 'k' }, steps, state: undefined, log });
    expect((await service.stats()).cancels).toBe(1);
  });

  it('returns a non-JSON result as text, and sends query parameters', async () => {
    const urls: string[] = [];
    const textual = defineJobApiTool({
      name: 'textual',
      description: 'x',
      inputSchema: z.object({ label: z.string() }),
      headers: { Authorization: 'Bearer secret-token' },
      submit: { url: `${service.url}/jobs`, id: 'job.id', body: { label: '{{args.label}}', steps: 1, stepMs: 10 } },
      poll: {
        url: `${service.url}/jobs/{{id}}`,
        query: { verbose: true, who: '{{args.label}}' },
        intervalMs: 20,
        status: 'state',
        statusMap: { done: 'completed', queued: 'working', running: 'working' },
      },
      result: { url: `${service.url}/jobs/{{id}}/log`, format: 'text' },
      hooks: {
        fetch: (input, init) => {
          urls.push(String(input));
          return fetch(input, init);
        },
      },
    });
    const run = await drive(textual, { label: 'a&b' });
    expect(run.result?.content).toEqual([
      { type: 'text', text: expect.stringMatching(/^job .*: done after 1 of 1 steps\n$/) },
    ]);
    expect(run.result?.structuredContent).toEqual({ value: expect.stringMatching(/done after 1 of 1/) });
    expect(urls.some((u) => u.endsWith('?verbose=true&who=a%26b'))).toBe(true);
  });

  it('gives up on a job that runs past poll.maxWaitMs, cancelling it upstream', async () => {
    const impatient = defineJobApiTool({
      name: 'impatient',
      description: 'x',
      inputSchema: z.object({}),
      headers: { Authorization: 'Bearer secret-token' },
      submit: { url: `${service.url}/jobs`, id: 'job.id', body: { steps: 1000, stepMs: 50 } },
      poll: {
        url: `${service.url}/jobs/{{id}}`,
        intervalMs: 20,
        maxWaitMs: 200,
        status: 'state',
        statusMap: { done: 'completed', queued: 'working', running: 'working' },
      },
      cancel: { url: `${service.url}/jobs/{{id}}` },
    });
    const run = await drive(impatient, {});
    expect((run.error as Error).message).toMatch(/did not end within 200 ms/);
    expect((await service.stats()).cancels).toBe(1);
  });

  it('lets a request hook sign every request (custom auth)', async () => {
    const signed = defineJobApiTool({
      name: 'signed',
      description: 'x',
      inputSchema: z.object({ label: z.string() }),
      submit: { url: `${service.url}/jobs`, id: 'job.id', body: { label: '{{args.label}}', steps: 1, stepMs: 10 } },
      poll: {
        url: `${service.url}/jobs/{{id}}`,
        intervalMs: 20,
        status: 'state',
        statusMap: { done: 'completed', queued: 'working', running: 'working' },
      },
      result: { path: 'state' },
      hooks: {
        request: (request) => ({ ...request, headers: { ...request.headers, authorization: 'Bearer secret-token' } }),
      },
    });
    const run = await drive(signed, { label: 'i' });
    expect(run.error).toBeUndefined();
    expect(run.result?.structuredContent).toEqual({ value: 'done' });
  });
});

async function waitForStats(condition: (s: BatchStats) => boolean): Promise<void> {
  await waitFor(async () => condition(await service.stats()), { message: 'batch service counters' });
}

// ---- §23: what the adapter sends, and where ------------------------------------------------------------------------

interface Seen {
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** A local upstream that records every request and answers with `answer` (default: a job that is done). */
async function startUpstream(
  answer?: (req: Seen, res: ServerResponse) => boolean | void,
): Promise<{ url: string; host: string; seen: Seen[]; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      const request: Seen = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body };
      seen.push(request);
      if (answer?.(request, res)) return;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ job: { id: 'j1' }, state: 'done', output: { ok: true } }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    host: `127.0.0.1:${port}`,
    seen,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** One job-API tool from a file entry, as `TASKRELAY_JOB_APIS` would load it. */
function fileTool(entry: Record<string, unknown>): ToolDefinition {
  const [loaded] = parseJobApiFile(
    JSON.stringify({
      tools: [
        {
          name: 'render',
          description: 'Renders.',
          inputSchema: { type: 'object', properties: { clip: { type: 'string' } } },
          headers: { Authorization: 'Bearer sekrit', 'X-Api-Key': 'k-123' },
          ...entry,
        },
      ],
    }),
  );
  return loaded as ToolDefinition;
}

const pollDone = (url: string) => ({ url, intervalMs: 10, status: 'state', statusMap: { done: 'completed' } });
const secretHeaders = (seen: Seen) => ({
  authorization: seen.headers['authorization'],
  key: seen.headers['x-api-key'],
});

describe('§23.1 only declared arguments reach the upstream', () => {
  it('the default {{args}} body carries the declared arguments only, nested ones too', async () => {
    const up = await startUpstream();
    try {
      const render = fileTool({
        inputSchema: {
          type: 'object',
          properties: {
            clip: { type: 'string' },
            options: { type: 'object', properties: { fps: { type: 'integer' } } },
            tags: { type: 'array', items: { type: 'object', properties: { name: { type: 'string' } } } },
            extra: { type: 'object' },
          },
        },
        submit: { url: `${up.url}/jobs`, id: 'job.id' },
        poll: pollDone(`${up.url}/jobs/{{id}}`),
      });
      const run = await drive(render, {
        clip: 'a',
        callback_url: 'http://evil.example/hook',
        owner: 'mallory',
        options: { fps: 24, webhook: 'http://evil.example' },
        tags: [{ name: 't', admin: true }],
        extra: { anything: 1 },
      });
      expect(run.error).toBeUndefined();
      expect(JSON.parse(up.seen[0]?.body ?? 'null')).toEqual({
        clip: 'a',
        options: { fps: 24 },
        tags: [{ name: 't' }],
        extra: { anything: 1 },
      });
    } finally {
      await up.close();
    }
  });

  it('a schema that declares nothing forwards nothing', async () => {
    const up = await startUpstream();
    try {
      const bare = fileTool({
        inputSchema: { type: 'object' },
        submit: { url: `${up.url}/jobs`, id: 'job.id' },
        poll: pollDone(`${up.url}/jobs/{{id}}`),
      });
      await drive(bare, { owner: 'mallory' });
      expect(JSON.parse(up.seen[0]?.body ?? 'null')).toEqual({});
    } finally {
      await up.close();
    }
  });
});

describe('§23.2 values in URL paths cannot climb', () => {
  it('refuses ".", "..", "", a "/" or "\\" and their encodings in a path segment, sending nothing', async () => {
    const up = await startUpstream();
    try {
      const render = fileTool({
        submit: { url: `${up.url}/api/v1/clips/{{args.clip}}/render`, id: 'job.id' },
        poll: pollDone(`${up.url}/jobs/{{id}}`),
      });
      for (const clip of ['..', '.', '', 'a/b', 'a\\b', '%2e%2e', '%2E.', '%2F', '%252e%252e', '..%2f', '%5c']) {
        const run = await drive(render, { clip });
        expect((run.error as Error | undefined)?.message, clip).toMatch(
          /^Refused to send the submit request: \{\{args\.clip\}\} gives the URL path segment/,
        );
        expect((run.error as { code?: string }).code).toBe('NON_RETRYABLE');
      }
      expect(up.seen).toEqual([]);
      const fine = await drive(render, { clip: 'a..b c' });
      expect(fine.error).toBeUndefined();
      expect(up.seen[0]?.url).toBe('/api/v1/clips/a..b%20c/render');
    } finally {
      await up.close();
    }
  });

  it('checks an upstream id in a path the same way, and lets a query value be anything', async () => {
    const up = await startUpstream((req, res) => {
      if (req.method !== 'POST') return false;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ job: { id: '..' } }));
      return true;
    });
    try {
      const render = fileTool({
        submit: { url: `${up.url}/jobs?clip={{args.clip}}`, id: 'job.id' },
        poll: pollDone(`${up.url}/jobs/{{id}}/status`),
      });
      const run = await drive(render, { clip: '../..' });
      expect(up.seen.map((s) => s.url)).toEqual(['/jobs?clip=..%2F..']);
      expect((run.error as Error).message).toMatch(/poll request: \{\{id\}\} gives the URL path segment "\.\."/);
    } finally {
      await up.close();
    }
  });

  it('refuses, at load, a template in a URL host', () => {
    expect(() =>
      fileTool({
        submit: { url: 'http://{{args.clip}}.render.internal/jobs', id: 'job.id' },
        poll: pollDone('http://render.internal/jobs/{{id}}'),
      }),
    ).toThrow(/tool render: submit\.url: must name its host itself/);
  });
});

describe('§23.3 secrets go only to the hosts the file names; §23.4 redirects', () => {
  it('a redirect is not followed by default: the tool fails naming it, and the other host sees nothing', async () => {
    const other = await startUpstream();
    const up = await startUpstream((req, res) => {
      res.writeHead(307, { location: `${other.url}/steal` });
      res.end();
      return true;
    });
    try {
      const render = fileTool({
        submit: { url: `${up.url}/jobs`, id: 'job.id' },
        poll: pollDone(`${up.url}/j/{{id}}`),
      });
      const run = await drive(render, { clip: 'a' });
      expect((run.error as Error).message).toMatch(
        /submit POST http:\/\/127\.0\.0\.1:\d+\/jobs answered HTTP 307, a redirect to http:\/\/127\.0\.0\.1:\d+\/steal; redirects are not followed/,
      );
      expect(up.seen).toHaveLength(1);
      expect(other.seen).toEqual([]);
    } finally {
      await Promise.all([up.close(), other.close()]);
    }
  });

  it('http.redirects: follow re-sends to another host without the secret headers, and to its own host with them', async () => {
    const other = await startUpstream();
    const up = await startUpstream((req, res) => {
      if (req.url === '/jobs') {
        res.writeHead(307, { location: '/jobs-here' });
        res.end();
        return true;
      }
      if (req.url === '/jobs-here') {
        res.writeHead(307, { location: `${other.url}/jobs-there` });
        res.end();
        return true;
      }
      return false;
    });
    try {
      const render = fileTool({
        http: { redirects: 'follow' },
        submit: { url: `${up.url}/jobs`, id: 'job.id' },
        poll: pollDone(`${up.url}/j/{{id}}`),
      });
      const run = await drive(render, { clip: 'a' });
      expect(run.error).toBeUndefined();
      expect(up.seen.slice(0, 2).map((s) => [s.url, secretHeaders(s)])).toEqual([
        ['/jobs', { authorization: 'Bearer sekrit', key: 'k-123' }],
        ['/jobs-here', { authorization: 'Bearer sekrit', key: 'k-123' }],
      ]);
      const there = other.seen[0] as Seen;
      expect([there.method, there.url, secretHeaders(there), JSON.parse(there.body)]).toEqual([
        'POST',
        '/jobs-there',
        { authorization: undefined, key: undefined },
        { clip: 'a' },
      ]);
      expect(there.headers['idempotency-key']).toEqual(expect.any(String));
    } finally {
      await Promise.all([up.close(), other.close()]);
    }
  });

  it('a status URL on another host is polled without the secrets, unless http.trustedHosts names it', async () => {
    const other = await startUpstream();
    const up = await startUpstream((req, res) => {
      res.writeHead(202, { location: `${other.url}/status/1`, 'content-type': 'application/json' });
      res.end(JSON.stringify({ job: { id: 'j1' } }));
      return true;
    });
    try {
      const entry = {
        submit: { url: `${up.url}/jobs`, statusUrl: 'header:Location', id: 'job.id' },
        poll: { intervalMs: 10, query: { token: 'q-secret' }, status: 'state', statusMap: { done: 'completed' } },
      };
      const untrusted = await drive(fileTool(entry), { clip: 'a' });
      expect(untrusted.error).toBeUndefined();
      expect(secretHeaders(up.seen[0] as Seen)).toEqual({ authorization: 'Bearer sekrit', key: 'k-123' });
      expect(other.seen.map((s) => [s.url, secretHeaders(s)])).toEqual([
        ['/status/1', { authorization: undefined, key: undefined }],
      ]);

      const trusted = await drive(fileTool({ ...entry, http: { trustedHosts: [other.host] } }), { clip: 'a' });
      expect(trusted.error).toBeUndefined();
      expect(other.seen.slice(1).map((s) => [s.url, secretHeaders(s)])).toEqual([
        ['/status/1?token=q-secret', { authorization: 'Bearer sekrit', key: 'k-123' }],
      ]);
    } finally {
      await Promise.all([up.close(), other.close()]);
    }
  });

  it('a request hook’s auth is stripped too on the way to a host the tool does not name', async () => {
    const other = await startUpstream();
    const up = await startUpstream((req, res) => {
      res.writeHead(202, { location: `${other.url}/status/1` });
      res.end('{}');
      return true;
    });
    try {
      const hooked = defineJobApiTool({
        name: 'hooked',
        description: 'x',
        inputSchema: z.object({}),
        submit: { url: `${up.url}/jobs`, statusUrl: 'header:Location' },
        poll: { intervalMs: 10, status: 'state', statusMap: { done: 'completed' } },
        hooks: { request: (request) => ({ ...request, headers: { ...request.headers, authorization: 'Bearer h' } }) },
      });
      const run = await drive(hooked, {});
      expect(run.error).toBeUndefined();
      expect(up.seen[0]?.headers['authorization']).toBe('Bearer h');
      expect(other.seen[0]?.headers['authorization']).toBeUndefined();
    } finally {
      await Promise.all([up.close(), other.close()]);
    }
  });
});

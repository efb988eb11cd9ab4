/**
 * Job-API tools (docs/JOB-API.md, PROTOCOL.md §12.9) run directly against the example fake batch service, with an
 * in-memory stand-in for the durable half of the context (state, step, suspend) that replays runs the way the worker
 * does: a suspended run ends, the next one starts from the top with the stored state.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, createLogger, type TaskRecord, type ToolResult } from '@taskrelay/shared';
import { SuspendedError } from '../src/errors.js';
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

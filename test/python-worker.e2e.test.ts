/**
 * Issue 33, PROTOCOL.md §29: Python workers (`python -m taskrelay_worker`) serve tools from the same queues, task store
 * and protocol as the Node workers, behind one gateway. Real processes: Redis, a Node gateway, a Node worker (the demo
 * tools) and Python workers serving test/fixtures/python_tools.py. Skipped, with one line, when no Python with
 * taskrelay-worker is installed (`npm test` and `.ci/run` make `.venv` when Python 3.11+ is present).
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { ElicitRequestSchema, type ProgressNotification } from '@modelcontextprotocol/sdk/types.js';
import { createKeys, scriptsGeneration } from '@taskrelay/shared';
import { uniquePrefix } from './helpers/redis.js';
import { PYTHON, ROOT, spawnProcess, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';
import { scaled } from './helpers/load.js';
import { expectStartsLogged, redisNowMs, startedTakes, takesByJob, watchStartLog } from './helpers/rate-starts.js';

const PY_TOOLS = resolve(ROOT, 'test/fixtures/python_tools.py');
const BATCH_TOOLS = resolve(ROOT, 'test/fixtures/batch-tools.mjs');
/** A short lock: a SIGKILLed worker's job is back in the queue within 5/6 of it (§10.5). */
const LOCK_MS = 3_000;

if (PYTHON === undefined) {
  console.log('python-worker suite skipped: no .venv/bin/python with taskrelay-worker (needs Python 3.11+)');
}

describe.skipIf(PYTHON === undefined)('§29 Python workers behind the gateway', () => {
  const stack = useStack({
    name: 'python',
    env: { WORKER_LOCK_DURATION_MS: String(LOCK_MS), WORKER_SHUTDOWN_GRACE_MS: '300' },
    workers: [{}, { TASKRELAY_TOOLS: BATCH_TOOLS, TASKRELAY_QUEUE: 'batches' }],
    pythonWorkers: [{ TASKRELAY_TOOLS: PY_TOOLS }, { TASKRELAY_TOOLS: PY_TOOLS }],
  });
  let client: Client;
  const progress: ProgressNotification['params'][] = [];
  /** Called for each elicitation/create; the default accepts with a name. */
  let onElicit: (taskId: string) => Promise<void> = () => Promise.resolve();

  const addPython = (extra: Record<string, string> = {}) =>
    stack.addPythonWorker({ TASKRELAY_TOOLS: PY_TOOLS, ...extra });
  const alive = () => stack.pythonWorkers.filter((p) => p.child.exitCode === null && p.child.signalCode === null);
  /** The Python worker whose log says it started `taskId`'s tool (attempt `attempt`). */
  const runnerOf = (taskId: string, attempt = 1) =>
    alive().find((p) =>
      p.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started' && l['attempt'] === attempt),
    );

  beforeAll(async () => {
    client = await stack.client({}, undefined, {
      capabilities: { elicitation: {} },
      progress,
      before(c) {
        c.setRequestHandler(ElicitRequestSchema, async (request) => {
          const related = request.params._meta?.['io.modelcontextprotocol/related-task'] as
            { taskId?: string } | undefined;
          await onElicit(related?.taskId ?? '');
          return { action: 'accept', content: { name: 'Ada' } };
        });
      },
    });
  });

  it('lists the Python tools with their schemas beside the Node tools, and routes calls to both', async () => {
    const { tools } = await client.listTools();
    const count = tools.find((t) => t.name === 'py_count');
    expect(count?.inputSchema).toMatchObject({ type: 'object', required: ['n'] });
    expect(tools.map((t) => t.name)).toEqual(expect.arrayContaining(['py_count', 'py_ask', 'build_report']));
    const py = await taskResult(client, await startTask(client, 'py_count', { n: 2, delay_ms: 1 }));
    expect(py.structuredContent).toEqual({ counted: 2, attempt: 1 });
    const failed = await taskResult(client, await startTask(client, 'py_bad', {}));
    expect(failed).toMatchObject({ isError: true, content: [{ type: 'text', text: 'bad input upstream' }] });
  });

  it('§25.2 a Python tool’s dedupe joins a repeat of an unfinished call, as a Node tool’s does', async () => {
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name)).toContain('py_deduped');
    const first = await startTask(client, 'py_deduped', { report: 'q3', ms: 1500 });
    // `ms` is not in the key: the same report joins the unfinished call; another report starts anew.
    expect(await startTask(client, 'py_deduped', { report: 'q3', ms: 0 })).toBe(first);
    const other = await startTask(client, 'py_deduped', { report: 'q4', ms: 0 });
    expect(other).not.toBe(first);
    expect((await taskResult(client, first)).structuredContent).toEqual({ report: 'q3' });
    expect((await taskResult(client, other)).structuredContent).toEqual({ report: 'q4' });
    // Once it ended, the same call starts anew.
    expect(await startTask(client, 'py_deduped', { report: 'q3', ms: 0 })).not.toBe(first);
  });

  it('§30.4 keeps a Python tool’s ctx.log lines with its task, each with its attempt, a long one cut', async () => {
    const taskId = await startTask(client, 'py_count', { n: 2, delay_ms: 1 });
    await taskResult(client, taskId);
    const res = await fetch(`${stack.gateway.url.replace(/\/mcp$/, '')}/admin/api/tasks/${taskId}/logs`);
    expect(res.status).toBe(200);
    const { lines } = (await res.json()) as { lines: Array<Record<string, unknown>> };
    expect(lines).toMatchObject([
      { level: 'info', msg: 'counting', n: 2, attempt: 1 },
      { level: 'warn', msg: expect.stringMatching(/^counted x+… \(cut: the line was over 2048 bytes\)$/), attempt: 1 },
    ]);
    // The engine's own lines (`tool started`, …) are not the tool's: they stay on stdout only.
    expect(lines).toHaveLength(2);
  });

  it('§32 a Python tool waits on a waitpoint without a slot and resumes from a CI-style callback', async () => {
    // The fake CI system: asked to start a pipeline, it calls the tool's waitpoint back once the run has suspended.
    const calls: string[] = [];
    const ci = createServer((req, res) => {
      let body = '';
      req.on('data', (chunk: Buffer) => (body += chunk.toString()));
      req.on('end', () => {
        calls.push((JSON.parse(body) as { callback: string }).callback);
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((ok) => ci.listen(0, '127.0.0.1', ok));
    try {
      const ciUrl = `http://127.0.0.1:${(ci.address() as AddressInfo).port}/`;
      const taskId = await startTask(client, 'py_pipeline', { ci: ciUrl });
      await waitFor(
        async () => (await getTask(client, taskId)).statusMessage === 'waiting for an external event (ci)',
        { message: 'the Python run never said it waits for an external event' },
      );
      expect(calls).toHaveLength(1);
      // A Python-sealed token opens on the Node gateway: one deployment key, one format.
      const posted = await fetch(calls[0]!, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ status: 'passed' }),
      });
      expect(posted.status).toBe(202);
      const result = await taskResult(client, taskId);
      expect(result.structuredContent).toEqual({
        outcome: { ok: true, value: { status: 'passed' } },
        url: calls[0],
        runs: 2,
      });
    } finally {
      await new Promise((ok) => ci.close(ok));
    }
  });

  it('§6 progress of parallel calls reaches each caller on its own token, in order, up to n/n', async () => {
    const tokens = ['py-a', 'py-b', 'py-c'];
    const ids = await Promise.all(
      tokens.map((token, i) => startTask(client, 'py_count', { n: 4 + i, delay_ms: 60 }, { progressToken: token })),
    );
    const results = await Promise.all(ids.map((id) => taskResult(client, id)));
    results.forEach((r, i) => expect(r.structuredContent).toMatchObject({ counted: 4 + i }));
    await waitFor(() => tokens.every((t, i) => progress.some((p) => p.progressToken === t && p.progress === 4 + i)));
    for (const [i, token] of tokens.entries()) {
      const mine = progress.filter((p) => p.progressToken === token);
      const values = mine.map((p) => p.progress);
      expect(values, `token ${token}`).toEqual([...values].sort((a, b) => a - b));
      expect(new Set(values).size).toBe(values.length);
      expect(mine.every((p) => p.total === 4 + i)).toBe(true);
      expect(values.at(-1)).toBe(4 + i);
    }
  });

  it('§26 a Node parent fans out to a Python child tool: each child recorded once, failures included', async () => {
    const items = Array.from({ length: 6 }, (_, n) => ({ n, delayMs: 20, ...(n === 4 ? { fail: true } : {}) }));
    const taskId = await startTask(client, 'fan_out', { items, tool: 'py_child' }, { progressToken: 'py-batch' });
    const result = await taskResult(client, taskId, 30_000);
    const batch = result.structuredContent as {
      completed: number;
      failed: number;
      outcomes: Array<{ index: number; status: string; error?: string }>;
    };
    expect(batch).toMatchObject({ total: 6, completed: 5, failed: 1 });
    expect(batch.outcomes.map((o) => o.status)).toEqual([
      'completed',
      'completed',
      'completed',
      'completed',
      'failed',
      'completed',
    ]);
    expect(batch.outcomes[4]?.error).toBe('child 4 failed as asked');
    const started = alive()
      .flatMap((p) => p.logs())
      .filter((l) => l['parentId'] === taskId && l['msg'] === 'batch child started');
    expect(started).toHaveLength(6);
  });

  it('§3.3 §25 a Python tool’s concurrency limit holds fleet-wide, and its runs leave the fair share', async () => {
    const keys = createKeys(stack.prefix);
    const ids: string[] = [];
    for (let i = 0; i < 3; i += 1) ids.push(await startTask(client, 'py_limited', { ms: 1_500 }));
    const queue = (await stack.r.hget(keys.task(ids[2]!), 'queue')) ?? '';
    expect(queue).toMatch(/~py_limited$/);
    await waitFor(
      async () =>
        (await client.experimental.tasks.getTask(ids[2]!)).statusMessage?.startsWith('Waiting for a slot') === true,
      {
        message: 'the third run never said it waits for a slot',
      },
    );
    // While runs wait, the principal's waiting jobs are in its fair share of the queue (§25)…
    const waiting = await stack.r.keys(`${stack.prefix}:fair:${queue}:*`);
    expect((await Promise.all(waiting.map((k) => stack.r.zcard(k)))).reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    await Promise.all(ids.map((id) => taskResult(client, id)));
    const spans = ids.map((id) => {
      const lines = alive()
        .flatMap((p) => p.logs())
        .filter((l) => l['taskId'] === id);
      const start = lines.find((l) => l['msg'] === 'tool started')?.['time'] as number;
      const end = lines.find((l) => l['msg'] === 'task completed')?.['time'] as number;
      return [start, end] as const;
    });
    spans.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < spans.length; i += 1) expect(spans[i]![0]).toBeGreaterThanOrEqual(spans[i - 1]![1] - 5);
    // …and each run's start took its job out of it.
    for (const share of waiting) expect(await stack.r.zcard(share)).toBe(0);
  });

  it('§3.3 a Python tool’s rate limit holds in any second, also across BullMQ’s fixed window edge', async () => {
    // As test/tool-controls.e2e.test.ts does for a Node tool, on the two Python workers: a, then b 600 ms into a's
    // BullMQ window, then four more queued at 900 ms. BullMQ alone takes two of them as the window ends, within about
    // 400 ms of b; the start log and the hold a full log sets keep any three starts at least a second apart (the
    // hold's marker, which wakes bullmq-Python's Workers at its end, is test_bullmq_adapter.py's).
    const keys = createKeys(stack.prefix);
    const started = (id: string) =>
      waitFor(async () => runnerOf(id) !== undefined, { timeoutMs: 10_000, message: `run of ${id} never started` });
    const log = watchStartLog(stack.r, stack.prefix, 'py_throttled');
    const a = await startTask(client, 'py_throttled', {});
    await started(a);
    const queue = (await stack.r.hget(keys.task(a), 'queue')) ?? '';
    expect(queue).toMatch(/~py_throttled$/);
    const takes = (ids: string[]) => startedTakes(stack.r, `${stack.prefix}:q-${queue}:events`, ids);
    const [aTaken] = await takes([a]);
    await delay(Math.max(0, aTaken! + 600 - (await redisNowMs(stack.r))));
    const b = await startTask(client, 'py_throttled', {});
    await started(b);
    await delay(300);
    const later: string[] = [];
    for (let i = 0; i < 4; i++) later.push(await startTask(client, 'py_throttled', {}));
    const all = [a, b, ...later];
    for (const id of all) expect((await taskResult(client, id, 30_000)).isError).toBeFalsy();
    const counted = await log.stop();
    const eventsKey = `${stack.prefix}:q-${queue}:events`;
    expect(expectStartsLogged(counted, await takesByJob(stack.r, eventsKey, all), 2, 1_000)).toHaveLength(all.length);
    const starts = await takes(all);
    // The backlog still got its 2 a second: no Worker slept to its block timeout (5 s) after a hold.
    expect(starts.at(-1)! - starts[0]!).toBeLessThan(scaled(4_500));
  });

  it('§3.5 a Python tool’s concurrency per key holds fleet-wide, one tenant beside another', async () => {
    const acme: string[] = [];
    for (let i = 0; i < 3; i += 1) acme.push(await startTask(client, 'py_per_tenant', { tenant: 'acme', ms: 800 }));
    const globex = await startTask(client, 'py_per_tenant', { tenant: 'globex', ms: 800 });
    await waitFor(
      async () => {
        const messages = await Promise.all(
          acme.map(async (id) => (await client.experimental.tasks.getTask(id)).statusMessage ?? ''),
        );
        return messages.some((m) =>
          m.startsWith('Waiting for a slot: tool py_per_tenant runs at most 1 at once per tenant'),
        );
      },
      { message: 'no waiting acme run said it waits for a slot' },
    );
    await Promise.all([...acme, globex].map((id) => taskResult(client, id, 30_000)));
    const spanOf = (id: string) => {
      const lines = alive()
        .flatMap((p) => p.logs())
        .filter((l) => l['taskId'] === id);
      const starts = lines.filter((l) => l['msg'] === 'tool started').map((l) => l['time'] as number);
      const end = lines.find((l) => l['msg'] === 'task completed')?.['time'] as number;
      return [Math.max(...starts), end] as const;
    };
    const spans = acme.map(spanOf).sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < spans.length; i += 1) expect(spans[i]![0]).toBeGreaterThanOrEqual(spans[i - 1]![1] - 5);
    // Another tenant does not wait for acme: globex ran while an acme run did.
    const [gStart, gEnd] = spanOf(globex);
    expect(spans.some(([start, end]) => start < gEnd && gStart < end)).toBe(true);
  });

  it('§7 tasks/cancel stops a Python run cooperatively, and its job never runs again', async () => {
    const taskId = await startTask(client, 'py_slow', { seconds: 30 }, { progressToken: 'py-cancel' });
    await waitFor(() => progress.some((p) => p.progressToken === 'py-cancel'));
    const runner = runnerOf(taskId);
    expect(runner).toBeDefined();
    const cancelled = await client.experimental.tasks.cancelTask(taskId);
    expect(cancelled.status).toBe('cancelled');
    await waitFor(
      () =>
        runner!
          .logs()
          .some(
            (l) => l['taskId'] === taskId && l['msg'] === 'tool signal aborted' && l['reason'] === 'CLIENT_CANCELLED',
          ),
      { timeoutMs: 2_000, message: 'the Python run was not aborted within the cancel bound' },
    );
    await delay(scaled(300));
    const started = stack.pythonWorkers
      .flatMap((p) => p.logs())
      .filter((l) => l['taskId'] === taskId && l['msg'] === 'tool started');
    expect(started).toHaveLength(1);
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('cancelled');
  });

  it('§12 a question suspends the run without a slot and resumes on another Python worker', async () => {
    let asker: ManagedProcess | undefined;
    onElicit = async (taskId) => {
      // The worker that asked stops before the answer: the resume can only run on the other one.
      // The question can reach the client before the worker has logged its suspension: wait for the log line.
      await waitFor(() => {
        asker = stack.pythonWorkers.find((p) =>
          p
            .logs()
            .some((l) => l['taskId'] === taskId && l['msg'] === 'run suspended until the input request is answered'),
        );
        return asker !== undefined;
      });
      await asker?.kill('SIGTERM');
    };
    try {
      const taskId = await startTask(client, 'py_ask', {});
      const result = await taskResult(client, taskId, 30_000);
      expect(result.structuredContent).toEqual({ greeting: 'Hello, Ada', attempt: 2 });
      expect(asker).toBeDefined();
      expect(await asker!.exited).toBe(0);
      const resumedOn = runnerOf(taskId, 2);
      expect(resumedOn).toBeDefined();
      expect(resumedOn).not.toBe(asker);
    } finally {
      onElicit = () => Promise.resolve();
      await addPython();
    }
  });

  it('§10.5 a SIGKILLed Python worker’s job is taken over within the lock duration and completes once', async () => {
    try {
      const taskId = await startTask(client, 'py_slow', { seconds: 1.5 }, { progressToken: 'py-kill' });
      await waitFor(() => progress.some((p) => p.progressToken === 'py-kill'));
      const victim = runnerOf(taskId);
      expect(victim).toBeDefined();
      const killedAt = Date.now();
      await victim!.kill('SIGKILL');
      const result = await taskResult(client, taskId, 30_000);
      expect(result.structuredContent).toMatchObject({ slept: 1.5 });
      const survivor = runnerOf(taskId, 2);
      expect(survivor).toBeDefined();
      const takenAt = survivor!
        .logs()
        .find((l) => l['taskId'] === taskId && l['msg'] === 'tool started' && l['attempt'] === 2)?.['time'] as number;
      expect(takenAt - killedAt).toBeLessThan(scaled(LOCK_MS + 1_000));
      // The worker logs its completion right after the write that answered the client: wait for the line.
      const completions = () =>
        alive()
          .flatMap((p) => p.logs())
          .filter((l) => l['taskId'] === taskId && l['msg'] === 'task completed');
      await waitFor(() => completions().length > 0);
      await delay(scaled(200));
      expect(completions()).toHaveLength(1);
    } finally {
      await addPython();
    }
  });

  it('§5.7 SIGTERM drains: the running job is handed back and finishes on another worker', async () => {
    try {
      const taskId = await startTask(client, 'py_slow', { seconds: 2 }, { progressToken: 'py-term' });
      await waitFor(() => progress.some((p) => p.progressToken === 'py-term'));
      const draining = runnerOf(taskId);
      expect(draining).toBeDefined();
      expect(await draining!.kill('SIGTERM')).toBe(0);
      // 'exit' can come before the last of its output: wait for the line.
      await waitFor(() =>
        draining!
          .logs()
          .some(
            (l) => l['taskId'] === taskId && l['msg'] === 'job put back, at the front of its queue, for another worker',
          ),
      );
      const result = await taskResult(client, taskId, 30_000);
      expect(result.structuredContent).toMatchObject({ slept: 2, attempt: 2 });
    } finally {
      await addPython();
    }
  });

  it('§12.11 a deploy of a Python tool between a question and its answer applies its onVersionChange', async () => {
    const versioned = (v: number) => ({
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_versioned.py'),
      PY_TOOL_VERSION: String(v),
    });
    const v1 = await addPython(versioned(1));
    // The client holds its answer until build 2 is up.
    let release: () => void = () => undefined;
    const deployed = new Promise<void>((resolve) => (release = resolve));
    onElicit = () => deployed;
    const taskId = await startTask(client, 'py_versioned', {});
    await waitFor(async () => (await client.experimental.tasks.getTask(taskId)).status === 'input_required');
    expect(await stack.r.hget(createKeys(stack.prefix).task(taskId), 'toolVersion')).toBe('1');
    expect(await v1.kill('SIGTERM')).toBe(0);
    const v2 = await addPython(versioned(2));
    release();
    try {
      // Build 1's question is answered; build 2 restarts the task (onVersionChange: restart) and asks again.
      const result = await taskResult(client, taskId, 30_000);
      expect(result.structuredContent).toEqual({ version: 2, prepared: { by: 2 }, name: 'Ada' });
      const hash = await stack.r.hgetall(createKeys(stack.prefix).task(taskId));
      expect(hash['toolVersion']).toBe('2');
      expect(hash['inputFloor']).toBe('1');
      await waitFor(() => v2.logs().some((l) => l['taskId'] === taskId && l['onVersionChange'] === 'restart'));
    } finally {
      onElicit = () => Promise.resolve();
      await v2.kill('SIGTERM');
    }
  });

  it('§29.2 refuses to start, in one line, where the gateways run another scripts generation', async () => {
    expect(scriptsGeneration()).toMatch(/^[0-9a-f]{16}$/);
    const prefix = uniquePrefix('python-gen');
    await stack.r.hset(createKeys(prefix).protocol, 'deadbeefdeadbeef', String(Date.now()));
    const refused = spawnProcess(PYTHON!, ['-m', 'taskrelay_worker'], {
      ...stack.env,
      TASKRELAY_PREFIX: prefix,
      TASKRELAY_TOOLS: PY_TOOLS,
    });
    expect(await refused.exited).toBe(1);
    const lines = refused.output().trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^taskrelay-worker: this worker runs task-store scripts generation [0-9a-f]{16}, but .*deadbeefdeadbeef/,
    );
  });

  it('exits with one line when Redis is unreachable or the configuration is wrong', async () => {
    const unreachable = spawnProcess(PYTHON!, ['-m', 'taskrelay_worker'], {
      REDIS_URL: 'redis://127.0.0.1:1',
      TASKRELAY_TOOLS: PY_TOOLS,
    });
    expect(await unreachable.exited).toBe(1);
    expect(unreachable.output().trim()).toMatch(
      /^taskrelay-worker: Redis is unreachable at redis:\/\/127\.0\.0\.1:1: [^\n]+$/,
    );
    const bad = spawnProcess(PYTHON!, ['-m', 'taskrelay_worker'], {
      REDIS_URL: stack.redis.url,
      TASKRELAY_TOOLS: PY_TOOLS,
      WORKER_CONCURRENCY: '0',
    });
    expect(await bad.exited).toBe(1);
    expect(bad.output().trim()).toBe(
      'taskrelay-worker: Invalid configuration: WORKER_CONCURRENCY must be at least 1 (got 0)',
    );
  });
});

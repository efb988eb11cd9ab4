/**
 * The stock entry point, `node packages/worker/dist/main.js`, as a user runs it (README.md, docs/CONFIGURATION.md, docs/MCP.md "Demo tools"). Needs the
 * build (`pnpm build`; `pnpm test` builds first).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { WorkerCatalogSchema, toolPool } from '@taskrelay/shared';
import { startRedis, type TestRedis } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import { demoTools } from '../src/demo-tools.js';
import { Harness } from './harness.js';

const MAIN = fileURLToPath(new URL('../dist/main.js', import.meta.url));
const REPO = fileURLToPath(new URL('../../../', import.meta.url));
const FIXTURES = 'test/fixtures/tools.mjs';

interface Run {
  child: ChildProcess;
  stdout: string[];
  stderr: () => string;
  exited: Promise<number | null>;
}

const children: ChildProcess[] = [];

function run(env: Record<string, string | undefined>): Run {
  const base = { PATH: process.env['PATH'], HOME: process.env['HOME'], LOG_LEVEL: 'info' };
  const child = spawn(process.execPath, [MAIN], {
    cwd: REPO,
    env: { ...base, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const stdout: string[] = [];
  let stderr = '';
  let buffered = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    buffered += chunk.toString('utf8');
    const lines = buffered.split('\n');
    buffered = lines.pop() ?? '';
    stdout.push(...lines.filter((l) => l.trim()));
  });
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, stdout, stderr: () => stderr, exited };
}

function readyLine(r: Run): Record<string, unknown> | undefined {
  for (const line of r.stdout) {
    const parsed = JSON.parse(line) as Record<string, unknown>;
    if (parsed['msg'] === 'worker ready') return parsed;
  }
  return undefined;
}

let redis: TestRedis;
let h: Harness;
let scratch: string;

beforeAll(async () => {
  if (!existsSync(MAIN)) throw new Error(`${MAIN} is missing: run pnpm build first`);
  redis = await startRedis();
  scratch = mkdtempSync(join(tmpdir(), 'taskrelay-worker-main-'));
});

afterAll(async () => {
  await redis?.stop();
  // beforeAll may have failed before making it (no Redis): nothing to remove then, and no TypeError to hide why.
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

beforeEach(() => {
  h = new Harness(redis.url);
});

afterEach(async () => {
  for (const child of children.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
  await h.close();
});

describe('stock worker entry point', () => {
  it('exits 1 with one line on stderr when REDIS_URL is missing', async () => {
    const r = run({});
    expect(await r.exited).toBe(1);
    expect(r.stderr()).toBe(
      'taskrelay-worker: Invalid configuration: REDIS_URL is required (for example redis://127.0.0.1:6379)\n',
    );
  });

  it('exits 1 with one line on stderr when a setting is invalid', async () => {
    const r = run({ REDIS_URL: redis.url, WORKER_CONCURRENCY: 'lots' });
    expect(await r.exited).toBe(1);
    expect(r.stderr()).toBe(
      'taskrelay-worker: Invalid configuration: WORKER_CONCURRENCY must be a whole number (got "lots")\n',
    );
  });

  it('exits 1 with one line on stderr when Redis is unreachable', async () => {
    const port = await getPort({ host: '127.0.0.1' });
    const r = run({ REDIS_URL: `redis://127.0.0.1:${port}` });
    expect(await r.exited).toBe(1);
    expect(r.stderr()).toMatch(
      new RegExp(`^taskrelay-worker: Redis is unreachable at 127\\.0\\.0\\.1:${port}[^\\n]*\\n$`),
    );
  });

  it('exits 1 with one line when the TASKRELAY_TOOLS module exports no tools, or cannot be loaded', async () => {
    const empty = join(scratch, 'empty.mjs');
    writeFileSync(empty, 'export const notATool = { name: "x" };\n');
    const none = run({ REDIS_URL: redis.url, TASKRELAY_TOOLS: empty });
    expect(await none.exited).toBe(1);
    expect(none.stderr()).toMatch(/^taskrelay-worker: [^\n]*TASKRELAY_TOOLS[^\n]*exports no tool definitions[^\n]*\n$/);

    const missing = run({ REDIS_URL: redis.url, TASKRELAY_TOOLS: join(scratch, 'nope.mjs') });
    expect(await missing.exited).toBe(1);
    expect(missing.stderr()).toMatch(/^taskrelay-worker: [^\n]*TASKRELAY_TOOLS could not load[^\n]*\n$/);
  });

  it('serves the demo tools by default, runs build_report and fail_after, and drains on SIGTERM', async () => {
    const r = run({ REDIS_URL: redis.url, TASKRELAY_PREFIX: h.prefix });
    const ready = await waitFor(() => readyLine(r), { message: 'no worker ready line' });
    // The pool is named by its tools at their versions (PROTOCOL.md §24.9), as the catalog publishes them (a derived
    // version is the built code's: this process runs the sources, so it reads them from there).
    const catalog = WorkerCatalogSchema.parse(
      JSON.parse((await h.redis.get(h.keys.workerCatalog(String(ready['workerId'])))) ?? 'null'),
    );
    expect(catalog.tools.map((t) => t.name)).toEqual(demoTools.map((t) => t.name));
    expect(ready).toMatchObject({
      queue: toolPool(
        'default',
        catalog.tools.map((t) => ({ name: t.name, version: t.version ?? '' })),
      ),
      tools: ['build_report', 'wait_for_approval', 'fail_after', 'batch_report'],
    });
    h.useQueueName('default');

    const report = await h.enqueue('build_report', { report: 'q3', items: 3, delayMs: 1 });
    const failing = await h.enqueue('fail_after', { delayMs: 1, message: 'as requested' }, { attempts: 3 });
    expect(await h.waitForStatus(report, 'completed')).toMatchObject({
      progress: 3,
      total: 3,
      progressMessage: 'Processed 3 of 3 items for q3',
      result: {
        content: [{ type: 'text', text: 'Report "q3" built from 3 items' }],
        structuredContent: { report: 'q3', items: 3 },
      },
    });
    expect(await h.waitForStatus(failing, 'failed')).toMatchObject({
      statusMessage: 'as requested',
      result: { content: [{ type: 'text', text: 'as requested' }], isError: true },
    });

    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
    expect(r.stderr()).toBe('');
    expect(await h.redis.exists(h.keys.workerCatalog(String(ready['workerId'])))).toBe(0);
  });

  it('serves every tool exported by the TASKRELAY_TOOLS module and removes its catalog on SIGINT', async () => {
    const r = run({ REDIS_URL: redis.url, TASKRELAY_PREFIX: h.prefix, TASKRELAY_TOOLS: FIXTURES });
    const ready = await waitFor(() => readyLine(r), { message: 'no worker ready line' });
    const workerId = String(ready['workerId']);
    const catalog = WorkerCatalogSchema.parse(
      JSON.parse((await h.redis.get(h.keys.workerCatalog(workerId))) ?? 'null'),
    );
    expect(catalog.tools.map((t) => [t.name, t.taskSupport]).sort()).toEqual([
      ['echo', 'optional'],
      ['fail_now', 'optional'],
      ['flaky', 'optional'],
      ['forbidden_task', 'forbidden'],
      ['ignore_signal', 'optional'],
      ['needs_sampling', 'optional'],
      ['progress_burst', 'optional'],
      ['protocol_error', 'optional'],
      ['required_task', 'required'],
      ['schema_2020', 'optional'],
      ['sleepy', 'optional'],
      ['sleepy_fragile', 'optional'],
      ['slow_timeout', 'optional'],
    ]);
    expect(catalog.tools.find((t) => t.name === 'slow_timeout')?.timeoutMs).toBe(200);
    expect(catalog.tools.find((t) => t.name === 'flaky')?.attempts).toBe(2);
    h.useQueueName(catalog.queueName ?? 'default');

    const echoed = await h.enqueue('echo', { hello: 'world' });
    expect((await h.waitForStatus(echoed, 'completed')).result?.structuredContent).toEqual({ hello: 'world' });
    const burst = await h.enqueue('progress_burst', { count: 10_000 });
    expect(await h.waitForStatus(burst, 'completed')).toMatchObject({ progress: 10_000, total: 10_000 });
    const flaky = await h.enqueue('flaky', {}, { attempts: 2 });
    expect((await h.waitForStatus(flaky, 'completed')).result?.content).toEqual([
      { type: 'text', text: 'succeeded on attempt 2' },
    ]);
    const slow = await h.enqueue('slow_timeout', {}, { timeoutMs: 200 });
    expect(await h.waitForStatus(slow, 'failed')).toMatchObject({
      statusMessage: 'Tool slow_timeout timed out after 200 ms',
      error: { code: 'TIMEOUT' },
    });
    const sleepy = await h.enqueue('sleepy', { ms: 100, stepMs: 25 });
    expect(await h.waitForStatus(sleepy, 'completed')).toMatchObject({
      progress: 100,
      total: 100,
      result: { structuredContent: { ms: 100 } },
    });

    r.child.kill('SIGINT');
    expect(await r.exited).toBe(0);
    expect(await h.redis.exists(h.keys.workerCatalog(workerId))).toBe(0);
    expect(await h.redis.zscore(h.keys.workers, workerId)).toBeNull();
  });
});

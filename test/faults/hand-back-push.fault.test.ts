/**
 * Issue 48 P2, PROTOCOL.md §5.7 and §18: a run handed back by its worker (SIGTERM past the grace) is said at once. A
 * `subscriptions/listen` stream open on the task gets a frame "Waiting to be resumed…" from the hand-back itself (the
 * `suspend` script publishes it), not with the task's next change, and the dashboard's row shows the waiting state
 * instead of the last run's progress bar (e.g. `19/100`), on the Node and on the Python worker. Before, the hand-back
 * published nothing (the stream showed the message only once the next run changed the task) and the bar kept its
 * last values.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium, type Browser, type Page } from 'playwright-core';
import { waitFor } from '../helpers/wait-for.js';
import { PYTHON, ROOT, type ManagedProcess } from '../helpers/processes.js';
import { modernRequest, readSse, TASKS_EXT } from '../helpers/raw-mcp.js';
import { useStack } from '../helpers/stack.js';

const CHROMIUM = process.env['CHROMIUM_PATH'] ?? '/usr/bin/chromium';
const WAITING = /^Waiting to be resumed/;
type Json = Record<string, any>;

/** A SIGTERM hands the run back 300 ms past it; a short heartbeat. */
const WORKER_ENV = { WORKER_SHUTDOWN_GRACE_MS: '300', WORKER_HEARTBEAT_MS: '500' };
const stack = useStack({ name: 'f-handback', redis: { owned: true }, workers: [] });
let browser: Browser;
let page: Page;

beforeAll(async () => {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_PATH)`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu'] });
  page = await browser.newPage();
});

afterAll(async () => {
  await browser?.close();
});

/** One 2026-07-28 request with the tasks extension declared. */
function post(method: string, params: Json, signal?: AbortSignal): Promise<Response> {
  const { headers, body } = modernRequest(method, params, { capabilities: { extensions: { [TASKS_EXT]: {} } } });
  return fetch(stack.gateway.url, { method: 'POST', headers, body, signal: signal ?? null });
}

async function result(method: string, params: Json): Promise<Json> {
  const body = (await (await post(method, params)).json()) as Json;
  if (body['error']) throw new Error(`${method}: ${JSON.stringify(body['error'])}`);
  return body['result'] as Json;
}

/** The cells of a task's row on the dashboard, as text. */
async function row(taskId: string): Promise<string[] | undefined> {
  const cells = await page.locator(`#tasks tr:has(a:text-is("${taskId}")) td`).allInnerTexts();
  return cells.length > 0 ? cells : undefined;
}

const cases: Array<{
  worker: string;
  skip: boolean;
  start: () => Promise<ManagedProcess>;
  tool: string;
  args: Json;
}> = [
  {
    worker: 'Node',
    skip: false,
    start: () => stack.addWorker(WORKER_ENV), // the demo tools
    tool: 'build_report',
    args: { report: 'sales', items: 1_000, delayMs: 50 },
  },
  {
    worker: 'Python',
    skip: PYTHON === undefined,
    start: () =>
      stack.addPythonWorker({ ...WORKER_ENV, TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py') }),
    tool: 'py_count',
    args: { n: 1_000, delay_ms: 50 },
  },
];

describe.each(cases)('a run handed back by a $worker worker', ({ skip, start, tool, args }) => {
  it.skipIf(skip)(
    'is pushed to a listen stream by the hand-back itself, and the dashboard shows it waits instead of a stale bar',
    async () => {
      const worker = await start();
      // A worker is ready before the gateway's catalog lists its tools: a call sent at once may find "Unknown tool".
      await waitFor(async () => ((await result('tools/list', {}))['tools'] as Json[]).some((t) => t['name'] === tool), {
        timeoutMs: 20_000,
        message: `the gateway never listed ${tool}`,
      });
      const taskId = String((await result('tools/call', { name: tool, arguments: args }))['taskId']);
      await waitFor(async () => (await result('tasks/get', { taskId }))['statusMessage'] !== undefined, {
        timeoutMs: 20_000,
        message: 'the task never made progress',
      });

      const listening = new AbortController();
      const frames: Json[] = [];
      const response = await post('subscriptions/listen', { notifications: { taskIds: [taskId] } }, listening.signal);
      const reading = (async () => {
        for await (const event of readSse(response)) frames.push(event.data as Json);
      })().catch(() => undefined);
      const taskFrames = () =>
        frames.filter((f) => f['method'] === 'notifications/tasks').map((f) => f['params'] as Json);
      await waitFor(() => taskFrames().length >= 1, { message: 'the listen stream sent no first frame' });

      await page.goto(stack.gateway.url.replace(/\/mcp$/, '/admin/tasks'));
      const bar = await waitFor(async () => (await row(taskId))?.[3]?.match(/^\d+\/1000/), {
        timeoutMs: 10_000,
        message: 'the dashboard never showed the progress bar',
      });
      expect(bar).toBeTruthy();

      void worker.kill('SIGTERM');
      expect(await worker.exited).toBe(0);

      // No other worker runs: nothing changes the task after the hand-back, so only the hand-back can have pushed this.
      const pushed = await waitFor(() => taskFrames().find((f) => WAITING.test(String(f['statusMessage'] ?? ''))), {
        timeoutMs: 5_000,
        message: `no listen frame said the task waits to be resumed: ${JSON.stringify(taskFrames())}`,
      });
      expect(pushed).toMatchObject({ taskId, status: 'working' });

      const cells = await waitFor(
        async () => {
          const cells = await row(taskId);
          return cells?.[3]?.startsWith('waiting to be resumed') ? cells : undefined;
        },
        { timeoutMs: 10_000, message: `the dashboard kept the stale bar: ${JSON.stringify(await row(taskId))}` },
      );
      expect(cells[3]).toMatch(/^waiting to be resumed \(last run \d+\/1000\)$/);
      expect(cells[4]).toMatch(WAITING);
      expect(await page.locator(`#tasks tr:has(a:text-is("${taskId}")) .bar`).count()).toBe(0);

      listening.abort();
      await reading;
      await result('tasks/cancel', { taskId });
    },
  );
});

/**
 * Issue 13: the operator pages in a real browser (headless Chromium): the live tasks page shows workers with their
 * tools, queue depth, and each task's status, moving progress bar, message, principal and age; a task's detail shows
 * its timeline; bull-board lists the queue. With auth on, `/admin` needs a token. Screenshots go to `.tmp/`.
 * Issue 34 item 7: what the pages say is true: a task's question, a batch parent's runs, why an unserved task waits,
 * what a pool serves, and a queue whose last worker left while a job waits in it.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { PoolCatalogSchema, createKeys, parseMessage, toolQueue } from '@taskrelay/shared';

/** build_report's queue: one per tool and TASKRELAY_QUEUE (PROTOCOL.md §3.2). */
const BUILD_QUEUE = toolQueue('default', 'build_report');
import { chromium, type Browser, type Page } from 'playwright-core';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, type GatewayProcess, type ManagedProcess } from './helpers/processes.js';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { getTask, startTask } from './helpers/tasks.js';
import { startWebhookReceiver } from './helpers/webhook-receiver.js';

const CHROMIUM = process.env['CHROMIUM_PATH'] ?? '/usr/bin/chromium';
const SHOTS = resolve(ROOT, '.tmp');

const stack = useStack({
  name: 'dash',
  gateways: [{}, { TASKRELAY_AUTH_TOKENS: 'ops:0pstoken', TASKRELAY_OPERATORS: 'ops' }],
  workers: [{ WORKER_CONCURRENCY: '2' }],
  mcp: true,
});
let gateway: GatewayProcess;
let authed: GatewayProcess;
let client: Client;
let browser: Browser;
let page: Page;
let admin: string;

beforeAll(async () => {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM_PATH)`);
  [gateway, authed] = stack.gateways as [GatewayProcess, GatewayProcess];
  client = stack.mcp;
  admin = gateway.url.replace(/\/mcp$/, '/admin');
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  mkdirSync(SHOTS, { recursive: true });
});

afterAll(async () => {
  await browser?.close();
});

/** The cells of a task's row on the page, as text. */
async function row(taskId: string): Promise<string[] | undefined> {
  const cells = await page.locator(`#tasks tr:has(a:text-is("${taskId}")) td`).allInnerTexts();
  return cells.length > 0 ? cells : undefined;
}

/** The cells of the row of `section` whose first cell is `first`, as text (read at once: the page redraws each poll). */
async function rowOf(section: string, first: string): Promise<string[] | undefined> {
  // No DOM types here (Node's tsconfig): the cells are read as the browser's innerText.
  const rows: string[][] = await page.$$eval(`#${section} tbody tr`, (trs) =>
    trs.map((tr) => Array.from(tr.children, (td) => (td as unknown as { innerText: string }).innerText)),
  );
  return rows.find((cells) => cells[0] === first);
}

/** A task's detail page as `term → description` text. */
async function detailRows(): Promise<Record<string, string>> {
  const terms = await page.locator('#task dt').allInnerTexts();
  const values = await page.locator('#task dd').allInnerTexts();
  return Object.fromEntries(terms.map((t, i) => [t, values[i] ?? '']));
}

describe('admin pages in Chromium', () => {
  it('show workers, queue depth and live tasks with moving progress bars, and a task timeline', async () => {
    const fast = await startTask(client, 'build_report', { report: 'sales', items: 400, delayMs: 25 });
    const slow = await startTask(client, 'build_report', { report: 'returns', items: 400, delayMs: 60 });
    const queued = await startTask(client, 'build_report', { report: 'backlog', items: 5, delayMs: 10 }); // concurrency 2: waits for a slot
    await page.goto(`${admin}/tasks`);

    await waitFor(
      async () => (await row(fast))?.[3]?.match(/^\d+\/400/) && (await row(slow))?.[3]?.match(/^\d+\/400/),
      {
        timeoutMs: 15_000,
        message: 'the two running tasks never showed progress',
      },
    );
    const workers = await page.locator('#workers').innerText();
    expect(workers).toContain('build_report');
    expect(workers).toContain('fail_after');
    expect(workers).toMatch(/\d+s ago/);
    // A pool by its TASKRELAY_QUEUE, its digest beside, not the digest alone.
    expect(workers).toMatch(/default\s*pool [0-9a-f]{12}/);
    const queues = await page
      .locator('#queues tbody tr', { hasText: BUILD_QUEUE })
      .first()
      .locator('td')
      .allInnerTexts();
    expect(queues).toEqual([BUILD_QUEUE, '1', '2', '0', '0', '1']);
    const queuedRow = (await row(queued))!;
    expect(queuedRow[3]).toBe('queued');
    expect(queuedRow.slice(1, 3)).toEqual(['build_report', 'working']);
    expect(queuedRow[5]).toBe('anonymous');

    // Each bar moves on its own and names its own report.
    const first = (await row(fast))!;
    expect(first[4]).toMatch(/^Processed \d+ of 400 items for sales$/);
    expect((await row(slow))![4]).toMatch(/^Processed \d+ of 400 items for returns$/);
    const done = (cells: string[]) => Number(/^(\d+)\//.exec(cells[3]!)![1]);
    await waitFor(async () => done((await row(fast))!) > done(first), {
      timeoutMs: 10_000,
      message: 'the progress bar did not move',
    });
    const width = await page.locator(`#tasks tr:has(a:text-is("${fast}")) .bar i`).getAttribute('style');
    expect(Number.parseFloat(/width:([\d.]+)%/.exec(width ?? '')?.[1] ?? '0')).toBeGreaterThan(0);
    await page.screenshot({ path: join(SHOTS, 'dashboard-tasks.png') });

    // A cancelled task stays listed with its status.
    await client.experimental.tasks.cancelTask(slow);
    await waitFor(async () => (await row(slow))?.[2] === 'cancelled', {
      timeoutMs: 10_000,
      message: 'the cancelled task never showed cancelled',
    });

    await page.locator(`a:text-is("${fast}")`).click();
    await page.waitForURL(`**/admin/tasks/${fast}`);
    await waitFor(async () => (await page.locator('#timeline li').count()) >= 4, {
      timeoutMs: 10_000,
      message: 'the timeline never showed',
    });
    const timeline = await page.locator('#timeline li').allInnerTexts();
    expect(timeline.map((t) => /\s(\w+)( —|$)/.exec(t)?.[1])).toEqual(['created', 'queued', 'started', 'progress']);
    expect(await page.locator('#task').innerText()).toContain('Processed');
    await page.screenshot({ path: join(SHOTS, 'dashboard-task.png') });

    await client.experimental.tasks.cancelTask(fast);
  });

  it('serve bull-board at /admin/queues with the worker pool listed', async () => {
    await startTask(client, 'build_report', { report: 'on-the-board', items: 2_000, delayMs: 50 });
    await page.goto(`${admin}/queues`);
    // One name for the pool everywhere: bull-board shows it as the dashboard does, not as BullMQ's `q-<pool>`.
    await page.getByText(BUILD_QUEUE).first().waitFor({ timeout: 15_000 });
    expect(await page.locator('body').innerText()).not.toContain('q-default');
    await page.getByText(BUILD_QUEUE).first().click();
    await page.waitForURL(`**/admin/queues/queue/${BUILD_QUEUE}**`);
    expect(await page.locator('body').innerText()).not.toContain('q-default');
    // The running job shows with its name (the tool) once bull-board loaded the queue.
    await page.getByText('build_report').first().waitFor({ timeout: 15_000 });
    await page.screenshot({ path: join(SHOTS, 'dashboard-queues.png') });

    // The dashboard's link to a queue opens that queue on bull-board.
    await page.goto(`${admin}/tasks`);
    await page.locator(`#queues a:text-is("${BUILD_QUEUE}")`).click();
    await page.waitForURL(`**/admin/queues/queue/**`);
    // bull-board shows the queue's state tabs, or says it has no such queue.
    const missing = page.getByText(/not found/i).first();
    await page
      .getByText(/^prioritized$/i)
      .first()
      .or(missing)
      .waitFor({ timeout: 15_000 });
    expect(await missing.count()).toBe(0);
  });

  it('need a token when auth is on', async () => {
    const base = authed.url.replace(/\/mcp$/, '/admin');
    for (const path of ['/tasks', '/api/overview', '/queues']) {
      expect((await fetch(`${base}${path}`)).status, path).toBe(401);
      const ok = await fetch(`${base}${path}`, { headers: { Authorization: 'Bearer 0pstoken' } });
      expect(ok.status, path).toBe(200);
    }
  });

  it('show a dead-lettered webhook event in the Webhooks section, with its reason and tries (PROTOCOL.md §27.6)', async () => {
    const secret = 'dashboard-webhook-secret';
    const receiver = await startWebhookReceiver(secret);
    try {
      receiver.answer(() => 404);
      const hooked = await stack.addGateway({
        TASKRELAY_WEBHOOK_SECRET: secret,
        TASKRELAY_WEBHOOK_ALLOWED_HOSTS: `127.0.0.1:${receiver.port}`,
        TASKRELAY_WEBHOOK_POLL_MS: '50',
      });
      const hookedClient = await stack.client({}, hooked.url);
      const taskId = await startTask(
        hookedClient,
        'fail_after',
        { delayMs: 1, message: 'no' },
        { meta: { 'dev.taskrelay/webhook': { url: `${receiver.origin}/missing` } } },
      );
      await hookedClient.close();
      await page.goto(`${hooked.url.replace(/\/mcp$/, '/admin')}/tasks`);
      const section = page.locator('#webhooks');
      await waitFor(
        async () => (await section.count()) > 0 && (await section.innerText()).includes(`msg_${taskId}_1`),
        {
          timeoutMs: 15_000,
          message: 'the dead letter never showed on the page',
        },
      );
      const cells = await page.locator(`#webhooks tr:has(td:text-is("msg_${taskId}_1")) td`).allInnerTexts();
      expect(cells.slice(0, 5)).toEqual([`msg_${taskId}_1`, taskId, 'failed', `${receiver.origin}/missing`, '1']);
      expect(cells[5]).toMatch(/the receiver answered 404/);
      expect(await section.locator('h2').innerText()).toMatch(/Webhooks · 0 pending · [1-9]\d* dead/i);
      expect(receiver.received.every((h) => h.verified)).toBe(true);
      await page.screenshot({ path: join(SHOTS, 'dashboard-webhooks.png') });
    } finally {
      await receiver.close();
    }
  });

  it('§30.5 find failed tasks by tool and tag, replay one from its page, and watch the new task complete', async () => {
    // A worker of the operate fixture: its report fails while `<prefix>:operate:down` exists.
    const reporter = await stack.addWorker({
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/operate-tools.mjs'),
    });
    const prefix = stack.prefix;
    const { Redis } = await import('ioredis');
    const r = new Redis(stack.redis.url);
    try {
      await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'nightly_report'), {
        message: 'nightly_report not listed',
      });
      await r.set(`${prefix}:operate:down`, '1');
      const failed = await startTask(
        client,
        'nightly_report',
        { report: 'dash' },
        { meta: { 'dev.taskrelay/tags': ['dash'] } },
      );
      await waitFor(async () => (await r.hget(`${prefix}:task:${failed}`, 'status')) === 'failed', {
        message: 'the report did not fail',
      });
      await r.del(`${prefix}:operate:down`);

      // Filter: failed nightly reports tagged dash.
      await page.goto(`${admin}/tasks`);
      await page.selectOption('#find-form select[name=status]', 'failed');
      await page.fill('#find-form input[name=tool]', 'nightly_report');
      await page.fill('#find-form input[name=tag]', 'dash');
      await page.click('#find-search');
      const found = page.locator(`#found tr:has(a:text-is("${failed}"))`);
      await found.waitFor({ timeout: 15_000 });
      expect(await page.locator('#found tbody tr').count()).toBe(1);
      expect(await found.locator('td').nth(6).innerText()).toMatch(/NON_RETRYABLE: upstream down/);
      await page.screenshot({ path: join(SHOTS, 'dashboard-find.png') });

      // Its page shows its kept logs; Replay opens the new task, which completes, linked to the original.
      await found.locator('a').click();
      await page.waitForURL(`**/admin/tasks/${failed}`);
      await page.locator('#logs td:text-is("upstream down")').waitFor({ timeout: 15_000 });
      await page.click('#replay');
      await page.waitForURL((url) => /\/admin\/tasks\/[0-9a-f]+$/.test(url.pathname) && !url.pathname.endsWith(failed));
      const replayId = page.url().split('/').at(-1)!;
      await page.locator('#task .badge.s-completed').waitFor({ timeout: 20_000 });
      expect(await page.locator(`#task a:text-is("${failed}")`).count()).toBe(1);
      await page.locator('#logs td:text-is("publishing dash")').waitFor({ timeout: 15_000 });
      await page.screenshot({ path: join(SHOTS, 'dashboard-replayed.png') });
      expect(await r.hget(`${prefix}:task:${failed}`, 'replayedBy')).toBe(replayId);

      // The overview lists the action.
      await page.goto(`${admin}/tasks`);
      const action = page.locator('#audit tr:has(td:text-is("replay"))');
      await action.first().waitFor({ timeout: 15_000 });
      expect(await action.first().innerText()).toContain(failed);

      // Views that tell the truth: with the tool's last worker gone, a queued task says why (as tasks/get does),
      // and its queue stays listed, on the page and in the metrics, with the job waiting in it.
      await reporter.kill('SIGTERM');
      const queued = await startTask(client, 'nightly_report', { report: 'nobody' });
      const queuedRow = page.locator(`#tasks tr:has(a:text-is("${queued}")) td`);
      await waitFor(
        async () => /no live worker serves tool nightly_report/.test((await queuedRow.allInnerTexts())[4] ?? ''),
        {
          timeoutMs: 15_000,
          message: 'the queued task did not say why it waits',
        },
      );
      const queueRow = await page.locator('#queues tr:has(a:text-is("default~nightly_report")) td').allInnerTexts();
      expect(queueRow[1]).toBe('1');
      const scrape = await (await fetch(gateway.url.replace(/\/mcp$/, '/metrics'))).text();
      expect(scrape).toMatch(/taskrelay_queue_jobs\{queue="default~nightly_report",state="prioritized"\} 1/);
    } finally {
      r.disconnect();
    }
  });
});

describe('admin pages tell the truth (issue 34 item 7)', () => {
  /** The fixture tools' worker, on its own queue name: started and stopped by the tests below. */
  let fixtures: ManagedProcess | undefined;
  const ECHO_QUEUE = toolQueue('fixtures', 'echo');
  const startFixtures = async () => {
    fixtures = await stack.addWorker(FIXTURE_WORKER);
  };
  /** SIGTERM: a clean exit deletes the worker's heartbeat, so its pool has no live worker at once. */
  const stopFixtures = async () => {
    expect(await fixtures?.kill('SIGTERM')).toBe(0);
    fixtures = undefined;
  };
  afterAll(async () => {
    await fixtures?.kill('SIGKILL');
  });

  it('show the question a task waiting for an answer asked, in its row and on its detail', async () => {
    const question = 'Ship release 4.2 to production?';
    const asker = new Client(
      { name: 'dashboard-asker', version: '0.0.0' },
      { capabilities: { elicitation: {}, tasks: { list: {}, cancel: {}, requests: {} } } },
    );
    // The question reaches this client, which never answers: the task stays input_required.
    let asked = false;
    asker.setRequestHandler(ElicitRequestSchema, () => {
      asked = true;
      return new Promise(() => undefined);
    });
    await asker.connect(new StreamableHTTPClientTransport(new URL(gateway.url)));
    try {
      const taskId = await startTask(asker, 'wait_for_approval', { question });
      await page.goto(`${admin}/tasks`);
      await waitFor(async () => (await row(taskId))?.[2] === 'input_required', {
        timeoutMs: 15_000,
        message: 'the task never showed input_required',
      });
      expect(asked).toBe(true);
      await waitFor(async () => (await row(taskId))?.[4]?.includes(question), {
        timeoutMs: 5_000,
        message: `the row never showed the question: ${JSON.stringify(await row(taskId))}`,
      });
      await page.goto(`${admin}/tasks/${taskId}`);
      await waitFor(async () => (await detailRows())['status'] === 'input_required', { timeoutMs: 10_000 });
      expect((await detailRows())['question']).toBe(question);
      await asker.experimental.tasks.cancelTask(taskId);
    } finally {
      await asker.close();
    }
  });

  it("show a batch parent's runs apart from its job's attempts", async () => {
    const reports = Array.from({ length: 300 }, (_v, i) => `w${i}`);
    const taskId = await startTask(client, 'batch_report', { reports, items: 3, delayMs: 20 });
    try {
      await page.goto(`${admin}/tasks/${taskId}`);
      // The parent runs again for each window of children it releases: wait for a second run while its job waits.
      const rows = await waitFor(
        async () => {
          const rows = await detailRows();
          return Number.parseInt(rows['runs'] ?? '', 10) >= 2 && rows['job']?.startsWith('delayed') ? rows : undefined;
        },
        { timeoutMs: 30_000, message: 'the batch parent never showed a second run with its job waiting' },
      );
      expect(rows['runs']).toMatch(/^\d+ — a batch parent runs again for each window of children it releases$/);
      // No retry happened: its one BullMQ attempt, not its run count.
      expect(rows['attempt']).toBe('1 of 1');
      expect(rows['job']).not.toMatch(/attempt/);
      const started = (await page.locator('#timeline li').allInnerTexts()).find((t) => /\sstarted\b/.test(t));
      expect(started).toMatch(/ — run \d+ on /);
    } finally {
      // Ended already when the wait above failed late: nothing to cancel then.
      await client.experimental.tasks.cancelTask(taskId).catch(() => undefined);
    }
  });

  it('show why a task queued for a tool no live worker serves waits, in its row and on its detail, as tasks/get says it', async () => {
    await startFixtures();
    await stopFixtures();
    // The pool is remembered (PROTOCOL.md §24): its tools are still listed, and a call is accepted and queued.
    const taskId = await startTask(client, 'echo', { hello: 'unserved' });
    const said = await waitFor(async () => (await getTask(client, taskId)).statusMessage, {
      timeoutMs: 5_000,
      message: 'tasks/get never said why the task waits',
    });
    expect(said).toMatch(/^Waiting: no live worker serves tool echo/);
    await page.goto(`${admin}/tasks`);
    await waitFor(async () => (await row(taskId))?.[4] === said, {
      timeoutMs: 10_000,
      message: `the row never showed what tasks/get says: ${JSON.stringify(await row(taskId))}`,
    });
    await page.locator(`a:text-is("${taskId}")`).click();
    await page.waitForURL(`**/admin/tasks/${taskId}`);
    await waitFor(async () => (await detailRows())['message'] === said, {
      timeoutMs: 10_000,
      message: `the detail never showed what tasks/get says: ${JSON.stringify(await detailRows())}`,
    });
    // A cancel removes the job: its queue is empty again.
    await client.experimental.tasks.cancelTask(taskId);
  });

  it('keep a queue whose last worker left listed, with 0 workers, while a job waits in it, until it is empty', async () => {
    await startFixtures();
    await stopFixtures();
    const taskId = await startTask(client, 'echo', { hello: 'queued' });
    await page.goto(`${admin}/tasks`);
    const queue = await waitFor(() => rowOf('queues', ECHO_QUEUE), {
      timeoutMs: 10_000,
      message: 'the queue of the waiting job vanished with its last worker',
    });
    // queue, waiting, active, delayed, failed, live workers.
    expect(queue).toEqual([ECHO_QUEUE, '1', '0', '0', '0', '0']);

    // A worker starts: the job runs, the queue empties, and once its worker leaves again it is no longer listed.
    await startFixtures();
    await waitFor(async () => (await getTask(client, taskId)).status === 'completed', { timeoutMs: 15_000 });
    await stopFixtures();
    await waitFor(async () => (await rowOf('queues', ECHO_QUEUE)) === undefined, {
      timeoutMs: 10_000,
      message: 'an empty queue with no worker stayed listed',
    });
  });

  it('show each pool with the tools and versions it serves beside its digest, a pool with no live worker too', async () => {
    // The fixture pool is remembered with no live worker.
    await startFixtures();
    await stopFixtures();
    const r = new Redis(stack.redis.url);
    try {
      const remembered = Object.values(await r.hgetall(createKeys(stack.prefix).pools)).map((raw) =>
        parseMessage(PoolCatalogSchema, raw)!,
      );
      // The pool of the live worker: other tests of this file left other `default` pools remembered, and a hash's
      // order is not theirs to rely on.
      const overview = (await (await fetch(`${admin}/api/overview`)).json()) as { workers: Array<{ queue: string }> };
      const livePools = new Set(overview.workers.map((w) => w.queue));
      const live = remembered.find((p) => livePools.has(p.pool))!;
      const gone = remembered.find((p) => p.queueName === 'fixtures')!;
      expect(live.pool).toMatch(/^default\.[0-9a-f]{12}$/);
      expect(gone.pool).toMatch(/^fixtures\.[0-9a-f]{12}$/);
      const served = (p: typeof live) => p.tools.map((t) => `${t.name}@${t.version}`).sort();
      /** A row's cells, and the tools it lists (one chip each), sorted. */
      const shown = async (selector: string) => ({
        cells: await page.locator(`${selector} td`).allInnerTexts(),
        tools: (await page.locator(`${selector} .tools span`).allInnerTexts()).sort(),
      });
      const poolRow = (pool: string) => `#pools tbody tr:has(td:first-child:text-is("${pool}"))`;
      await page.goto(`${admin}/tasks`);
      await waitFor(async () => (await page.locator(poolRow(live.pool)).count()) === 1, {
        timeoutMs: 10_000,
        message: 'the live pool is not listed',
      });
      const liveRow = await shown(poolRow(live.pool));
      expect(liveRow.cells.slice(0, 2)).toEqual([live.pool, '1']);
      expect(liveRow.tools).toEqual(served(live));
      const goneRow = await shown(poolRow(gone.pool));
      expect(goneRow.cells.slice(0, 2)).toEqual([gone.pool, '0']);
      expect(goneRow.tools).toEqual(served(gone));
      expect(goneRow.cells[3]).toMatch(/^\d+(s|m \d+s) ago$/);
      // A worker's row names its pool beside the same tools.
      const worker = await shown('#workers tbody tr:first-child');
      // Named by its TASKRELAY_QUEUE with the digest beside (`default` then `pool <digest>`).
      expect(worker.cells[1]).toMatch(new RegExp(`^${live.queueName}\\s*pool ${live.pool.slice(-12)}$`));
      expect(worker.tools).toEqual(served(live));
      await page.screenshot({ path: join(SHOTS, 'dashboard-pools.png'), fullPage: true });
    } finally {
      r.disconnect();
    }
  });
});

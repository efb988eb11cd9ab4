/**
 * PROTOCOL.md §33 across real processes: two gateways with authentication (alice, bob, the operator ops), a worker of
 * test/fixtures/schedule-tools.mjs, Redis, MCP clients, the CLI.
 * - §33.1: a delayed call is `working` "scheduled for …" at once and starts no earlier than its time; a cancel before
 *   then removes its job and nothing runs; bad times are JSON-RPC errors; a past time starts at once.
 * - §33.2: a per-second schedule creates tasks of its principal that run, one per firing across two gateways; pause
 *   and resume; `skip` and `cancel` overlap policies, and `queue`; its webhook; a principal sees and manages only its own; the CLI
 *   round trip; a bad schedules file stops a gateway with one line, a good one creates its schedule.
 */
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CallToolResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { startCli } from './helpers/cli.js';
import { GATEWAY_MAIN, ROOT, spawnNode } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startWebhookReceiver } from './helpers/webhook-receiver.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';
import { absenceWindow } from './helpers/load.js';

const WEBHOOK_SECRET = 'schedules-webhook-secret';
const stack = useStack({
  name: 'schedules',
  env: {
    TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token,ops:ops-token',
    TASKRELAY_OPERATORS: 'ops',
    TASKRELAY_WEBHOOK_SECRET: WEBHOOK_SECRET,
    TASKRELAY_WEBHOOK_ALLOWED_HOSTS: '127.0.0.1',
    TASKRELAY_WEBHOOK_POLL_MS: '50',
  },
  gateways: [{}, {}],
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/schedule-tools.mjs') }],
});

const bearer = (who: string) => ({ Authorization: `Bearer ${who}-token` });
const base = (i = 0) => stack.gateways[i]!.url.replace(/\/mcp$/, '');

async function api(path: string, who: string, init: RequestInit = {}, gateway = 0) {
  const res = await fetch(`${base(gateway)}${path}`, {
    ...init,
    headers: { ...bearer(who), ...(init.body ? { 'content-type': 'application/json' } : {}), ...init.headers },
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}
const post = (path: string, who: string, body: unknown = {}, gateway = 0) =>
  api(path, who, { method: 'POST', body: JSON.stringify(body) }, gateway);

/** When each run of `label` started (ms), as the tool recorded it. */
async function starts(label: string): Promise<number[]> {
  return (await stack.r.lrange(`${stack.prefix}:sched:starts:${label}`, 0, -1)).map(Number);
}

/** The tasks a schedule created, oldest first (the search by its tag). */
async function tasksOf(id: string, who = 'ops') {
  const found = await api(`/api/tasks?tag=schedule:${id}&limit=200`, who);
  return (found.body['tasks'] as Array<Record<string, any>>).reverse();
}

async function schedule(id: string, who = 'ops') {
  return (await api(`/admin/api/schedules/${id}`, who)).body['schedule'] as Record<string, any>;
}

async function refusal(call: Promise<unknown>): Promise<McpError> {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(McpError);
  return error as McpError;
}

const iso = (ms: number) => new Date(ms).toISOString();

describe('§33.1 delayed start', () => {
  it('creates the task at once, scheduled, and starts its job no earlier than its time', async () => {
    const alice = await stack.client(bearer('alice'));
    const startAt = Date.now() + 3_000;
    const taskId = await startTask(
      alice,
      'tick',
      { label: 'delayed' },
      { meta: { 'dev.taskrelay/start-at': iso(startAt) } },
    );
    const task = await getTask(alice, taskId);
    expect(task.status).toBe('working');
    expect(task.statusMessage).toBe(`scheduled for ${iso(startAt)}`);
    const result = await taskResult(alice, taskId, 30_000);
    expect(result.structuredContent).toEqual({ label: 'delayed' });
    const [started] = await starts('delayed');
    expect(started).toBeGreaterThanOrEqual(startAt);
    // The run's start cleared the waiting message.
    expect((await getTask(alice, taskId)).statusMessage).toBeUndefined();
  });

  it('a cancel before the start removes the job: the task ends cancelled and nothing runs', async () => {
    const alice = await stack.client(bearer('alice'));
    const startAt = Date.now() + 2_500;
    const taskId = await startTask(
      alice,
      'tick',
      { label: 'never' },
      { meta: { 'dev.taskrelay/start-at': iso(startAt) } },
    );
    await alice.experimental.tasks.cancelTask(taskId);
    expect((await getTask(alice, taskId)).status).toBe('cancelled');
    // The delayed job is gone as the cancel answers (BullMQ's job hash: `<prefix>:q-<pool>~tick:<id>`).
    const jobKeys = await stack.r.keys(`${stack.prefix}:q-*~tick:${taskId}*`);
    expect(jobKeys).toEqual([]);
    await absenceWindow(Math.max(0, startAt - Date.now()) + 1_500);
    expect(await starts('never')).toEqual([]);
    expect((await getTask(alice, taskId)).status).toBe('cancelled');
    // Not even a last run that finds the task cancelled (as a suspended run's promoted job gets): no worker took a job.
    expect(stack.workers.flatMap((w) => w.logs()).filter((l) => l['taskId'] === taskId)).toEqual([]);
  });

  it('refuses a start-at that is not an ISO time with its offset, too far ahead, or on a plain call', async () => {
    const alice = await stack.client(bearer('alice'));
    for (const bad of ['tomorrow', '2026-12-04', '2026-12-04T07:30:00', 1765000000000]) {
      const error = await refusal(
        startTask(alice, 'tick', { label: 'bad' }, { meta: { 'dev.taskrelay/start-at': bad } }),
      );
      expect(error.code).toBe(-32602);
      expect(error.message).toMatch(/dev\.taskrelay\/start-at.*ISO 8601/);
    }
    const far = await refusal(
      startTask(alice, 'tick', { label: 'bad' }, { meta: { 'dev.taskrelay/start-at': '2099-01-01T00:00:00Z' } }),
    );
    expect(far.code).toBe(-32602);
    expect(far.message).toMatch(/too far ahead: at most 30 day/);
    const plain = await refusal(
      alice.request(
        {
          method: 'tools/call',
          params: {
            name: 'tick',
            arguments: { label: 'bad' },
            _meta: { 'dev.taskrelay/start-at': iso(Date.now() + 5_000) },
          },
        },
        CallToolResultSchema,
      ),
    );
    expect(plain.code).toBe(-32602);
    expect(plain.message).toMatch(/needs a task call/);
    expect(await starts('bad')).toEqual([]);
  });

  it('a start-at already past starts the task at once', async () => {
    const alice = await stack.client(bearer('alice'));
    const taskId = await startTask(
      alice,
      'tick',
      { label: 'past' },
      { meta: { 'dev.taskrelay/start-at': iso(Date.now() - 3_600_000) } },
    );
    expect((await getTask(alice, taskId)).statusMessage).toBeUndefined();
    expect((await taskResult(alice, taskId)).structuredContent).toEqual({ label: 'past' });
  });
});

describe('§33.2 schedules', () => {
  it('a per-second schedule creates tasks of its principal that run, one per firing across two gateways', async () => {
    const alice = await stack.client(bearer('alice'));
    const created = await post('/api/schedules', 'alice', {
      id: 'alice-tick',
      tool: 'tick',
      arguments: { label: 'every-second' },
      cron: '* * * * * *',
    });
    expect(created.status).toBe(201);
    expect(created.body['schedule']).toMatchObject({
      id: 'alice-tick',
      principal: 'alice',
      overlap: 'skip',
      paused: false,
    });
    await waitFor(async () => (await starts('every-second')).length >= 4, { timeoutMs: 20_000 });
    // Paused: nothing fires until it is resumed.
    const paused = await post('/api/schedules/alice-tick/pause', 'alice', {}, 1);
    expect(paused.body['schedule']).toMatchObject({ paused: true });
    // A firing taken just before the pause may still end; then nothing more.
    await absenceWindow(1_500);
    const atPause = (await starts('every-second')).length;
    await absenceWindow(3_000);
    expect((await starts('every-second')).length).toBe(atPause);
    const tasks = await tasksOf('alice-tick');
    // One task per firing, whichever gateway took it: as many tasks as runs of the tool and as counted firings.
    expect((await schedule('alice-tick'))['runs']).toBe(tasks.length);
    expect(tasks.length).toBe(atPause);
    for (const t of tasks) expect(t).toMatchObject({ principal: 'alice', tool: 'tick', status: 'completed' });
    // Ordinary tasks of alice: she reads them over MCP.
    const last = tasks.at(-1)!;
    expect((await taskResult(alice, last['taskId'])).structuredContent).toEqual({ label: 'every-second' });

    await post('/api/schedules/alice-tick/resume', 'alice');
    await waitFor(async () => (await starts('every-second')).length >= atPause + 2, { timeoutMs: 20_000 });
    const removed = await api('/api/schedules/alice-tick', 'alice', { method: 'DELETE' });
    expect(removed).toMatchObject({ status: 200, body: { removed: 'alice-tick' } });
    expect((await api('/api/schedules/alice-tick', 'alice')).status).toBe(404);
  });

  it('an every schedule fires once at once, then every interval', async () => {
    const before = Date.now();
    const created = await post('/api/schedules', 'alice', {
      id: 'at-once',
      tool: 'tick',
      arguments: { label: 'at-once' },
      every: 60_000,
    });
    expect(created.status).toBe(201);
    // What `schedule add` prints as "next" is the firing made at once, not the one an interval later (issue 49).
    const next = Date.parse(created.body['schedule']['next']);
    expect(next).toBeGreaterThanOrEqual(before - 1_000);
    expect(next).toBeLessThan(before + 30_000);
    await waitFor(async () => (await starts('at-once')).length === 1, { timeoutMs: 10_000 });
    expect(await schedule('at-once')).toMatchObject({ runs: 1, skipped: 0 });
    expect(Date.parse((await schedule('at-once'))['next'])).toBeGreaterThan(Date.now() + 50_000);
    await api('/api/schedules/at-once', 'alice', { method: 'DELETE' });
  });

  it('skip: a firing while the previous run is on creates nothing', async () => {
    await post('/api/schedules', 'alice', {
      id: 'skipper',
      tool: 'tick',
      arguments: { label: 'skip', ms: 5_000 },
      cron: '* * * * * *',
      overlap: 'skip',
    });
    await waitFor(async () => Number((await schedule('skipper'))['skipped']) >= 2, { timeoutMs: 20_000 });
    // Skipped while the first run is on (it runs 5 s): no second task yet.
    expect(await tasksOf('skipper')).toHaveLength(1);
    await waitFor(async () => (await tasksOf('skipper')).length >= 2, { timeoutMs: 20_000 });
    await post('/api/schedules/skipper/pause', 'alice');
    const tasks = await tasksOf('skipper');
    // Never two runs at once: each run started after the one before ended (5 s apart at least).
    const runStarts = await starts('skip');
    for (let i = 1; i < runStarts.length; i++) expect(runStarts[i]! - runStarts[i - 1]!).toBeGreaterThanOrEqual(4_900);
    expect(tasks[0]!['status']).toBe('completed');
    await api('/api/schedules/skipper', 'alice', { method: 'DELETE' });
  });

  it('cancel: a firing cancels the previous run, then starts its own', async () => {
    const alice = await stack.client(bearer('alice'));
    await post('/api/schedules', 'alice', {
      id: 'canceller',
      tool: 'tick',
      arguments: { label: 'cancel', ms: 60_000 },
      every: 2_000,
      overlap: 'cancel',
    });
    await waitFor(async () => (await tasksOf('canceller')).length >= 2, { timeoutMs: 20_000 });
    await post('/api/schedules/canceller/pause', 'alice');
    const [first, second] = await tasksOf('canceller');
    expect((await getTask(alice, first!['taskId'])).status).toBe('cancelled');
    expect(['working', 'cancelled']).toContain((await getTask(alice, second!['taskId'])).status);
    await api('/api/schedules/canceller', 'alice', { method: 'DELETE' });
  });

  it('queue: a firing waits for the previous run to end, then starts; runs never overlap', async () => {
    await post('/api/schedules', 'alice', {
      id: 'queuer',
      tool: 'tick',
      arguments: { label: 'queue', ms: 2_500 },
      cron: '* * * * * *',
      overlap: 'queue',
    });
    await waitFor(async () => (await starts('queue')).length >= 3, { timeoutMs: 30_000 });
    await post('/api/schedules/queuer/pause', 'alice');
    const runStarts = await starts('queue');
    // The waiting firing started within about a second of the previous run's end, never during it.
    for (let i = 1; i < runStarts.length; i++) {
      const gap = runStarts[i]! - runStarts[i - 1]!;
      expect(gap).toBeGreaterThanOrEqual(2_400);
      expect(gap).toBeLessThan(6_000);
    }
    await api('/api/schedules/queuer', 'alice', { method: 'DELETE' });
  });

  it("a schedule's webhook signs and posts each of its tasks' ends; a URL off the allow-list is refused", async () => {
    const receiver = await startWebhookReceiver(WEBHOOK_SECRET);
    try {
      const created = await post('/api/schedules', 'alice', {
        id: 'hooked',
        tool: 'tick',
        arguments: { label: 'hooked' },
        every: 1_000,
        webhook: `${receiver.origin}/hooks`,
      });
      expect(created.status).toBe(201);
      await waitFor(() => receiver.received.some((h) => h.event?.['status'] === 'completed'), { timeoutMs: 20_000 });
      await post('/api/schedules/hooked/pause', 'alice');
      const taskIds = new Set((await tasksOf('hooked')).map((t) => t['taskId'] as string));
      const completed = receiver.received.filter((h) => h.event?.['status'] === 'completed');
      for (const hook of completed) {
        expect(hook.verified).toBe(true);
        expect(taskIds.has(hook.event?.['taskId'] as string)).toBe(true);
      }
      const refused = await post('/api/schedules', 'alice', {
        id: 'hooked-elsewhere',
        tool: 'tick',
        arguments: { label: 'x' },
        every: 1_000,
        webhook: 'http://example.com/hooks',
      });
      expect(refused.status).toBe(400);
      expect(refused.body).toMatchObject({ code: 'WEBHOOK_REFUSED' });
      await api('/api/schedules/hooked', 'alice', { method: 'DELETE' });
    } finally {
      await receiver.close();
    }
  });

  it('a principal sees and manages only its own schedules; an operator sees and manages all', async () => {
    const body = { id: 'bobs', tool: 'tick', arguments: { label: 'bob' }, cron: '0 3 * * *', tz: 'Europe/Paris' };
    expect((await post('/api/schedules', 'bob', body)).status).toBe(201);
    // Alice cannot see it, pause it, remove it or take its id.
    const listed = await api('/api/schedules', 'alice');
    expect((listed.body['schedules'] as Array<{ id: string }>).map((s) => s.id)).not.toContain('bobs');
    expect((await api('/api/schedules/bobs', 'alice')).status).toBe(404);
    expect((await post('/api/schedules/bobs/pause', 'alice')).status).toBe(404);
    expect((await api('/api/schedules/bobs', 'alice', { method: 'DELETE' })).status).toBe(404);
    const taken = await post('/api/schedules', 'alice', { ...body, arguments: { label: 'alice' } });
    expect(taken.status).toBe(400);
    expect(taken.body['error']).toMatch(/taken/);
    // Nor create one for bob, nor use the operators' routes.
    expect((await post('/api/schedules', 'alice', { ...body, id: 'for-bob', principal: 'bob' })).status).toBe(400);
    expect((await api('/admin/api/schedules', 'alice')).status).toBe(403);
    // Bob sees his own, with its next firing in its zone.
    const own = await api('/api/schedules/bobs', 'bob');
    expect(own.body['schedule']).toMatchObject({ principal: 'bob', tz: 'Europe/Paris', paused: false });
    expect(Date.parse(own.body['schedule']['next'])).toBeGreaterThan(Date.now());
    // The operator sees everyone's, creates one for alice, and pauses bob's.
    const all = await api('/admin/api/schedules', 'ops');
    expect(
      (all.body['schedules'] as Array<{ id: string; principal: string }>).find((s) => s.id === 'bobs'),
    ).toMatchObject({ principal: 'bob' });
    const forAlice = await post('/admin/api/schedules', 'ops', { ...body, id: 'ops-for-alice', principal: 'alice' });
    expect(forAlice.body['schedule']).toMatchObject({ principal: 'alice' });
    expect((await api('/api/schedules/ops-for-alice', 'alice')).status).toBe(200);
    expect((await post('/admin/api/schedules/bobs/pause', 'ops')).body['schedule']).toMatchObject({ paused: true });
    // Bad definitions are 400s naming the field.
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ ...body, id: 'x', cron: 'every day' }, /cron is not a cron pattern BullMQ reads/],
      [{ ...body, id: 'x', cron: '0 0 30 2 *' }, /cron is not a cron pattern BullMQ reads: Invalid explicit day/],
      [{ ...body, id: 'x', tz: 'Mars/Olympus' }, /tz must be an IANA time zone/],
      [{ ...body, id: 'x', every: 5_000 }, /exactly one of cron and every/],
      [{ ...body, id: 'x', overlap: 'sometimes' }, /overlap/],
      [{ ...body, id: 'x y' }, /id must be 1 to 48/],
      [{ ...body, id: 'x', tool: 'nope' }, /unknown tool nope/],
      [{ ...body, id: 'x', arguments: {} }, /arguments do not fit tool tick/],
      [{ ...body, id: 'x', colour: 'red' }, /unknown field colour/],
    ];
    for (const [bad, message] of cases) {
      const answer = await post('/api/schedules', 'bob', bad);
      expect(answer.status, JSON.stringify(bad)).toBe(400);
      expect(answer.body['error']).toMatch(message);
    }
    await api('/admin/api/schedules/bobs', 'ops', { method: 'DELETE' });
    await api('/admin/api/schedules/ops-for-alice', 'ops', { method: 'DELETE' });
  });

  it('the CLI adds, lists, pauses, resumes and removes a schedule, and delays a call', async () => {
    const cli = async (who: string, ...args: string[]) => {
      const run = startCli(['--url', stack.gateway.url, '--token', `${who}-token`, ...args]);
      const code = await run.exited;
      return { code, stdout: run.stdout(), stderr: run.stderr() };
    };
    const added = await cli('alice', 'schedule', 'add', 'cli-tick', 'tick', 'label=cli', '--every', '1000');
    expect(added.stderr).toBe('');
    expect(added.code).toBe(0);
    expect(added.stdout).toMatch(/^cli-tick {2}alice {2}tick {2}every 1000 ms {2}skip {2}next /);
    await waitFor(async () => (await starts('cli')).length >= 1, { timeoutMs: 20_000 });
    expect((await cli('alice', 'schedule', 'list')).stdout).toMatch(/^cli-tick {2}alice/m);
    expect((await cli('bob', 'schedule', 'list')).stdout).not.toMatch(/cli-tick/);
    expect((await cli('alice', 'schedule', 'pause', 'cli-tick')).stdout).toMatch(/cli-tick .* paused/);
    const json = await cli('alice', '--json', 'schedule', 'resume', 'cli-tick');
    expect(JSON.parse(json.stdout)).toMatchObject({ type: 'schedule', id: 'cli-tick', paused: false });
    const bobRm = await cli('bob', 'schedule', 'rm', 'cli-tick');
    expect(bobRm.code).toBe(1);
    expect(bobRm.stderr).toMatch(/schedule cli-tick not found/);
    expect((await cli('alice', 'schedule', 'rm', 'cli-tick')).stdout).toBe('schedule cli-tick removed\n');
    expect((await cli('alice', 'schedule', 'list')).stdout).not.toMatch(/cli-tick/);
    // A delayed call from the command line: `--start-at 2s` starts the task two seconds on, and follows it to its end.
    const before = Date.now();
    const delayed = await cli('alice', 'call', 'tick', 'label=cli-delayed', '--start-at', '2s');
    expect(delayed.stderr).toBe('');
    expect(delayed.code).toBe(0);
    expect((await starts('cli-delayed'))[0]).toBeGreaterThanOrEqual(before + 2_000);
    const usage = await cli('alice', 'schedule', 'add', 'x', 'tick', '--cron', '* * * * *', '--every', '1000');
    expect(usage.code).toBe(2);
    expect(usage.stderr).toMatch(/one of --cron and --every/);
  });

  it('a gateway creates the schedules of its file, and a bad file stops it with one line', async () => {
    const dir = tmpdir();
    const good = join(dir, `schedules-${process.pid}-good.yaml`);
    writeFileSync(
      good,
      [
        'schedules:',
        '  - id: from-file',
        '    principal: bob',
        '    every: 1000',
        '    tool: tick',
        '    arguments: { label: file }',
      ].join('\n'),
    );
    const gateway = await stack.addGateway({ TASKRELAY_SCHEDULES_FILE: good });
    await waitFor(async () => (await starts('file')).length >= 1, { timeoutMs: 20_000 });
    expect(await schedule('from-file')).toMatchObject({ principal: 'bob', source: 'file' });
    expect((await tasksOf('from-file', 'bob'))[0]).toMatchObject({ principal: 'bob' });
    await api('/admin/api/schedules/from-file', 'ops', { method: 'DELETE' });
    await gateway.kill('SIGTERM');

    const bad = join(dir, `schedules-${process.pid}-bad.yaml`);
    writeFileSync(bad, 'schedules:\n  - id: broken\n    principal: bob\n    tool: tick\n    cron: "61 * * * *"\n');
    const proc = spawnNode(GATEWAY_MAIN, { ...stack.env, HOST: '127.0.0.1', PORT: '0', TASKRELAY_SCHEDULES_FILE: bad });
    expect(await proc.exited).toBe(1);
    const lines = proc.output().trim().split('\n');
    expect(lines.at(-1)).toMatch(
      /^taskrelay-gateway: Invalid TASKRELAY_SCHEDULES_FILE .*bad\.yaml: schedule broken: cron is not a cron pattern/,
    );
    expect(proc.output()).not.toMatch(/\n\s+at /);
  });
});

/**
 * PROTOCOL.md §30 (issue "Operate it", items 1–3) across real processes: a gateway with authentication, a retention
 * policy and an operator, a worker of test/fixtures/operate-tools.mjs, Redis.
 * - A failed task is kept as long as the failed retention says, and its ttl says so.
 * - An operator finds every failed task of the last week by tool and tag (the call's tags and the tool's `ctx.tag`),
 *   across principals; anyone else finds only their own; a bad filter is a 400 naming it.
 * - An operator replays one failed task with its succeeded steps skipped (a redrive), and the two are linked both
 *   ways in `tasks/get`; a bulk replay counts first (dry run), then replays the rest once (a second run skips them).
 * - The CLI does the same: `taskrelay list --status failed --tool … --tag … --since 7d` and `taskrelay replay`.
 * - §30.4: each run's `ctx.log` lines are kept with the task: the operator and the task's own principal read them
 *   (`taskrelay logs ID`), another principal gets 404.
 */
import { resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { startCli } from './helpers/cli.js';
import { ROOT } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { getTask, startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const WEEK_MS = 7 * 86_400_000;
const stack = useStack({
  name: 'operate',
  gateways: [
    {
      TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token,ops:ops-token',
      TASKRELAY_OPERATORS: 'ops',
      TASKRELAY_RETAIN_FAILED_MS: String(WEEK_MS),
    },
  ],
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/operate-tools.mjs') }],
});

const bearer = (who: string) => ({ Authorization: `Bearer ${who}-token` });
const base = () => stack.gateway.url.replace(/\/mcp$/, '');
async function api(path: string, who: string, init: RequestInit = {}) {
  const res = await fetch(`${base()}${path}`, {
    ...init,
    headers: { ...bearer(who), ...(init.body ? { 'content-type': 'application/json' } : {}), ...init.headers },
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}
const idsOf = (body: Record<string, unknown>) => (body['tasks'] as Array<{ taskId: string }>).map((t) => t.taskId);

/** Runs `report` as `who`'s task with `tags`, and waits for it to end. */
async function runReport(client: Client, report: string, tags: string[]) {
  const taskId = await startTask(client, 'nightly_report', { report }, { meta: { 'dev.taskrelay/tags': tags } });
  await taskResult(client, taskId);
  return taskId;
}

/** Runs the CLI against the stack as `who`; resolves with its exit code and output. */
async function cli(who: string, ...args: string[]) {
  const run = startCli(['--url', stack.gateway.url, '--token', `${who}-token`, ...args]);
  const code = await run.exited;
  return { code, stdout: run.stdout(), stderr: run.stderr() };
}

describe('§30 operating ended work', () => {
  it('keeps failed work, finds it by tool and tag across principals, and replays it with its steps skipped', async () => {
    const { r, prefix } = stack;
    const alice = await stack.client(bearer('alice'));
    const bob = await stack.client(bearer('bob'));
    await r.set(`${prefix}:operate:down`, '1');
    const a1 = await runReport(alice, 'q1', ['nightly']);
    const a2 = await runReport(alice, 'q2', ['adhoc']);
    const b1 = await runReport(bob, 'q3', ['nightly']);
    const fetchesBefore = Number(await r.get(`${prefix}:operate:fetches`));
    expect(fetchesBefore).toBe(3);

    // §30.1: kept a week, and its ttl says so.
    expect(await r.pttl(`${prefix}:task:${a1}`)).toBeGreaterThan(WEEK_MS - 60_000);
    expect((await getTask(alice, a1)).ttl).toBe(WEEK_MS);

    // §30.2: the operator finds both principals' failed nightly reports of the last week; the tool's own tag too.
    const since = new Date(Date.now() - WEEK_MS).toISOString();
    const query = `status=failed&tool=nightly_report&tag=nightly&since=${encodeURIComponent(since)}`;
    const found = await api(`/admin/api/tasks?${query}`, 'ops');
    expect(found.status).toBe(200);
    expect(idsOf(found.body)).toEqual([b1, a1]);
    expect(idsOf((await api('/admin/api/tasks?tag=report:q2', 'ops')).body)).toEqual([a2]);
    const [first] = found.body['tasks'] as Array<Record<string, unknown>>;
    expect(first).toMatchObject({ principal: 'bob', status: 'failed', tags: ['nightly', 'report:q3'] });
    expect(first).not.toHaveProperty('arguments');
    // Anyone else sees only their own, whatever principal they name; a non-operator gets no admin route at all.
    expect(idsOf((await api(`/api/tasks?${query}`, 'alice')).body)).toEqual([a1]);
    expect(idsOf((await api(`/api/tasks?${query}&principal=bob`, 'alice')).body)).toEqual([a1]);
    expect((await api(`/admin/api/tasks?${query}`, 'alice')).status).toBe(403);
    // A typo is refused, not ignored: it would widen the search.
    const typo = await api('/admin/api/tasks?stauts=failed', 'ops');
    expect(typo.status).toBe(400);
    expect(typo.body['error']).toMatch(/unknown parameter stauts/);
    expect((await api('/admin/api/tasks?status=broken', 'ops')).body['error']).toMatch(/status must be one or more/);

    // §30.3: the upstream is back; a redrive of alice's task runs again without fetching again.
    await r.del(`${prefix}:operate:down`);
    const replayed = await api(`/admin/api/tasks/${a1}/replay`, 'ops', {
      method: 'POST',
      body: JSON.stringify({ redrive: true }),
    });
    expect(replayed.status).toBe(201);
    const newId = (replayed.body['task'] as { taskId: string }).taskId;
    expect(newId).not.toBe(a1);
    // It is alice's task: she reads it, with its result, and the links show both ways.
    const result = await taskResult(alice, newId);
    expect(result.structuredContent).toEqual({ report: 'q1', rows: 3 });
    expect(Number(await r.get(`${prefix}:operate:fetches`))).toBe(fetchesBefore);
    expect((await getTask(alice, newId))._meta).toMatchObject({ 'dev.taskrelay/replay-of': a1 });
    expect((await getTask(alice, a1))._meta).toMatchObject({ 'dev.taskrelay/replayed-by': newId });
    // An unfinished or unknown task is not replayed.
    expect((await api('/admin/api/tasks/nope/replay', 'ops', { method: 'POST', body: '{}' })).status).toBe(404);
    // A browser on another origin cannot replay.
    const cross = await api(`/admin/api/tasks/${a2}/replay`, 'ops', {
      method: 'POST',
      body: '{}',
      headers: { origin: 'http://evil.example' },
    });
    expect(cross.status).toBe(403);

    // Bulk: a dry run counts the failed nightly reports not replayed yet (bob's), the run replays them, a second run
    // finds nothing left to replay.
    const filter = { status: 'failed', tool: 'nightly_report', tag: 'nightly' };
    const dry = await api('/admin/api/tasks/replay', 'ops', {
      method: 'POST',
      body: JSON.stringify({ ...filter, dryRun: true }),
    });
    expect(dry.body).toMatchObject({ matched: 1, skipped: 1, replayed: [] });
    const bulk = await api('/admin/api/tasks/replay', 'ops', { method: 'POST', body: JSON.stringify(filter) });
    expect(bulk.body).toMatchObject({ matched: 1, replayed: [{ from: b1 }], failed: [] });
    const bobReplay = (bulk.body['replayed'] as Array<{ to: string }>)[0]!.to;
    await waitFor(async () => (await getTask(bob, bobReplay)).status === 'completed', {
      message: 'bob’s replay did not complete',
    });
    const again = await api('/admin/api/tasks/replay', 'ops', { method: 'POST', body: JSON.stringify(filter) });
    expect(again.body).toMatchObject({ matched: 0, skipped: 2 });
    const typoBody = await api('/admin/api/tasks/replay', 'ops', {
      method: 'POST',
      body: JSON.stringify({ ...filter, dryrun: true }),
    });
    expect(typoBody.status).toBe(400);
  });

  it('the CLI lists failed work by tool and tag (an operator every principal’s, anyone else their own) and replays it', async () => {
    const { r, prefix } = stack;
    const alice = await stack.client(bearer('alice'));
    const bob = await stack.client(bearer('bob'));
    await r.set(`${prefix}:operate:down`, '1');
    const a = await runReport(alice, 'cli-a', ['cli']);
    const b = await runReport(bob, 'cli-b', ['cli']);
    const filters = ['--status', 'failed', '--tool', 'nightly_report', '--tag', 'cli', '--since', '7d'];
    const ops = await cli('ops', 'list', ...filters);
    expect(ops.code).toBe(0);
    const rows = ops.stdout.trim().split('\n');
    expect(rows.map((l) => l.split(/\s+/)[0])).toEqual([b, a]);
    expect(rows[0]).toMatch(/failed .*nightly_report .*bob .*\[cli, report:cli-b\].*NON_RETRYABLE: upstream down/);
    const own = await cli('alice', '--json', 'list', ...filters);
    expect(
      own.stdout
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { task: { taskId: string } }).task.taskId),
    ).toEqual([a]);
    // Replay: counted first, then run; a non-operator is told what it needs.
    const refused = await cli('alice', 'replay', a);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/operator's token/);
    await r.del(`${prefix}:operate:down`);
    const dry = await cli('ops', 'replay', ...filters, '--dry-run');
    expect(dry.stdout).toMatch(/^2 task\(s\) would be replayed/m);
    const run = await cli('ops', 'replay', ...filters);
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^2 of 2 replayed/m);
    const usage = await cli('ops', 'replay');
    expect(usage.code).toBe(2);
    expect(usage.stderr).toMatch(/needs a task id, or filters/);
  });

  it('§30.4 keeps each run’s log lines with the task, for the operator and its own principal only', async () => {
    const { r, prefix } = stack;
    const alice = await stack.client(bearer('alice'));
    await r.set(`${prefix}:operate:down`, '1');
    const id = await runReport(alice, 'logs', []);
    const ops = await api(`/admin/api/tasks/${id}/logs`, 'ops');
    expect(ops.status).toBe(200);
    expect(ops.body).toMatchObject({ taskId: id, status: 'failed' });
    const lines = ops.body['lines'] as Array<Record<string, unknown>>;
    expect(lines).toMatchObject([
      { level: 'info', msg: 'publishing logs', report: 'logs', attempt: 1 },
      { level: 'warn', msg: 'upstream down', attempt: 1 },
    ]);
    const own = await api(`/api/tasks/${id}/logs?after=${String(lines[0]!['id'])}`, 'alice');
    expect((own.body['lines'] as Array<{ msg: string }>).map((l) => l.msg)).toEqual(['upstream down']);
    expect((await api(`/api/tasks/${id}/logs`, 'bob')).status).toBe(404);
    expect((await api(`/api/tasks/${id}/logs?after=nonsense`, 'alice')).status).toBe(400);
    const printed = await cli('alice', 'logs', id, '--follow');
    expect(printed.code).toBe(0);
    expect(printed.stdout).toMatch(/INFO +\[run 1\] publishing logs \{"report":"logs"\}/);
    expect(printed.stdout).toMatch(/WARN +\[run 1\] upstream down/);
    await r.del(`${prefix}:operate:down`);
  });

  it('§30.5 an operator cancels any principal’s task, once; the action is audited', async () => {
    const alice = await stack.client(bearer('alice'));
    const id = await startTask(alice, 'slow_report', { ms: 60_000 });
    const cancelled = await api(`/admin/api/tasks/${id}/cancel`, 'ops', { method: 'POST', body: '{}' });
    expect(cancelled.status).toBe(200);
    expect(cancelled.body['task']).toMatchObject({ taskId: id, status: 'cancelled' });
    expect((await getTask(alice, id)).status).toBe('cancelled');
    const again = await api(`/admin/api/tasks/${id}/cancel`, 'ops', { method: 'POST', body: '{}' });
    expect(again.status).toBe(409);
    expect((await api(`/admin/api/tasks/${id}/cancel`, 'alice', { method: 'POST', body: '{}' })).status).toBe(403);
    const overview = await api('/admin/api/overview', 'ops');
    const audit = overview.body['audit'] as Array<Record<string, unknown>>;
    expect(audit[0]).toMatchObject({ by: 'ops', action: 'cancel', target: id, outcome: 'cancelled' });
  });
});

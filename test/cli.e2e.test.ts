/**
 * Issue 13, docs/CLI.md: the `taskrelay` CLI off a TTY (plain lines, `--json` lines) against a real stack, its
 * exit codes, and Ctrl-C (SIGINT) cancelling what it started.
 */
import { spawnSync } from 'node:child_process';
import getPort from 'get-port';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { readMetric, type GatewayProcess } from './helpers/processes.js';
import { CLI_MAIN, runCli, startCli } from './helpers/cli.js';

const stack = useStack({ name: 'cli', gateways: [{}, { TASKRELAY_AUTH_TOKENS: 'alice:s3cret' }] });
let authed: GatewayProcess;
let client: Client;
let env: Record<string, string>;

beforeAll(async () => {
  authed = stack.gateways[1]!;
  client = await stack.client();
  env = { TASKRELAY_URL: stack.gateway.url };
});

/** Progress lines of one call: each its own, strictly increasing, the last at `total`. */
function expectProgressLines(lines: string[], prefix: string, total: number, report: string): void {
  expect(lines.length).toBeGreaterThan(0);
  const values = lines.map((line) => {
    const match = new RegExp(
      `^${prefix.replace(/[[\]]/g, '\\$&')}build_report (\\d+)/${total} Processed \\1 of ${total} items for ${report}$`,
    ).exec(line);
    expect(match, line).not.toBeNull();
    return Number(match![1]);
  });
  expect(values.at(-1)).toBe(total);
  for (let i = 1; i < values.length; i++) expect(values[i]!).toBeGreaterThan(values[i - 1]!);
}

async function taskStatus(taskId: string): Promise<string> {
  return (await client.experimental.tasks.getTask(taskId)).status;
}

describe('taskrelay CLI off a TTY', () => {
  it('lists the live tools, one per line', async () => {
    const run = await runCli(['tools'], env);
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^build_report\s+optional\s+Builds a report/m);
    expect(run.stdout).toMatch(/^fail_after\s+optional/m);
  });

  it('prints one plain line per progress update, then the result, and exits 0', async () => {
    const run = await runCli(['call', 'build_report', 'report=q3', 'items=4', 'delayMs=20'], env);
    expect(run.code).toBe(0);
    const lines = run.stdout.trim().split('\n');
    expect(lines.at(-1)).toBe('completed: Report "q3" built from 4 items');
    // The throttle may merge updates (the newest wins): every line is one update, increasing, ending at 4/4.
    expectProgressLines(lines.slice(0, -1), '', 4, 'q3');
  });

  it('keeps every parallel call on its own numbered lines, with {i} giving each its own arguments', async () => {
    const run = await runCli(
      ['call', 'build_report', 'report=r{i}', 'items={i}', 'delayMs=10', '--task', '--parallel', '3'],
      env,
    );
    expect(run.code).toBe(0);
    for (const n of [1, 2, 3]) {
      const mine = run.stdout.split('\n').filter((l) => l.startsWith(`[${n}] `));
      // Call n processes n items, each line naming its own report: nothing of another call leaks in.
      expect(mine[0]).toMatch(new RegExp(`^\\[${n}\\] task [0-9a-f]+ working$`));
      expect(mine.at(-1)).toBe(`[${n}] completed: Report "r${n}" built from ${n} items`);
      expect(mine.at(-2)).toBe(`[${n}] status completed`);
      expectProgressLines(mine.slice(1, -2), `[${n}] `, n, `r${n}`);
    }
  });

  it('writes JSON lines (task, progress, result) with --json, and the task is completed', async () => {
    const run = await runCli(
      ['--json', 'call', 'build_report', 'report=j', 'items=3', 'delayMs=10', '--ttl', '60000'],
      env,
    );
    expect(run.code).toBe(0);
    const types = run.lines.map((l) => l['type']);
    expect(types[0]).toBe('task');
    expect(types.at(-1)).toBe('result');
    const created = run.lines[0]!['task'] as { taskId: string; ttl: number };
    expect(created.ttl).toBe(60_000);
    const progress = run.lines.filter((l) => l['type'] === 'progress');
    expect(progress.length).toBeGreaterThan(0);
    expect(progress.at(-1)).toMatchObject({ progress: 3, total: 3, taskId: created.taskId, tool: 'build_report' });
    const values = progress.map((p) => p['progress'] as number);
    expect(values).toEqual([...values].sort((a, b) => a - b));
    expect(new Set(values).size).toBe(values.length);
    const result = run.lines.at(-1)!;
    expect(result['status']).toBe('completed');
    expect((result['result'] as { structuredContent: unknown }).structuredContent).toEqual({ report: 'j', items: 3 });
    expect(await taskStatus(created.taskId)).toBe('completed');
  });

  it('exits 1 with the message when the tool fails', async () => {
    const run = await runCli(['call', 'fail_after', 'delayMs=10', 'message=disk full', '--task'], env);
    expect(run.code).toBe(1);
    expect(run.stdout).toContain('failed: disk full');
  });

  it('exits 1 with the gateway error for an unknown tool', async () => {
    const run = await runCli(['call', 'no_such_tool'], env);
    expect(run.code).toBe(1);
    expect(run.stdout).toContain('Unknown tool: no_such_tool');
  });

  it.each([
    [['call', 'build_report', 'items'], /argument "items" is not key=value/],
    [['call', 'build_report', '--parallel', '0'], /--parallel must be a positive integer/],
    [['call'], /missing required argument 'tool'/],
    [['frobnicate'], /unknown command 'frobnicate'/],
    [['--nope', 'tools'], /unknown option '--nope'/],
  ])('exits 2 with one line for the usage error in %j', async (args, message) => {
    const run = await runCli(args, env);
    expect(run.code).toBe(2);
    expect(run.stderr.trim().split('\n')).toHaveLength(1);
    expect(run.stderr).toMatch(message);
  });

  it('gets, waits for and cancels tasks by id', async () => {
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'c', items: 1000, delayMs: 50 }, task: {} },
      },
      CreateTaskResultSchema,
    );
    const id = created.task.taskId;
    const got = await runCli(['--json', 'get', id], env);
    expect(got.code).toBe(0);
    expect(got.lines[0]).toMatchObject({ type: 'task', task: { taskId: id, status: 'working' } });

    const waiting = startCli(['result', id], env);
    const cancelled = await runCli(['cancel', id], env);
    expect(cancelled.code).toBe(0);
    expect(cancelled.stdout).toMatch(new RegExp(`^${id}\\s+cancelled`));
    // `result` of a task that ends cancelled exits 130, as a cancelled call does.
    expect(await waiting.exited).toBe(130);

    const again = await runCli(['cancel', id], env);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/terminal|cancelled/i);
  });

  it('runs a plain call of a taskSupport: required tool as a task', async () => {
    // wait_for_approval is the demo's task-required tool: without --task it used to fail with -32601. Off a TTY the
    // CLI cannot answer the tool's question (no elicitation capability), so the task it became fails at its question,
    // at once and with that reason. (This test used to Ctrl-C it, which raced that failure: exit 1 or 130.)
    const run = await runCli(['--json', 'call', 'wait_for_approval', 'question=ok?'], env);
    expect(run.code, run.stderr).toBe(1);
    expect(run.stderr).not.toMatch(/-32601|requires task augmentation/);
    const lines = run.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(lines[0]).toMatchObject({ type: 'task', task: { status: 'working' } });
    expect(lines.at(-1)).toMatchObject({ type: 'result', status: 'failed', result: { isError: true } });
    expect(JSON.stringify(lines.at(-1))).toMatch(/did not declare the elicitation capability/);
  });

  it('says that tasks/list needs authentication when the gateway does not offer it', async () => {
    const run = await runCli(['list'], env);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/does not offer tasks\/list: it lists tasks only with authentication on/);
    expect(run.stderr).not.toMatch(/Method not found/);
  });

  it('stops quietly when its reader goes away (taskrelay call ... | head -1)', () => {
    const piped = spawnSync(
      'sh',
      ['-c', `'${process.execPath}' '${CLI_MAIN}' --json call build_report report=p items=400 delayMs=1 | head -1`],
      {
        encoding: 'utf8',
        env: { ...process.env, ...env },
      },
    );
    expect(piped.stdout.trim().split('\n')).toHaveLength(1);
    expect(piped.stderr).not.toMatch(/EPIPE|Error:|at /);
  });

  it('lists only the caller’s tasks with its token, and says why without one', async () => {
    const mine = await runCli(['--json', 'call', 'build_report', 'report=a', 'items=1', 'delayMs=0', '--task'], {
      TASKRELAY_URL: authed.url,
      TASKRELAY_TOKEN: 's3cret',
    });
    expect(mine.code).toBe(0);
    const id = (mine.lines[0]!['task'] as { taskId: string }).taskId;
    const listed = await runCli(['--json', '--url', authed.url, '--token', 's3cret', 'list'], {});
    expect(listed.code).toBe(0);
    expect(listed.lines.map((l) => (l['task'] as { taskId: string }).taskId)).toEqual([id]);

    const anonymous = await runCli(['list', '--url', authed.url], {});
    expect(anonymous.code).toBe(1);
    expect(anonymous.stderr).toMatch(/401|Unauthorized|Authorization header|bearer token required/i);
  });

  it('says in one line what to do when its first command cannot reach MCP (no gateway, no /mcp, no token)', async () => {
    const oneLine = (stderr: string) => {
      expect(stderr.trim().split('\n')).toHaveLength(1);
      expect(stderr).not.toMatch(/<html|<!doctype|"jsonrpc"|fetch failed/i);
    };
    const free = await getPort({ host: '127.0.0.1' });
    const nobody = await runCli(['tools', '--url', `http://127.0.0.1:${free}/mcp`], {});
    expect(nobody.code).toBe(1);
    oneLine(nobody.stderr);
    expect(nobody.stderr).toMatch(/cannot reach the gateway at .*\(connection refused\): is it running\?.*--url/);

    const noPath = await runCli(['tools', '--url', stack.gateway.url.replace(/\/mcp$/, '')], {});
    expect(noPath.code).toBe(1);
    oneLine(noPath.stderr);
    expect(noPath.stderr).toMatch(/is not an MCP endpoint \(HTTP 404\): .*try --url http:\/\/127\.0\.0\.1:\d+\/mcp/);

    const noToken = await runCli(['tools', '--url', authed.url], {});
    expect(noToken.code).toBe(1);
    oneLine(noToken.stderr);
    expect(noToken.stderr).toMatch(/needs a bearer token \(HTTP 401\): pass --token <token> or set TASKRELAY_TOKEN/);

    const wrongToken = await runCli(['tools', '--url', authed.url, '--token', 'nope'], {});
    expect(wrongToken.code).toBe(1);
    expect(wrongToken.stderr).toMatch(/refused the token \(HTTP 401\)/);
  });

  it('says a rate limit (HTTP 429) in one readable line, not as the raw JSON body', async () => {
    // A principal of its own: the limit's counter is per principal across the deployment (the file's other gateways
    // count alice's calls in it too).
    const limited = await stack.addGateway({ TASKRELAY_AUTH_TOKENS: 'carol:c4rol', TASKRELAY_RATE_LIMIT_CALLS: '1' });
    const call = () =>
      runCli(
        ['--url', limited.url, '--token', 'c4rol', 'call', 'build_report', 'report=r', 'items=1', 'delayMs=0'],
        {},
      );
    expect((await call()).code).toBe(0);
    const refused = await call();
    expect(refused.code).toBe(1);
    // The call's outcome line, as for any failed call: the gateway's message, not its JSON body.
    expect(refused.stdout.trim().split('\n')).toHaveLength(1);
    expect(refused.stdout).not.toMatch(/[{}]|jsonrpc/);
    expect(refused.stdout.trim()).toMatch(
      /^failed: the gateway is limiting this principal \(HTTP 429\): Too many requests: rate limit for this principal reached; retry after \d+ s$/,
    );
  });

  it('cancels a running task call on Ctrl-C (tasks/cancel) and exits 130', async () => {
    const run = startCli(['--json', 'call', 'build_report', 'report=int', 'items=1000', 'delayMs=50', '--task'], env);
    await waitFor(() => run.lines().some((l) => l['type'] === 'progress'), {
      timeoutMs: 15_000,
      message: 'no progress from the CLI',
    });
    const taskId = (run.lines()[0]!['task'] as { taskId: string }).taskId;
    run.child.kill('SIGINT');
    expect(await run.exited).toBe(130);
    expect(await taskStatus(taskId)).toBe('cancelled');
    expect(run.lines().at(-1)).toMatchObject({ type: 'result', status: 'cancelled', taskId });
  });

  it('cancels a running plain call on Ctrl-C (notifications/cancelled) and exits 130', async () => {
    const before = await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', {
      trigger: 'notifications/cancelled',
    });
    const run = startCli(['call', 'build_report', 'report=plain', 'items=1000', 'delayMs=50'], env);
    await waitFor(() => run.stdout().includes('build_report 1/1000'), {
      timeoutMs: 15_000,
      message: 'no progress from the CLI',
    });
    run.child.kill('SIGINT');
    expect(await run.exited).toBe(130);
    expect(run.stdout().trim().split('\n').at(-1)).toBe('cancelled');
    // The gateway got the cancel before the CLI exited.
    expect(
      await readMetric(stack.gateway.url, 'taskrelay_cancel_requests_total', { trigger: 'notifications/cancelled' }),
    ).toBe(before + 1);
  });

  it('stops watching on Ctrl-C, saying so, and leaves the task running (not "cancelled"), exit 130', async () => {
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'w', items: 1000, delayMs: 50 }, task: {} },
      },
      CreateTaskResultSchema,
    );
    const taskId = created.task.taskId;
    for (const json of [false, true]) {
      const run = startCli([...(json ? ['--json'] : []), 'watch', taskId], env);
      await waitFor(
        () => run.stdout().includes(json ? '"type":"progress"' : 'build_report') || run.stdout().includes(`${taskId}`),
        {
          timeoutMs: 15_000,
          message: 'watch printed nothing',
        },
      );
      run.child.kill('SIGINT');
      expect(await run.exited).toBe(130);
      if (json) {
        expect(run.lines().at(-1)).toMatchObject({ type: 'result', status: 'stopped', taskId });
      } else {
        const last = run.stdout().trim().split('\n').at(-1);
        expect(last).toBe(`stopped watching; task ${taskId} goes on (working)`);
        expect(run.stdout()).not.toMatch(/cancelled/);
      }
      expect(await taskStatus(taskId)).toBe('working');
    }
    await client.experimental.tasks.cancelTask(taskId);
  });
});

/**
 * Issue 2 end to end: the built gateway and workers as separate processes, driven by the SDK's own Client over HTTP.
 */
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, CreateTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { FIRST_POLL_MS } from '@taskrelay/shared';
import { GATEWAY_MAIN, WORKER_MAIN, spawnNode, startGatewayProcess, startWorkerProcess } from './helpers/processes.js';

const stack = useStack({ name: 'e2e', workers: [{}, FIXTURE_WORKER] });
let client: Client;

beforeAll(async () => {
  client = await stack.client();
});

async function expectRpcError(promise: Promise<unknown>, code: number, message: RegExp): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(McpError);
  expect((error as McpError).code).toBe(code);
  expect((error as McpError).message).toMatch(message);
}

describe('the gateway names itself', () => {
  it('with the version of its package.json in serverInfo', async () => {
    const { version } = JSON.parse(
      readFileSync(new URL('../packages/gateway/package.json', import.meta.url), 'utf8'),
    ) as {
      version: string;
    };
    expect(client.getServerVersion()).toMatchObject({ name: 'taskrelay-gateway', version });
  });
});

describe('§3 tool catalog and heartbeat', () => {
  it('lists the demo tools and the fixture tools of every live worker with their task support', async () => {
    const { tools } = await client.listTools();
    const byName = new Map(tools.map((t) => [t.name, t]));
    expect(byName.get('build_report')?.execution?.taskSupport).toBe('optional');
    expect(byName.get('fail_after')?.execution?.taskSupport).toBe('optional');
    expect(byName.get('required_task')?.execution?.taskSupport).toBe('required');
    expect(byName.get('build_report')?.inputSchema).toMatchObject({
      type: 'object',
      properties: { report: { type: 'string' }, items: { type: 'integer' } },
    });
    expect(byName.get('wait_for_approval')?.execution?.taskSupport).toBe('required');
  });
});

describe('§4 calling a tool', () => {
  it('answers a task-augmented call with CreateTaskResult and completes it', async () => {
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'sales', items: 3, delayMs: 5 }, task: { ttl: 60_000 } },
      },
      CreateTaskResultSchema,
    );
    expect(created.task).toMatchObject({ status: 'working', ttl: 60_000 });
    expect(created.task.taskId).toMatch(/^[0-9a-f]{32}$/);
    // The first poll comes soon, and waits there for the task's end (PROTOCOL.md §28.1, §28.2).
    expect(created.task.pollInterval).toBe(FIRST_POLL_MS);
    expect(Date.parse(created.task.createdAt)).not.toBeNaN();

    const done = await waitFor(async () => {
      const t = await client.experimental.tasks.getTask(created.task.taskId);
      return t.status === 'completed' ? t : undefined;
    });
    expect(done.taskId).toBe(created.task.taskId);

    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toEqual({ report: 'sales', items: 3 });
    expect(result.content[0]).toMatchObject({ type: 'text' });
    expect(result._meta?.['io.modelcontextprotocol/related-task']).toEqual({ taskId: created.task.taskId });
  });

  it('blocks on tasks/result until the task is terminal', async () => {
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'slow', items: 5, delayMs: 40 }, task: {} },
      },
      CreateTaskResultSchema,
    );
    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ report: 'slow', items: 5 });
    expect((await client.experimental.tasks.getTask(created.task.taskId)).status).toBe('completed');
  });

  it('returns the result directly for a plain call', async () => {
    const result = await client.callTool({
      name: 'build_report',
      arguments: { report: 'plain', items: 2, delayMs: 1 },
    });
    expect(result.structuredContent).toEqual({ report: 'plain', items: 2 });
  });

  it('runs the SDK callToolStream helper to its result', async () => {
    const kinds: string[] = [];
    let final: unknown;
    for await (const m of client.experimental.tasks.callToolStream(
      { name: 'build_report', arguments: { report: 'stream', items: 2, delayMs: 1 } },
      CallToolResultSchema,
      { task: { ttl: 30_000 } },
    )) {
      kinds.push(m.type);
      if (m.type === 'result') final = m.result;
    }
    expect(kinds[0]).toBe('taskCreated');
    expect(kinds.at(-1)).toBe('result');
    expect((final as { structuredContent: unknown }).structuredContent).toEqual({ report: 'stream', items: 2 });
  });

  it('ends fail_after failed with a CallToolResult carrying its message', async () => {
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'fail_after', arguments: { delayMs: 10, message: 'disk full' }, task: {} },
      },
      CreateTaskResultSchema,
    );
    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toContain('disk full');
    const task = await client.experimental.tasks.getTask(created.task.taskId);
    expect(task.status).toBe('failed');
    expect(task.statusMessage).toContain('disk full');
  });

  it('answers a ProtocolError as that JSON-RPC error, on tasks/result and on a plain call (§13)', async () => {
    const args = { code: -32602, message: 'range out of bounds', data: { field: 'n' } };
    const created = await client.request(
      { method: 'tools/call', params: { name: 'protocol_error', arguments: args, task: {} } },
      CreateTaskResultSchema,
    );
    const fromTask = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(fromTask).toBeInstanceOf(McpError);
    expect(fromTask).toMatchObject({ code: -32602, data: { field: 'n' } });
    // One "MCP error -32602:" prefix (the client's own), not two.
    expect((fromTask as McpError).message).toBe('MCP error -32602: range out of bounds');
    const task = await client.experimental.tasks.getTask(created.task.taskId);
    expect(task.status).toBe('failed');
    await expectRpcError(client.callTool({ name: 'protocol_error', arguments: args }), -32602, /range out of bounds/);
  });

  it('returns a failed plain call as an isError result', async () => {
    const result = await client.callTool({ name: 'fail_after', arguments: { delayMs: 1, message: 'nope' } });
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toContain('nope');
  });

  it('answers bad arguments with an isError tool result naming the field (SEP-1303)', async () => {
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ report: 'x', items: 'many' }, /items/],
      [{ items: 1 }, /report.*required/],
      [{ report: 'x', items: 0 }, /items/],
    ];
    for (const [args, message] of cases) {
      const result = await client.callTool({ name: 'build_report', arguments: args });
      expect(result.isError).toBe(true);
      expect(JSON.stringify(result.content)).toMatch(message);
      // No doubled "MCP error -32602:" prefix: the text is the message alone.
      expect(JSON.stringify(result.content)).not.toMatch(/MCP error/);
    }
  });

  it('answers a task call with bad arguments with a task that failed naming the field, and runs nothing', async () => {
    const created = await client.request(
      { method: 'tools/call', params: { name: 'build_report', arguments: { report: 'x' }, task: {} } },
      CreateTaskResultSchema,
    );
    const task = await client.experimental.tasks.getTask(created.task.taskId);
    expect(task.status).toBe('failed');
    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toMatch(/items.*required/);
  });

  it('validates with JSON Schema 2020-12: a tuple argument is accepted, a format is checked, $schema is listed', async () => {
    const { tools } = await client.listTools();
    const listed = tools.find((t) => t.name === 'schema_2020');
    expect(listed?.inputSchema['$schema']).toBe('https://json-schema.org/draft/2020-12/schema');
    const ok = await client.callTool({ name: 'schema_2020', arguments: { point: [1, 2], email: 'a@b.example' } });
    expect(ok.isError).toBeFalsy();
    expect(ok.structuredContent).toEqual({ point: [1, 2], email: 'a@b.example' });
    const badFormat = await client.callTool({ name: 'schema_2020', arguments: { point: [1, 2], email: 'nope' } });
    expect(badFormat.isError).toBe(true);
    expect(JSON.stringify(badFormat.content)).toMatch(/email/);
    const badTuple = await client.callTool({
      name: 'schema_2020',
      arguments: { point: [1, 2, 3], email: 'a@b.example' },
    });
    expect(badTuple.isError).toBe(true);
    expect(JSON.stringify(badTuple.content)).toMatch(/point/);
  });

  it('rejects an unknown tool with a JSON-RPC error', async () => {
    await expectRpcError(
      client.callTool({ name: 'no_such_tool', arguments: {} }),
      -32602,
      /Unknown tool: no_such_tool/,
    );
  });

  it('answers taskSupport mismatches with -32601', async () => {
    await expectRpcError(
      client.request({ method: 'tools/call', params: { name: 'required_task', arguments: {} } }, CallToolResultSchema),
      -32601,
      /requires task augmentation/,
    );
    await expectRpcError(
      client.request(
        { method: 'tools/call', params: { name: 'forbidden_task', arguments: {}, task: {} } },
        CreateTaskResultSchema,
      ),
      -32601,
      /does not support task-augmented/,
    );
  });

  it('answers an unknown task id with -32602 on every tasks method', async () => {
    const id = '0'.repeat(32);
    await expectRpcError(client.experimental.tasks.getTask(id), -32602, /not found/i);
    await expectRpcError(client.experimental.tasks.getTaskResult(id, CallToolResultSchema), -32602, /not found/i);
    await expectRpcError(client.experimental.tasks.cancelTask(id), -32602, /not found/i);
  });

  it('does not offer tasks/list without authentication', async () => {
    expect(client.getServerCapabilities()?.tasks).toEqual({ cancel: {}, requests: { tools: { call: {} } } });
    await expectRpcError(client.experimental.tasks.listTasks(), -32601, /not found/i);
  });
});

describe('HTTP surface', () => {
  const base = () => stack.gateway.url.replace(/\/mcp$/, '');

  it('serves health, readiness and metrics without authentication', async () => {
    expect((await fetch(`${base()}/healthz`)).status).toBe(200);
    expect((await fetch(`${base()}/readyz`)).status).toBe(200);
    const metrics = await (await fetch(`${base()}/metrics`)).text();
    expect(metrics).toContain('taskrelay_tasks_created_total');
  });

  it('answers malformed JSON with a JSON-RPC parse error', async () => {
    const res = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: '{"jsonrpc": "2.0", "method": ',
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: number } }).error.code).toBe(-32700);
  });

  it('refuses a foreign Origin with 403 and an unknown session with 404', async () => {
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const forbidden = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: { ...headers, origin: 'https://evil.example' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    });
    expect(forbidden.status).toBe(403);
    const unknown = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: { ...headers, 'mcp-session-id': 'nope' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    });
    expect(unknown.status).toBe(404);
  });
});

describe('entry points', () => {
  it('exit with one line, no stack, on invalid configuration', async () => {
    for (const script of [GATEWAY_MAIN, WORKER_MAIN]) {
      const p = spawnNode(script, { REDIS_URL: stack.redis.url, LOG_LEVEL: 'nonsense' });
      expect(await p.exited).toBe(1);
      const lines = p.output().trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(/LOG_LEVEL must be one of/);
    }
  });

  it('exit with one line when Redis is unreachable', async () => {
    for (const script of [GATEWAY_MAIN, WORKER_MAIN]) {
      const p = spawnNode(script, { REDIS_URL: 'redis://127.0.0.1:1', PORT: '0' });
      expect(await p.exited).toBe(1);
      const lines = p.output().trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(/Redis is unreachable at 127\.0\.0\.1:1/);
    }
  });

  it('exit 0 on SIGTERM', async () => {
    const env = { REDIS_URL: stack.redis.url, TASKRELAY_PREFIX: `${stack.prefix}-sig` };
    const g = await startGatewayProcess(env);
    const w = await startWorkerProcess(env);
    expect(await g.kill('SIGTERM')).toBe(0);
    expect(await w.kill('SIGTERM')).toBe(0);
  });
});

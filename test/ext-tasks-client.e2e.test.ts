/**
 * Issue 8: a client nobody here wrote — `@modelcontextprotocol/ext-tasks` 0.2.2 on the v2 SDK client
 * (`@modelcontextprotocol/client` 2.4) — runs, reads and cancels taskrelay tasks on both transports: a 2025-11-25
 * session (2025-11-25 tasks) and the sessionless 2026-07-28 transport (the tasks extension).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { useStack } from './helpers/stack.js';

const stack = useStack({ name: 'ext-client' });
let client: Client;
let session: ReturnType<typeof createTaskSessionFromClient>;

beforeAll(async () => {
  client = new Client({ name: 'ext-tasks-test', version: '0' }, { capabilities: {} });
  await client.connect(new StreamableHTTPClientTransport(new URL(stack.gateway.url)));
  session = createTaskSessionFromClient(client, { endpointId: 'taskrelay' });
});

afterAll(async () => {
  await session?.close();
  await client?.close();
});

/** The tool as the caller knows it; ext-tasks decides task execution from the declaration. */
const declaration = (name: string) => ({ name, inputSchema: { type: 'object' }, taskSupport: 'optional' as const });
const asTask = (name: string) => ({ task: { preference: 'require' as const }, declaration: declaration(name) });

describe('§13 ext-tasks 0.2.2 against taskrelay (2025-11-25 session)', () => {
  it('runs a task to its result', async () => {
    const execution = await session.callTool(
      'build_report',
      { report: 'ext', items: 3, delayMs: 5 },
      asTask('build_report'),
    );
    expect(execution.kind).toBe('task');
    const { outcome } = await execution.settle();
    expect(outcome).toMatchObject({ status: 'completed', result: { structuredContent: { report: 'ext', items: 3 } } });
  });

  it('reports a tool error as a failed task carrying its message', async () => {
    const execution = await session.callTool('fail_after', { delayMs: 5, message: 'disk full' }, asTask('fail_after'));
    const { outcome } = await execution.settle();
    expect(outcome).toMatchObject({ status: 'failed', task: { statusMessage: 'disk full' } });
  });

  it('cancels a running task', async () => {
    const execution = await session.callTool(
      'build_report',
      { report: 'long', items: 1000, delayMs: 50 },
      asTask('build_report'),
    );
    const taskId = (execution as unknown as { handle: { taskId: string } }).handle.taskId;
    await execution.cancel();
    const { outcome } = await execution.settle();
    expect(outcome.status).toBe('cancelled');
    expect(taskId).toMatch(/^[0-9a-f]{32}$/);
  });
});

describe('§13, §14 ext-tasks 0.2.2 against taskrelay (2026-07-28, the tasks extension)', () => {
  let modern: Client;
  let extSession: ReturnType<typeof createTaskSessionFromClient>;
  const clientInfo = { name: 'ext-tasks-2026', version: '0' };

  beforeAll(async () => {
    modern = new Client(clientInfo, { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } });
    await modern.connect(new StreamableHTTPClientTransport(new URL(stack.gateway.url)));
    let nextId = 1;
    // ext-tasks sends the extension's requests itself on this transport: the routing headers are the host's job.
    const rawDispatch = async (input: unknown) => {
      const request = { jsonrpc: '2.0', id: nextId++, ...(input as Record<string, unknown>) } as unknown as {
        method: string;
        id: number;
        params?: { name?: string; taskId?: string };
      };
      const headers: Record<string, string> = {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28',
        'mcp-method': request.method,
      };
      const name = request.method === 'tools/call' ? request.params?.name : request.params?.taskId;
      if (name !== undefined) headers['mcp-name'] = name;
      const res = await fetch(stack.gateway.url, { method: 'POST', headers, body: JSON.stringify(request) });
      return (await res.json()) as never;
    };
    extSession = createTaskSessionFromClient(modern, {
      endpointId: 'taskrelay-2026',
      rawDispatch,
      v2RequestFraming: {
        protocolVersion: '2026-07-28',
        clientInfo,
        clientCapabilities: { extensions: { 'io.modelcontextprotocol/tasks': {} } },
      },
    });
  });

  afterAll(async () => {
    await extSession?.close();
    await modern?.close();
  });

  it('negotiates the 2026-07-28 era with server/discover', () => {
    expect(modern.getProtocolEra()).toBe('modern');
  });

  it('runs a task the server chose to make, to its inlined result', async () => {
    const execution = await extSession.callTool('build_report', { report: 'x', items: 3, delayMs: 5 });
    expect(execution.kind).toBe('task');
    const { outcome } = await execution.settle();
    expect(outcome).toMatchObject({ status: 'completed', result: { structuredContent: { report: 'x', items: 3 } } });
  });

  it('reads a tool error as a completed task whose result has isError', async () => {
    const execution = await extSession.callTool('fail_after', { delayMs: 5, message: 'disk full' });
    const { outcome } = await execution.settle();
    expect(outcome).toMatchObject({ status: 'completed', result: { isError: true } });
  });

  it('cancels a running task', async () => {
    const execution = await extSession.callTool('build_report', { report: 'y', items: 1000, delayMs: 50 });
    await execution.cancel();
    expect((await execution.settle()).outcome.status).toBe('cancelled');
  });
});

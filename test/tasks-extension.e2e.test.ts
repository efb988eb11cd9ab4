/**
 * Issue 8: the io.modelcontextprotocol/tasks extension (SEP-2663) on a 2025-11-25 session, chosen per request by
 * `_meta["io.modelcontextprotocol/clientCapabilities"]`, beside the 2025-11-25 rendering of the same tasks
 * (PROTOCOL.md §13). Real gateway and worker processes; the SDK 1.32.2 client sends the raw requests.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { FIRST_POLL_MS } from '@taskrelay/shared';
import { CallToolResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { FIXTURE_WORKER, useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';

const EXT = 'io.modelcontextprotocol/tasks';
const extMeta = {
  'io.modelcontextprotocol/clientCapabilities': { elicitation: {}, sampling: {}, extensions: { [EXT]: {} } },
};
const Loose = z.looseObject({});
type Loose = Record<string, unknown>;

const stack = useStack({ name: 'ext', workers: [{}, FIXTURE_WORKER] });
let client: Client;

beforeAll(async () => {
  client = await stack.client();
});

function call(name: string, args: Record<string, unknown>): Promise<Loose> {
  return client.request({ method: 'tools/call', params: { name, arguments: args, _meta: extMeta } }, Loose);
}

function extGet(taskId: string): Promise<Loose> {
  return client.request({ method: 'tasks/get', params: { taskId, _meta: extMeta } }, Loose);
}

function extUpdate(taskId: string, inputResponses: Record<string, unknown>): Promise<Loose> {
  return client.request({ method: 'tasks/update', params: { taskId, inputResponses, _meta: extMeta } }, Loose);
}

async function until(taskId: string, status: string): Promise<Loose> {
  return waitFor(
    async () => {
      const task = await extGet(taskId);
      return task['status'] === status ? task : undefined;
    },
    { timeoutMs: 15_000, message: `task ${taskId} did not become ${status}` },
  );
}

async function rpcError(promise: Promise<unknown>): Promise<McpError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(McpError);
  return error as McpError;
}

describe('§13 the tasks extension on a 2025-11-25 session', () => {
  it('advertises the extension at initialize beside 2025-11-25 tasks', () => {
    const capabilities = client.getServerCapabilities() as Loose;
    expect(capabilities['extensions']).toEqual({ [EXT]: {} });
    expect(capabilities['tasks']).toBeDefined();
  });

  it('creates a flat task, inlines the result in tasks/get, and agrees with the 2025 rendering', async () => {
    const created = await call('build_report', { report: 'ext', items: 3, delayMs: 5 });
    expect(created).toMatchObject({ resultType: 'task', status: 'working' });
    expect(created['ttlMs']).toEqual(expect.any(Number));
    expect(created['pollIntervalMs']).toBe(FIRST_POLL_MS);
    for (const legacy of ['task', 'ttl', 'pollInterval']) expect(created).not.toHaveProperty(legacy);
    const taskId = String(created['taskId']);

    const done = await until(taskId, 'completed');
    expect(done['resultType']).toBe('complete');
    expect(done['result']).toMatchObject({ structuredContent: { report: 'ext', items: 3 } });
    expect(JSON.stringify(done['result'])).not.toContain('related-task');

    // The same stored task through the 2025-11-25 rendering.
    const v1 = await client.experimental.tasks.getTask(taskId);
    expect(v1.status).toBe('completed');
    const v1Result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(v1Result.structuredContent).toEqual((done['result'] as Loose)['structuredContent']);
  });

  it('renders a tool error as completed + isError here and failed in the 2025 rendering', async () => {
    const created = await call('fail_after', { delayMs: 1, message: 'disk full' });
    const taskId = String(created['taskId']);
    const done = await until(taskId, 'completed');
    expect(done['result']).toMatchObject({ isError: true });
    expect(JSON.stringify(done['result'])).toContain('disk full');
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('failed');
  });

  it('renders a ProtocolError as failed with the JSON-RPC error and no result', async () => {
    const created = await call('protocol_error', { code: -32602, message: 'bad range' });
    const failed = await until(String(created['taskId']), 'failed');
    expect(failed['error']).toMatchObject({ code: -32602, message: 'bad range' });
    expect(failed).not.toHaveProperty('result');
  });

  it('answers a tool that cannot be a task directly', async () => {
    const result = await call('forbidden_task', {});
    expect(result['resultType']).toBeUndefined();
    expect(result['content']).toEqual([{ type: 'text', text: 'forbidden_task done' }]);
  });

  it('cancels with an ack, idempotently on a terminal task; tasks/result is not part of it', async () => {
    const created = await call('sleepy', { ms: 60_000 });
    const taskId = String(created['taskId']);
    expect(await client.request({ method: 'tasks/cancel', params: { taskId, _meta: extMeta } }, Loose)).toEqual({
      resultType: 'complete',
    });
    await until(taskId, 'cancelled');
    expect(await client.request({ method: 'tasks/cancel', params: { taskId, _meta: extMeta } }, Loose)).toEqual({
      resultType: 'complete',
    });
    const noResult = await rpcError(
      client.request({ method: 'tasks/result', params: { taskId, _meta: extMeta } }, Loose),
    );
    expect(noResult.code).toBe(-32601);
    // An unknown task is still -32602, whatever the rendering.
    expect((await rpcError(extGet('0'.repeat(32)))).code).toBe(-32602);
  });

  it('answers -32021 naming the extension to tasks/update without it', async () => {
    const error = await rpcError(
      client.request({ method: 'tasks/update', params: { taskId: 'x', inputResponses: {} } }, Loose),
    );
    expect(error.code).toBe(-32021);
    expect(error.data).toEqual({ requiredCapabilities: { extensions: { [EXT]: {} } } });
  });

  it('lists the input request inline and takes its answer by tasks/update; a bad answer is refused, a second one changes nothing', async () => {
    const created = await call('wait_for_approval', { question: 'Ship it?' });
    const taskId = String(created['taskId']);
    const waiting = await until(taskId, 'input_required');
    expect(waiting['inputRequests']).toMatchObject({
      '1': { method: 'elicitation/create', params: { message: 'Ship it?' } },
    });

    const bad = await rpcError(extUpdate(taskId, { '1': { action: 'accept', content: { approved: 'yes' } } }));
    expect(bad.code).toBe(-32602);
    expect(bad.message).toMatch(/approved/);
    expect((await extGet(taskId))['status']).toBe('input_required');

    expect(await extUpdate(taskId, { '1': { action: 'accept', content: { approved: true } } })).toEqual({
      resultType: 'complete',
    });
    const done = await until(taskId, 'completed');
    expect(done['result']).toMatchObject({ structuredContent: { approved: true } });
    // A second answer is acked (the update is eventually consistent) and changes nothing.
    expect(await extUpdate(taskId, { '1': { action: 'decline' } })).toEqual({ resultType: 'complete' });
    expect((await extGet(taskId))['result']).toMatchObject({ structuredContent: { approved: true } });
  });
});

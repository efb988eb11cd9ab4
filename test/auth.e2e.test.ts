/**
 * docs/CONFIGURATION.md, docs/HTTP.md, docs/MCP.md: with TASKRELAY_AUTH_TOKENS set, every /mcp request needs a bearer token and tasks belong to the
 * principal, never the session (the MCP tasks specification, security considerations).
 */
import { describe, expect, it } from 'vitest';
import { CallToolResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { useStack } from './helpers/stack.js';
import { connectClient } from './helpers/processes.js';
import { startTask } from './helpers/tasks.js';

const stack = useStack({ name: 'auth', gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token' }] });
const alice = { authorization: 'Bearer alice-token' };
const bob = { authorization: 'Bearer bob-token' };

/** A client of its own for `headers`' principal, and one build_report task it started. */
async function clientWithTask(headers: Record<string, string>) {
  const client = await connectClient(stack.gateway.url, headers);
  const taskId = await startTask(client, 'build_report', { report: 'r', items: 2, delayMs: 1 });
  return { client, taskId };
}

describe('authentication and task ownership', () => {
  it('answers 401 with WWW-Authenticate without a valid bearer token, but keeps probes open', async () => {
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' });
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const missing = await fetch(stack.gateway.url, { method: 'POST', headers, body });
    expect(missing.status).toBe(401);
    expect(missing.headers.get('www-authenticate')).toMatch(/^Bearer/);
    const wrong = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: { ...headers, authorization: 'Bearer nope' },
      body,
    });
    expect(wrong.status).toBe(401);
    expect((await fetch(stack.gateway.url.replace(/\/mcp$/, '/readyz'))).status).toBe(200);
  });

  it('offers tasks/list and lists only the caller’s own tasks', async () => {
    const a = await clientWithTask(alice);
    const b = await clientWithTask(bob);
    expect(a.client.getServerCapabilities()?.tasks?.list).toEqual({});
    const listed = (await a.client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
    expect(listed).toContain(a.taskId);
    expect(listed).not.toContain(b.taskId);
    await a.client.close();
    await b.client.close();
  });

  it('lets the same principal reach its task from a new session, and tells another principal it does not exist', async () => {
    const { client, taskId } = await clientWithTask(alice);
    await client.close();
    const again = await connectClient(stack.gateway.url, alice);
    const result = await again.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ report: 'r', items: 2 });
    const mallory = await connectClient(stack.gateway.url, bob);
    // Settled as they are made: all three are in flight at once, and any may fail first.
    const attempts = [
      mallory.experimental.tasks.getTask(taskId),
      mallory.experimental.tasks.getTaskResult(taskId, CallToolResultSchema),
      mallory.experimental.tasks.cancelTask(taskId),
    ].map((attempt) =>
      attempt.then(
        () => undefined,
        (e: unknown) => e,
      ),
    );
    for (const attempt of attempts) {
      const error = await attempt;
      expect(error).toBeInstanceOf(McpError);
      expect((error as McpError).code).toBe(-32602);
    }
    await again.close();
    await mallory.close();
  });

  it('does not let another principal use a session it did not open', async () => {
    const a = await connectClient(stack.gateway.url, alice);
    const sessionId = (a.transport as unknown as { sessionId?: string }).sessionId ?? '';
    const res = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-session-id': sessionId,
        ...bob,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }),
    });
    expect(res.status).toBe(404);
    await a.close();
  });
});

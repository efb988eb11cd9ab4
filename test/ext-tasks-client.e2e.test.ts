/**
 * Issue 8: a client nobody here wrote — `@modelcontextprotocol/ext-tasks` 0.2.2 on the v2 SDK client
 * (`@modelcontextprotocol/client` 2.4) — runs, reads and cancels taskrelay tasks on a 2025-11-25 session.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { startGatewayProcess, startWorkerProcess, stopAll, type GatewayProcess } from './helpers/processes.js';

let redis: TestRedis;
let gateway: GatewayProcess;
let client: Client;
let session: ReturnType<typeof createTaskSessionFromClient>;

beforeAll(async () => {
  redis = await startRedis();
  const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('ext-client') };
  gateway = await startGatewayProcess(env);
  await startWorkerProcess(env);
  client = new Client({ name: 'ext-tasks-test', version: '0' }, { capabilities: {} });
  await client.connect(new StreamableHTTPClientTransport(new URL(gateway.url)));
  session = createTaskSessionFromClient(client, { endpointId: 'taskrelay' });
});

afterAll(async () => {
  await session?.close();
  await client?.close();
  await stopAll();
  await redis?.stop();
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

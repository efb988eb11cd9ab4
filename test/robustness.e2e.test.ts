/**
 * The gateway under bad input and a Redis outage: clear errors, nothing hung, nothing lost that was stored.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema, CreateTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import type { TestRedis } from './helpers/redis.js';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { connectClient, readMetric, type GatewayProcess } from './helpers/processes.js';
import { scaled } from './helpers/load.js';

// Owned: this file stops and restarts it.
const stack = useStack({
  name: 'robust',
  redis: { owned: true },
  gateways: [{ TASKRELAY_SESSION_IDLE_MS: '1000', TASKRELAY_MAX_TTL_MS: '120000', TASKRELAY_DEFAULT_TTL_MS: '60000' }],
  workers: [{ WORKER_HEARTBEAT_MS: '200' }],
});
let redis: TestRedis;
let gateway: GatewayProcess;
const base = () => gateway.url.replace(/\/mcp$/, '');

const metric = (name: string) => readMetric(gateway.url, name);

beforeAll(() => {
  ({ redis, gateway } = stack);
});

describe('task ttl', () => {
  it('grants whole milliseconds between one second and the configured maximum', async () => {
    const client = await connectClient(gateway.url);
    const ttlFor = async (ttl: number) =>
      (
        await client.request(
          {
            method: 'tools/call',
            params: { name: 'build_report', arguments: { report: 't', items: 1, delayMs: 0 }, task: { ttl } },
          },
          CreateTaskResultSchema,
        )
      ).task;
    expect((await ttlFor(1500.6)).ttl).toBe(1501);
    expect((await ttlFor(0)).ttl).toBe(1000);
    expect((await ttlFor(10 * 86_400_000)).ttl).toBe(120_000);
    // A fractional request still completes (the terminal expiry is set in whole ms).
    const task = await ttlFor(2500.5);
    const result = await client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ report: 't', items: 1 });
    await client.close();
  });
});

describe('sessions', () => {
  it('closes a session that went idle without DELETE, and its task stays reachable from a new one', async () => {
    const client = await connectClient(gateway.url);
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'idle', items: 1, delayMs: 0 }, task: {} },
      },
      CreateTaskResultSchema,
    );
    // Drop the GET stream and go quiet, as a vanished client would.
    await (client.transport as unknown as { _abortController?: AbortController })._abortController?.abort();
    await waitFor(async () => (await metric('taskrelay_sessions_active')) === 0, {
      timeoutMs: 15_000,
      message: 'idle session not closed',
    });
    const again = await connectClient(gateway.url);
    const result = await again.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ report: 'idle', items: 1 });
    await again.close();
  });
});

/**
 * The answer to a request made while Redis is down. A hang check, not a timing assertion: the bound is generous (the
 * target is under 3 s), and a request that has not answered by then is a failure whatever it would have said.
 */
async function answerDuringOutage(request: Promise<unknown>): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<'hung'>((resolve) => (timer = setTimeout(() => resolve('hung'), scaled(8_000))));
  try {
    return await Promise.race([
      request.then(
        (value) => ({ answered: value }),
        (error: unknown) => error,
      ),
      hung,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

function expectStoreUnavailable(answer: unknown): void {
  expect(answer).not.toBe('hung');
  expect(answer).toBeInstanceOf(McpError);
  const error = answer as McpError;
  expect(error.code).toBe(-32603);
  expect(error.message).toMatch(/^MCP error -32603: Task store unavailable/);
  expect(error.data).toEqual({ code: 'REDIS_UNAVAILABLE' });
}

describe('Redis outage', () => {
  it('answers readiness 503 and calls with a JSON-RPC error while Redis is down, and recovers after', async () => {
    const client = await connectClient(gateway.url);
    const start = (arguments_: Record<string, unknown>) =>
      client.request(
        { method: 'tools/call', params: { name: 'build_report', arguments: arguments_, task: {} } },
        CreateTaskResultSchema,
      );
    // One task still running when Redis goes (its tasks/get needs the store), one that has just ended here.
    const running = await start({ report: 'before', items: 1_000, delayMs: 60_000 });
    const ended = await start({ report: 'ended', items: 1, delayMs: 0 });
    await client.experimental.tasks.getTaskResult(ended.task.taskId, CallToolResultSchema);
    await redis.kill();
    // §6.7: the gateway answers a task that ended here a moment ago from its terminal event, store or no store.
    expect(await client.experimental.tasks.getTask(ended.task.taskId)).toMatchObject({ status: 'completed' });
    await waitFor(async () => (await fetch(`${base()}/readyz`)).status === 503, { message: 'readyz stayed 200' });
    expect((await fetch(`${base()}/healthz`)).status).toBe(200);
    const options = { timeout: 20_000 };
    // Twice each, while the connection's reconnect backoff grows.
    for (let round = 0; round < 2; round++) {
      expectStoreUnavailable(
        await answerDuringOutage(
          client.callTool(
            { name: 'build_report', arguments: { report: 'down', items: 1 } },
            CallToolResultSchema,
            options,
          ),
        ),
      );
      expectStoreUnavailable(
        await answerDuringOutage(
          client.request(
            {
              method: 'tools/call',
              params: { name: 'build_report', arguments: { report: 'down', items: 1 }, task: {} },
            },
            CreateTaskResultSchema,
            options,
          ),
        ),
      );
      expectStoreUnavailable(await answerDuringOutage(client.experimental.tasks.getTask(running.task.taskId, options)));
    }

    await redis.restart();
    await waitFor(async () => (await fetch(`${base()}/readyz`)).status === 200, { message: 'readyz stayed 503' });
    // The restarted Redis kept nothing: the worker's next heartbeat republishes its catalog.
    const result = await waitFor(
      async () =>
        client.callTool(
          { name: 'build_report', arguments: { report: 'back', items: 1, delayMs: 0 } },
          CallToolResultSchema,
        ),
      { timeoutMs: 20_000, message: 'calls did not recover' },
    );
    expect(result.structuredContent).toEqual({ report: 'back', items: 1 });
    await client.close();
  });
});

/**
 * Issue 9, PROTOCOL.md §11: a gateway told to stop (SIGTERM) loses nothing and leaves nothing stuck. Plain calls in
 * flight finish within the grace period or end with their own reason (GATEWAY_SHUTDOWN, never a client cancel);
 * tasks go on and stay reachable from another gateway; the process exits 0.
 */
import { request as httpRequest, Agent } from 'node:http';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import { CallToolResultSchema, CreateTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { TaskStore, createKeys } from '@taskrelay/shared';
import { waitFor } from './helpers/wait-for.js';
import {
  FIXTURE_TOOLS,
  ROOT,
  connectClient,
  readMetric,
  startGatewayProcess,
  type GatewayProcess,
  type ManagedProcess,
} from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { RawSession } from './helpers/raw-mcp.js';

const stack = useStack({
  name: 'drain',
  gateways: [],
  workers: [
    // No periodic sweep: a worker learns of these cancels only from the gateway's message, which carries its reason.
    { TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_CANCEL_SWEEP_MS: '600000' },
    { TASKRELAY_TOOLS: `${ROOT}/test/fixtures/gated-tools.mjs`, TASKRELAY_QUEUE: 'gated' },
  ],
});
let r: Redis;
let prefix: string;
let env: Record<string, string | undefined>;
let worker: ManagedProcess;
let gatedWorker: ManagedProcess;

beforeAll(() => {
  ({ r, prefix, env } = stack);
  [worker, gatedWorker] = stack.workers as [ManagedProcess, ManagedProcess];
});

const store = () => new TaskStore(r, createKeys(prefix));
const startGateway = (graceMs: number) => startGatewayProcess({ ...env, GATEWAY_SHUTDOWN_GRACE_MS: String(graceMs) });

/** The plain calls' task ids, in order (clients never see them; the gateway logs them). */
const callTaskIds = (gateway: GatewayProcess) =>
  gateway
    .logs()
    .filter((l) => l['msg'] === 'task created' && l['mode'] === 'call')
    .map((l) => String(l['taskId']));

const toolStarted = (taskId: string) =>
  [worker, gatedWorker].some((w) => w.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started'));

/** Sends SIGTERM and waits until the gateway is draining; `exited` is its exit code, later. */
async function sigterm(gateway: GatewayProcess): Promise<{ exited: Promise<number | null> }> {
  const exited = gateway.kill('SIGTERM');
  await waitFor(() => gateway.logs().some((l) => l['msg'] === 'draining: accepting no new requests'), {
    message: 'the gateway did not start draining',
  });
  return { exited };
}

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** The request went over a connection opened for an earlier one. */
  reusedSocket: boolean;
}

/** One HTTP/1.1 request through `agent`, so a later request can reuse the connection (keep-alive). */
function send(
  agent: Agent,
  url: string,
  options: { method: string; headers?: Record<string, string>; body?: string },
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: options.method, headers: options.headers, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, reusedSocket: req.reusedSocket }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

describe('§11 gateway drain', () => {
  it('lets a plain call shorter than the grace finish with its result, refuses new requests, then exits 0', async () => {
    const gateway = await startGateway(30_000);
    const client = await connectClient(gateway.url);
    const gate = `${prefix}:gate:short`;
    const call = client.callTool({ name: 'gated', arguments: { gate } }, CallToolResultSchema);

    // Two more plain calls, each on a connection of its own that stays open: after their answers, requests sent on
    // those connections reach the draining gateway (a new connection cannot: the listener is closed).
    const session = await RawSession.open(gateway.url);
    const agents = [new Agent({ keepAlive: true, maxSockets: 1 }), new Agent({ keepAlive: true, maxSockets: 1 })];
    const keptGates = [`${prefix}:gate:kept-0`, `${prefix}:gate:kept-1`];
    const kept = agents.map((agent, i) =>
      send(agent, gateway.url, {
        method: 'POST',
        headers: session.headers(),
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 100 + i,
          method: 'tools/call',
          params: { name: 'gated', arguments: { gate: keptGates[i] } },
        }),
      }),
    );
    await waitFor(() => callTaskIds(gateway).length === 3 && callTaskIds(gateway).every(toolStarted), {
      message: 'the calls did not start',
    });

    const { exited } = await sigterm(gateway);
    // A new connection is refused (or, on one a client still held open, answered 503).
    const fresh = await fetch(gateway.url.replace(/\/mcp$/, '/readyz')).then(
      (res) => res.status,
      () => 'refused',
    );
    expect([503, 'refused']).toContain(fresh);

    await r.rpush(keptGates[0]!, JSON.stringify({ done: true }));
    expect((await kept[0]!).body).toContain(`gate ${keptGates[0]} done`);
    const ready = await send(agents[0]!, gateway.url.replace(/\/mcp$/, '/readyz'), { method: 'GET' });
    expect(ready.reusedSocket).toBe(true);
    expect(ready.status).toBe(503);
    expect(ready.headers['connection']).toBe('close');

    await r.rpush(keptGates[1]!, JSON.stringify({ done: true }));
    expect((await kept[1]!).body).toContain(`gate ${keptGates[1]} done`);
    const refused = await send(agents[1]!, gateway.url, {
      method: 'POST',
      headers: session.headers(),
      body: JSON.stringify({ jsonrpc: '2.0', id: 200, method: 'tools/list' }),
    });
    expect(refused.reusedSocket).toBe(true);
    expect(refused.status).toBe(503);
    expect(refused.headers['connection']).toBe('close');
    expect(JSON.parse(refused.body)).toMatchObject({ error: { message: 'Gateway is shutting down' } });

    // The first call was running all along; it still gets its own result.
    await r.rpush(gate, JSON.stringify({ done: true }));
    const result = await call;
    expect(result.isError).toBeFalsy();
    expect(result.content).toEqual([{ type: 'text', text: `gate ${gate} done` }]);
    expect(await exited).toBe(0);
    for (const taskId of callTaskIds(gateway)) expect((await store().records.get(taskId))?.status).toBe('completed');
    for (const agent of agents) agent.destroy();
  });

  it('ends a plain call longer than the grace with GATEWAY_SHUTDOWN, not as a client cancel', async () => {
    const gateway = await startGateway(500);
    const client = await connectClient(gateway.url);
    let progressed = false;
    const call = client
      .callTool({ name: 'sleepy', arguments: { ms: 120_000, stepMs: 50 } }, CallToolResultSchema, {
        timeout: 180_000,
        onprogress: () => {
          progressed = true;
        },
      })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    await waitFor(() => progressed, { message: 'the call did not start' });
    const [taskId] = callTaskIds(gateway);

    const { exited } = await sigterm(gateway);
    const error = await call;
    expect(error).toBeInstanceOf(McpError);
    expect((error as McpError).message).toMatch(/Gateway shut down before the call finished/);
    expect((error as McpError).data).toEqual({ code: 'GATEWAY_SHUTDOWN' });
    expect(await exited).toBe(0);

    const task = await store().records.get(taskId!);
    expect(task).toMatchObject({
      status: 'cancelled',
      cancelReason: 'GATEWAY_SHUTDOWN',
      statusMessage: 'Gateway shutting down',
    });
    const cancels = gateway.logs().filter((l) => l['taskId'] === taskId && l['msg'] === 'task cancelled');
    expect(cancels).toEqual([expect.objectContaining({ reason: 'GATEWAY_SHUTDOWN', trigger: 'gateway-shutdown' })]);
    // The worker aborted the tool for the gateway's reason, and was never told the client cancelled.
    await waitFor(() =>
      worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'cancel received; aborting tool'),
    );
    const reasons = worker.logs().filter((l) => l['taskId'] === taskId && l['reason'] !== undefined);
    expect(reasons.map((l) => l['reason'])).toContain('GATEWAY_SHUTDOWN');
    expect(reasons.map((l) => l['reason'])).not.toContain('CLIENT_CANCELLED');
  });

  it('keeps a task running through the drain; another gateway reads it and its result', async () => {
    const draining = await startGateway(30_000);
    const other = await startGateway(30_000);
    const client = await connectClient(draining.url);
    const gate = `${prefix}:gate:task`;
    const created = await client.request(
      { method: 'tools/call', params: { name: 'gated', arguments: { gate }, task: { ttl: 60_000 } } },
      CreateTaskResultSchema,
    );
    const { taskId } = created.task;
    await waitFor(() => toolStarted(taskId), { message: 'the task did not start' });
    // A client blocked on the result is told to ask again, at once: the drain does not wait for tasks.
    const waiting = client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema).then(
      () => undefined,
      (error: unknown) => error,
    );
    await waitFor(async () => (await readMetric(draining.url, 'taskrelay_requests_in_flight')) === 1, {
      message: 'tasks/result did not reach the gateway',
    });

    const { exited } = await sigterm(draining);
    const error = await waiting;
    expect(error).toBeInstanceOf(McpError);
    expect((error as McpError).message).toMatch(/Gateway is shutting down; the task goes on/);
    expect(await exited).toBe(0);

    const again = await connectClient(other.url);
    expect((await again.experimental.tasks.getTask(taskId)).status).toBe('working');
    await r.rpush(gate, JSON.stringify({ done: true }));
    const result = await again.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.content).toEqual([{ type: 'text', text: `gate ${gate} done` }]);
    expect((await again.experimental.tasks.getTask(taskId)).status).toBe('completed');
    expect((await store().records.get(taskId))?.cancelReason).toBeUndefined();
    await again.close();
  });
});

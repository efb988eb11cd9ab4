/**
 * Issue 7, PROTOCOL.md §12 and §13: tools that talk back, across real processes. A tool asks its caller (elicitation)
 * or the caller's model (sampling) mid-task and goes on with the answer, through a worker SIGKILLed while it waits;
 * bad and duplicate answers change nothing; tool log messages reach exactly their caller, filtered by its level.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { Queue } from 'bullmq';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CancelledNotificationSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  GetTaskResultSchema,
  LoggingMessageNotificationSchema,
  type CallToolResult,
  type ClientCapabilities,
  type CreateMessageRequest,
  type CreateMessageResult,
  type ElicitRequest,
  type ElicitResult,
  type LoggingMessageNotification,
} from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { createKeys, TaskStore } from '@taskrelay/shared';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, connectClient, type GatewayProcess, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask } from './helpers/tasks.js';
import { absenceWindow } from './helpers/load.js';

const TALK_TOOLS = `${ROOT}/test/fixtures/talk-tools.mjs`;
const RELATED = 'io.modelcontextprotocol/related-task';

const stack = useStack({
  name: 'talk',
  env: { WORKER_LOCK_DURATION_MS: '2000' },
  // debug: the suite reads the gateway's note of a late answer to a withdrawn request.
  gateways: [{ LOG_LEVEL: 'debug' }],
  workers: [{}, {}, { TASKRELAY_TOOLS: TALK_TOOLS, TASKRELAY_QUEUE: 'talk' }],
});
let r: Redis;
let store: TaskStore;
let prefix: string;
let gateway: GatewayProcess;
let stockWorkers: ManagedProcess[];

beforeAll(() => {
  ({ r, prefix, gateway } = stack);
  store = new TaskStore(r, createKeys(prefix));
  stockWorkers = stack.workers.slice(0, 2);
});

interface Asked<Req, Res> {
  request: Req;
  signal: AbortSignal;
  answer(result: Res): void;
}

/** A client that declares elicitation and sampling and holds every request it gets until the test answers it. */
async function talkingClient(options: { capabilities?: ClientCapabilities; ignoreCancels?: boolean } = {}) {
  const client = new Client(
    { name: 'talk-test', version: '0.0.0' },
    { capabilities: options.capabilities ?? { elicitation: {}, sampling: {} } },
  );
  const elicitations: Array<Asked<ElicitRequest, ElicitResult>> = [];
  const samplings: Array<Asked<CreateMessageRequest, CreateMessageResult>> = [];
  const logs: LoggingMessageNotification['params'][] = [];
  if (options.capabilities === undefined || options.capabilities.elicitation) {
    client.setRequestHandler(
      ElicitRequestSchema,
      (request, extra) =>
        new Promise<ElicitResult>((answer) => elicitations.push({ request, signal: extra.signal, answer })),
    );
  }
  if (options.capabilities === undefined || options.capabilities.sampling) {
    client.setRequestHandler(
      CreateMessageRequestSchema,
      (request, extra) =>
        new Promise<CreateMessageResult>((answer) => samplings.push({ request, signal: extra.signal, answer })),
    );
  }
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    logs.push(n.params);
  });
  // A client that answers even a request the server withdrew: how a second answer for one request reaches us.
  if (options.ignoreCancels) client.setNotificationHandler(CancelledNotificationSchema, () => undefined);
  await client.connect(new StreamableHTTPClientTransport(new URL(gateway.url)));
  return { client, elicitations, samplings, logs };
}

const taskOf = (asked: { request: { params: { _meta?: Record<string, unknown> } } }) =>
  (asked.request.params._meta?.[RELATED] as { taskId?: string } | undefined)?.taskId;

const status = async (client: Client, taskId: string) =>
  (await client.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema)).status;

const result = (client: Client, taskId: string) =>
  client.request({ method: 'tasks/result', params: { taskId } }, CallToolResultSchema);

const approved = (res: CallToolResult) => (res.structuredContent as { approved?: boolean } | undefined)?.approved;

const gatewayLogged = (msg: string, taskId: string) =>
  gateway.logs().some((l) => l['msg'] === msg && l['taskId'] === taskId);

describe('§12 input requests (elicitation)', () => {
  it('approve: the question reaches the client with the related task, the answer completes the task', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Deploy to production?' });
    const asked = await waitFor(() => elicitations[0], { message: 'no elicitation/create reached the client' });
    expect(asked.request.params.message).toBe('Deploy to production?');
    expect(taskOf(asked)).toBe(taskId);
    expect(await status(client, taskId)).toBe('input_required');
    asked.answer({ action: 'accept', content: { approved: true } });
    const res = await result(client, taskId);
    expect(approved(res)).toBe(true);
    expect(await status(client, taskId)).toBe('completed');
    await client.close();
  });

  it('decline: the task completes with approved false', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Delete the backups?' });
    (await waitFor(() => elicitations[0])).answer({ action: 'decline' });
    const res = await result(client, taskId);
    expect(approved(res)).toBe(false);
    expect(await status(client, taskId)).toBe('completed');
    await client.close();
  });

  it('a client that calls tasks/result while its GET stream holds the request is not asked again (§19)', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Ship it?' });
    const onGet = await waitFor(() => elicitations[0]);
    const waiting = result(client, taskId);
    // The tasks/result stream stands by while the GET stream, open, holds the request.
    await absenceWindow(600);
    expect(elicitations).toHaveLength(1);
    onGet.answer({ action: 'accept', content: { approved: true } });
    expect(approved(await waiting)).toBe(true);
    expect(elicitations).toHaveLength(1);
    await client.close();
  });

  it('a second answer for the same request (sent after the gateway withdrew it) changes nothing', async () => {
    const { client, elicitations } = await talkingClient({ ignoreCancels: true });
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Rotate the keys?' });
    const first = await waitFor(() => elicitations[0]);
    // Answered by another route (the tasks extension's tasks/update): the GET delivery is withdrawn.
    await client.request(
      {
        method: 'tasks/update',
        params: {
          taskId,
          inputResponses: { '1': { action: 'accept', content: { approved: true } } },
          _meta: {
            'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
          },
        },
      },
      z.looseObject({}),
    );
    await waitFor(async () => (await status(client, taskId)) === 'completed', {
      message: 'tasks/update did not resume it',
    });
    // The client ignores the gateway's withdrawal and answers the GET request all the same.
    first.answer({ action: 'decline' });
    const dropped = () =>
      gateway
        .logs()
        .some((l) => l['msg'] === 'mcp server error' && JSON.stringify(l['err']).includes('unknown message ID'));
    await waitFor(dropped, { message: 'the second answer did not reach the gateway' });
    expect(approved(await result(client, taskId))).toBe(true);
    const record = await store.records.get(taskId);
    expect(record?.status).toBe('completed');
    expect(record?.inputResponses).toEqual({ '1': { action: 'accept', content: { approved: true } } });
    await client.close();
  });

  it('an answer that does not match the schema leaves the task waiting, asks again, and a good answer completes it', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Merge the branch?' });
    (await waitFor(() => elicitations[0])).answer({ action: 'accept', content: { approved: 'yes' } });
    const again = await waitFor(() => elicitations[1], { message: 'the request was not sent again' });
    expect(again.request.params).toEqual(elicitations[0]?.request.params);
    // The log line travels on the gateway's stdout, not with the request: it may be read a moment later.
    await waitFor(() => gatewayLogged('bad answer to an input request; asking again', taskId));
    expect(await status(client, taskId)).toBe('input_required');
    expect((await store.records.get(taskId))?.inputResponses).toBeUndefined();
    again.answer({ action: 'accept', content: { approved: true } });
    expect(approved(await result(client, taskId))).toBe(true);
    await client.close();
  });

  it('cancel while waiting ends the task cancelled, withdraws the request and runs nothing more', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Wait forever?' });
    const asked = await waitFor(() => elicitations[0]);
    const cancelled = await client.request({ method: 'tasks/cancel', params: { taskId } }, GetTaskResultSchema);
    expect(cancelled.status).toBe('cancelled');
    await waitFor(() => asked.signal.aborted, { message: 'the pending request was not withdrawn' });
    const keys = createKeys(prefix);
    const connection = new Redis(stack.redis.url, { maxRetriesPerRequest: null });
    // The task's own pool queue (workers' queues carry a digest of their tool names, PROTOCOL.md §3.2).
    const pool = (await connection.hget(keys.task(taskId), 'queue')) ?? '';
    const queue = new Queue(keys.queueName(pool), { connection, prefix: keys.bullPrefix });
    try {
      await waitFor(async () => (await queue.getJob(taskId)) === undefined, {
        message: 'the suspended job is still there',
      });
    } finally {
      await queue.close();
      connection.disconnect();
    }
    expect(await status(client, taskId)).toBe('cancelled');
    await client.close();
  });

  it('an answer after the worker that asked was SIGKILLed resumes the task on another worker', async () => {
    const { client, elicitations } = await talkingClient();
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Survive a crash?' });
    const asked = await waitFor(() => elicitations[0]);
    // The task waits with its job parked (delayed), owned by no worker: then the worker that asked dies.
    const parkedBy = (w: ManagedProcess) =>
      w.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'run suspended until the input request is answered');
    const asker = await waitFor(() => stockWorkers.find(parkedBy), { message: 'no worker parked the job' });
    await asker.kill('SIGKILL');
    const other = stockWorkers.find((w) => w !== asker);
    asked.answer({ action: 'accept', content: { approved: true } });
    expect(approved(await result(client, taskId))).toBe(true);
    // Its stdout may trail the result it wrote: wait for the line.
    await waitFor(() => other?.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'task completed'), {
      message: 'the other worker did not complete the task',
    });
    // Keep two stock workers for the tests after this one.
    stockWorkers = [other!, await stack.addWorker()];
    await client.close();
  });

  it('two tasks waiting at once in one session each get their own request, and each answer reaches its own task', async () => {
    const { client, elicitations } = await talkingClient();
    const yes = await startTask(client, 'wait_for_approval', { question: 'First?' });
    const no = await startTask(client, 'wait_for_approval', { question: 'Second?' });
    await waitFor(() => elicitations.length >= 2);
    expect(elicitations).toHaveLength(2);
    for (const asked of elicitations) {
      const mine = taskOf(asked) === yes;
      expect(asked.request.params.message).toBe(mine ? 'First?' : 'Second?');
      asked.answer(
        mine ? { action: 'accept', content: { approved: true } } : { action: 'accept', content: { approved: false } },
      );
    }
    const [a, b] = await Promise.all([result(client, yes), result(client, no)]);
    expect(approved(a)).toBe(true);
    expect(approved(b)).toBe(false);
    await client.close();
  });

  it('a plain (non-task) call that elicits gets the question on its own request stream and returns the answer', async () => {
    const { client, elicitations } = await talkingClient();
    const call = client.callTool({ name: 'ask_name', arguments: {} });
    const asked = await waitFor(() => elicitations[0]);
    expect(asked.request.params.message).toBe('What is your name?');
    // A plain call's task is internal: the question names no task.
    expect(asked.request.params._meta?.[RELATED]).toBeUndefined();
    asked.answer({ action: 'accept', content: { name: 'Ada' } });
    const res = (await call) as CallToolResult;
    expect(res.content).toEqual([{ type: 'text', text: 'Hello, Ada' }]);
    // The step before the question ran in the first run only; the resumed run replayed its stored value.
    expect(res.structuredContent).toMatchObject({ stepRanInRun: 1 });
    await client.close();
  });

  it('a client without the elicitation capability gets a clear failure from ctx.elicit', async () => {
    const client = await connectClient(gateway.url);
    const taskId = await startTask(client, 'wait_for_approval', { question: 'Can you hear me?' });
    const res = await result(client, taskId);
    expect(res.isError).toBe(true);
    expect(JSON.stringify(res.content)).toContain('did not declare the elicitation capability');
    expect(await status(client, taskId)).toBe('failed');
    await client.close();
  });
});

describe('§12 input requests (sampling)', () => {
  it('sampling round trip: the model answer reaches the tool', async () => {
    const { client, samplings } = await talkingClient();
    const taskId = await startTask(client, 'ask_model', { prompt: 'Say hi' });
    const asked = await waitFor(() => samplings[0], { message: 'no sampling/createMessage reached the client' });
    expect(taskOf(asked)).toBe(taskId);
    expect(asked.request.params.messages[0]?.content).toEqual({ type: 'text', text: 'Say hi' });
    asked.answer({ role: 'assistant', content: { type: 'text', text: 'hi!' }, model: 'test-model' });
    const res = await result(client, taskId);
    expect(res.content).toEqual([{ type: 'text', text: 'Model test-model said: hi!' }]);
    await client.close();
  });
});

describe('§13 tool log messages', () => {
  const levelsOf = (logs: LoggingMessageNotification['params'][], tag: string) =>
    logs.filter((l) => (l.data as { tag?: string }).tag === tag).map((l) => l.level);

  it('a plain call gets its log messages on its request stream, info and above by default', async () => {
    const { client, logs } = await talkingClient();
    const other = await talkingClient();
    await client.callTool({ name: 'chatty', arguments: { tag: 'plain' } });
    await waitFor(() => levelsOf(logs, 'plain').length >= 7);
    expect(levelsOf(logs, 'plain')).toEqual(['info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']);
    expect(logs.find((l) => (l.data as { tag?: string }).tag === 'plain')).toMatchObject({ logger: 'chatty' });
    expect(other.logs).toHaveLength(0);
    await Promise.all([client.close(), other.client.close()]);
  });

  it('logging/setLevel filters what the session receives', async () => {
    const { client, logs } = await talkingClient();
    await client.setLoggingLevel('debug');
    await client.callTool({ name: 'chatty', arguments: { tag: 'all' } });
    await waitFor(() => levelsOf(logs, 'all').length >= 8);
    await client.setLoggingLevel('error');
    await client.callTool({ name: 'chatty', arguments: { tag: 'some' } });
    await waitFor(() => levelsOf(logs, 'some').length >= 4);
    expect(levelsOf(logs, 'all')).toHaveLength(8);
    expect(levelsOf(logs, 'some')).toEqual(['error', 'critical', 'alert', 'emergency']);
    await client.close();
  });

  it('a task gets its log messages with the related-task _meta, and another session gets none', async () => {
    const { client, logs } = await talkingClient();
    const other = await talkingClient();
    await other.client.setLoggingLevel('debug');
    const taskId = await startTask(client, 'chatty', { tag: 'task' });
    await result(client, taskId);
    await waitFor(() => levelsOf(logs, 'task').length >= 7);
    for (const log of logs) expect(log._meta?.[RELATED]).toEqual({ taskId });
    expect(other.logs).toHaveLength(0);
    await Promise.all([client.close(), other.client.close()]);
  });
});

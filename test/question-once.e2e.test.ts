/**
 * Issue 19 item 6, PROTOCOL.md §19: each question reaches a client once. Within a 2025-11-25 session an input
 * request is in flight on one stream at a time: a `tasks/result` opened while the GET stream holds it stands by; the
 * question moves only when the stream that carried it closed before an answer; a `Last-Event-ID` resume of that stream
 * replays it (the same delivery); once answered it goes nowhere again. Across real processes (gateway, worker, Redis).
 */
import { describe, expect, it } from 'vitest';
import { ElicitRequestSchema, type ElicitRequest } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { readSse, type SseEvent } from './helpers/raw-mcp.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { absenceWindow } from './helpers/load.js';

const RELATED = 'io.modelcontextprotocol/related-task';
const RUNS = 20;

const stack = useStack({ name: 'once', workers: [{}, {}] });

const taskOf = (request: ElicitRequest) =>
  (request.params._meta?.[RELATED] as { taskId?: string } | undefined)?.taskId ?? '?';

describe('§19 a question reaches an SDK client once', () => {
  it(`answered at once on the GET stream while a tasks/result is open early: one elicitation/create per task (${RUNS} runs)`, async () => {
    const asked = new Map<string, number>();
    const client = await stack.client({}, undefined, {
      capabilities: { elicitation: {}, tasks: { list: {}, cancel: {}, requests: {} } },
      before(c) {
        c.setRequestHandler(ElicitRequestSchema, (request) => {
          const taskId = taskOf(request);
          asked.set(taskId, (asked.get(taskId) ?? 0) + 1);
          return Promise.resolve({ action: 'accept', content: { approved: true } });
        });
      },
    });
    const taskIds: string[] = [];
    for (let i = 0; i < RUNS; i += 1) {
      const taskId = await startTask(client, 'wait_for_approval', { question: `Once ${i}?` });
      taskIds.push(taskId);
      // tasks/result opened before the answer is stored, at a few moments around the question going out on GET.
      await new Promise((r) => setTimeout(r, (i % 5) * 4));
      const res = await taskResult(client, taskId);
      expect(res.structuredContent).toEqual({ approved: true });
    }
    // A second delivery could still be on its way when tasks/result answered: give it time to arrive.
    await absenceWindow(300);
    const counts = taskIds.map((id) => asked.get(id) ?? 0);
    // What the gateway said of a task asked twice tells which path sent it again.
    const twice = taskIds.filter((id) => (asked.get(id) ?? 0) > 1);
    const told = stack.gateway
      .logs()
      .filter((l) => twice.includes(String(l['taskId'])))
      .map((l) => `${String(l['msg'])} ${JSON.stringify({ from: l['from'], to: l['to'], err: l['err'] })}`);
    expect(counts, `elicitation/create per task: ${counts.join(' ')}; gateway: ${told.join(' | ')}`).toEqual(
      taskIds.map(() => 1),
    );
    expect([...asked.keys()].sort()).toEqual([...taskIds].sort());
    await client.close();
  });
});

/** A raw 2025-11-25 session with the elicitation capability, reading every stream it opens. */
class RawClient {
  private nextId = 1;
  private constructor(
    private readonly url: string,
    readonly sessionId: string,
  ) {}

  static async open(url: string): Promise<RawClient> {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: {
          protocolVersion: '2025-11-25',
          capabilities: { elicitation: {} },
          clientInfo: { name: 'raw-once', version: '0' },
        },
      }),
    });
    const sessionId = res.headers.get('mcp-session-id');
    if (!sessionId) throw new Error(`initialize failed: ${res.status}`);
    await res.text();
    const client = new RawClient(url, sessionId);
    await (await client.send({ jsonrpc: '2.0', method: 'notifications/initialized' })).text();
    return client;
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': this.sessionId,
      'mcp-protocol-version': '2025-11-25',
      ...extra,
    };
  }

  send(body: unknown, signal?: AbortSignal): Promise<Response> {
    return fetch(this.url, {
      method: 'POST',
      headers: this.headers(),
      body: JSON.stringify(body),
      signal: signal ?? null,
    });
  }

  async call(method: string, params: unknown): Promise<Record<string, any>> {
    const id = this.nextId++;
    const res = await this.send({ jsonrpc: '2.0', id, method, params });
    if ((res.headers.get('content-type') ?? '').includes('application/json')) return (await res.json()) as never;
    for await (const event of readSse(res)) if ((event.data as { id?: unknown }).id === id) return event.data as never;
    throw new Error(`no response to ${method}`);
  }

  /** A POST request whose response stream is read into `events` until it ends or `close()` drops it. */
  stream(method: string, params: unknown): Stream {
    const id = this.nextId++;
    return this.read((signal) => this.send({ jsonrpc: '2.0', id, method, params }, signal));
  }

  /** The GET stream, new or resumed after `lastEventId`. */
  get(lastEventId?: string): Stream {
    const headers = this.headers({
      accept: 'text/event-stream',
      ...(lastEventId === undefined ? {} : { 'last-event-id': lastEventId }),
    });
    return this.read((signal) => fetch(this.url, { method: 'GET', headers, signal }));
  }

  private read(open: (signal: AbortSignal) => Promise<Response>): Stream {
    const controller = new AbortController();
    const events: SseEvent[] = [];
    const done = (async () => {
      try {
        const res = await open(controller.signal);
        if (res.status !== 200) throw new Error(`stream answered ${res.status}: ${await res.text()}`);
        if ((res.headers.get('content-type') ?? '').includes('application/json')) {
          events.push({ data: await res.json() });
          return;
        }
        for await (const event of readSse(res, { priming: true })) events.push(event);
      } catch (error) {
        if (!controller.signal.aborted) throw error;
      }
    })();
    done.catch(() => undefined);
    return { events, close: () => controller.abort(), done };
  }

  /** Answers the server's request `id` (a JSON-RPC response, POSTed). */
  async answer(id: unknown, result: unknown): Promise<number> {
    const res = await this.send({ jsonrpc: '2.0', id, result });
    await res.text();
    return res.status;
  }

  async close(): Promise<void> {
    const res = await fetch(this.url, { method: 'DELETE', headers: this.headers() });
    await res.body?.cancel();
  }
}

interface Stream {
  events: SseEvent[];
  close: () => void;
  done: Promise<void>;
}

type Message = { id?: unknown; method?: string; params?: Record<string, any>; result?: Record<string, any> };

const messages = (stream: Stream) => stream.events.map((e) => (e.data ?? {}) as Message);
const questions = (stream: Stream) => messages(stream).filter((m) => m.method === 'elicitation/create');
const cancelled = (stream: Stream) =>
  messages(stream)
    .filter((m) => m.method === 'notifications/cancelled')
    .map((m) => m.params?.['requestId']);
const responseOf = (stream: Stream) => messages(stream).find((m) => m.result !== undefined);
const yes = { action: 'accept', content: { approved: true } };

async function startApproval(client: RawClient, question: string): Promise<string> {
  const created = await client.call('tools/call', {
    name: 'wait_for_approval',
    arguments: { question },
    task: { ttl: 60_000 },
  });
  const taskId = created['result']?.['task']?.['taskId'] as string | undefined;
  if (!taskId) throw new Error(`no task: ${JSON.stringify(created)}`);
  return taskId;
}

describe('§19 a question in flight on one stream of a session', () => {
  it('a tasks/result opened while the open GET stream holds the question is not asked; the answer on GET ends both', async () => {
    const client = await RawClient.open(stack.gateway.url);
    const get = client.get();
    const taskId = await startApproval(client, 'GET first?');
    const [asked] = await waitFor(() => (questions(get).length > 0 ? questions(get) : undefined), {
      message: 'the question never reached the GET stream',
    });
    const result = client.stream('tasks/result', { taskId });
    // The tasks/result has registered with the router once it is an SSE stream (after its first 100 ms).
    await absenceWindow(600);
    expect(questions(result)).toEqual([]);
    expect(await client.answer(asked?.id, yes)).toBe(202);
    await waitFor(() => responseOf(result), { message: 'tasks/result did not answer' });
    expect(responseOf(result)?.result?.['structuredContent']).toEqual({ approved: true });
    expect(questions(result)).toEqual([]);
    expect(questions(get)).toHaveLength(1);
    get.close();
    await client.close();
  });

  it('the GET stream closing unanswered moves the question to the open tasks/result, once; its answer completes the task', async () => {
    const client = await RawClient.open(stack.gateway.url);
    const get = client.get();
    const taskId = await startApproval(client, 'Move me?');
    const [onGet] = await waitFor(() => (questions(get).length > 0 ? questions(get) : undefined));
    const result = client.stream('tasks/result', { taskId });
    await absenceWindow(600);
    expect(questions(result)).toEqual([]);
    get.close();
    const [moved] = await waitFor(() => (questions(result).length > 0 ? questions(result) : undefined), {
      message: 'the question did not move to the tasks/result stream',
    });
    expect(moved?.id).not.toEqual(onGet?.id);
    expect(moved?.params).toEqual(onGet?.params);
    // The request on the closed GET stream is withdrawn: a resume of that stream would say so after replaying it.
    const resumed = client.get(get.events.at(-1)?.id ?? '');
    await waitFor(() => cancelled(resumed).includes(onGet?.id), { message: 'the GET request was not withdrawn' });
    expect(await client.answer(moved?.id, yes)).toBe(202);
    await waitFor(() => responseOf(result), { message: 'tasks/result did not answer' });
    expect(responseOf(result)?.result?.['structuredContent']).toEqual({ approved: true });
    await absenceWindow(300);
    expect(questions(result)).toHaveLength(1);
    expect(questions(resumed)).toEqual([]);
    resumed.close();
    await client.close();
  });

  it('a Last-Event-ID resume of the stream that carried the question replays it; its answer completes the task, no other stream is asked', async () => {
    const client = await RawClient.open(stack.gateway.url);
    // No GET stream: the question goes out on the tasks/result stream (after its priming event).
    const taskId = await startApproval(client, 'Replay me?');
    const first = client.stream('tasks/result', { taskId });
    const [asked] = await waitFor(() => (questions(first).length > 0 ? questions(first) : undefined), {
      message: 'the question never reached the tasks/result stream',
    });
    // The priming event (an id, no data) comes first.
    expect(first.events[0]?.data).toBeUndefined();
    const priming = first.events[0]?.id;
    expect(priming).toBeDefined();
    // The connection drops before the client answers; it resumes the stream from its priming event.
    first.close();
    await first.done;
    await absenceWindow(200);
    const resumed = client.get(priming);
    const [replayed] = await waitFor(() => (questions(resumed).length > 0 ? questions(resumed) : undefined), {
      message: 'the resume did not replay the question',
    });
    expect(replayed?.id).toEqual(asked?.id);
    expect(cancelled(resumed)).toEqual([]);
    expect(await client.answer(replayed?.id, yes)).toBe(202);
    await waitFor(() => responseOf(resumed), { message: 'the resumed tasks/result stream did not answer' });
    expect(responseOf(resumed)?.result?.['structuredContent']).toEqual({ approved: true });
    // Answered: a tasks/result asked now gets the result, never the question.
    const late = client.stream('tasks/result', { taskId });
    await late.done;
    expect(questions(late)).toEqual([]);
    expect(responseOf(late)?.result?.['structuredContent']).toEqual({ approved: true });
    expect(questions(resumed)).toHaveLength(1);
    resumed.close();
    await client.close();
  });
});

/**
 * PROTOCOL.md §34 (issue 36): task output as resources, on both eras. A client reads a task's output while it runs
 * and is told when it changes (`resources/subscribe` on 2025-11-25, `subscriptions/listen` on 2026-07-28); a large
 * result, a batch child's large result and artifacts come back as `resource_link` content read with
 * `resources/read`, streamed; another principal gets the not-found an unknown resource gets.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Client as ModernClient, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { McpError, ResourceUpdatedNotificationSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { useStack } from './helpers/stack.js';
import { PYTHON, ROOT, connectClient, startPythonWorkerProcess } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { readSse } from './helpers/raw-mcp.js';
import { waitFor } from './helpers/wait-for.js';
// @ts-expect-error: a plain ESM fixture without types
import { bigText } from './fixtures/output-tools.mjs';

const OUTPUT_TOOLS = resolve(ROOT, 'test/fixtures/output-tools.mjs');
const INLINE = 65_536;
const stack = useStack({
  name: 'task-output',
  gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token' }],
  workers: [
    { TASKRELAY_TOOLS: OUTPUT_TOOLS, TASKRELAY_QUEUE: 'output', TASKRELAY_INLINE_RESULT_BYTES: String(INLINE) },
    // Small stored-bytes bounds (§34.4), for bob's tasks only: alice's other tests store megabytes.
    {
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-bounds-tools.mjs'),
      TASKRELAY_QUEUE: 'bounds',
      TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK: '4096',
      TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL: '8192',
    },
  ],
});
const alice = { authorization: 'Bearer alice-token' };
const bob = { authorization: 'Bearer bob-token' };
const gates = mkdtempSync(join(tmpdir(), 'taskrelay-output-'));
let gateCount = 0;
const newGate = () => join(gates, `gate-${++gateCount}`);
const open = (gate: string) => writeFileSync(gate, '');
const outputUri = (taskId: string) => `taskrelay://tasks/${taskId}/output`;
type Json = Record<string, any>;

/** One field of a read's first content item (text or blob). */
const field = (read: { contents: unknown[] }, name: 'text' | 'blob'): unknown =>
  (read.contents[0] as Json | undefined)?.[name];

/** The error a read gets, or undefined when it succeeds. */
async function readError(read: Promise<unknown>): Promise<{ code: number; message: string } | undefined> {
  try {
    await read;
    return undefined;
  } catch (error) {
    if (!(error instanceof McpError)) throw error;
    return { code: error.code, message: error.message };
  }
}

/** A 2026-07-28 POST (sessionless), with the routing headers the era requires. */
function post2026(method: string, params: Json, headers: Record<string, string>, name?: string) {
  const body = {
    jsonrpc: '2.0',
    id: Math.floor(Math.random() * 1e9),
    method,
    params: {
      ...params,
      _meta: {
        'io.modelcontextprotocol/protocolVersion': '2026-07-28',
        'io.modelcontextprotocol/clientCapabilities': { extensions: { 'io.modelcontextprotocol/tasks': {} } },
      },
    },
  };
  return fetch(stack.gateway.url, {
    method: 'POST',
    headers: {
      ...headers,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': '2026-07-28',
      'mcp-method': method,
      ...(name === undefined ? {} : { 'mcp-name': name }),
    },
    body: JSON.stringify(body),
  });
}

describe('§34 task output as resources (2025-11-25, SDK client)', () => {
  it('offers the output and blob templates and declares resource subscriptions', async () => {
    const client = await stack.client(alice);
    expect(client.getServerCapabilities()?.resources).toEqual({ subscribe: true });
    const { resourceTemplates } = await client.listResourceTemplates();
    expect(resourceTemplates.map((t) => t.uriTemplate)).toEqual([
      'taskrelay://tasks/{taskId}/output',
      'taskrelay://tasks/{taskId}/blobs/{blobId}',
    ]);
  });

  it('reads a running task’s output, is told when it changes, and reads the final output after', async () => {
    const client = await stack.client(alice);
    const updates: string[] = [];
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updates.push(n.params.uri));
    const gate = newGate();
    const taskId = await startTask(client, 'stream_output', { gate, lines: 3 });
    const uri = outputUri(taskId);
    await client.subscribeResource({ uri });
    await waitFor(async () => field(await client.readResource({ uri }), 'text') === 'started\n', {
      message: 'the first output line was not readable while the task ran',
    });
    expect((await client.experimental.tasks.getTask(taskId)).status).toBe('working');
    const before = updates.length;
    open(gate);
    await waitFor(() => updates.length > before, { message: 'no notifications/resources/updated after a write' });
    expect(await taskResult(client, taskId)).toMatchObject({ content: [{ type: 'text', text: 'wrote 3 lines' }] });
    const final = await client.readResource({ uri });
    expect(final.contents).toEqual([{ uri, mimeType: 'text/plain; charset=utf-8', text: 'done: 3 lines\n' }]);
    await waitFor(() => updates.at(-1) === uri, { message: 'the last write was not notified' });
    await client.unsubscribeResource({ uri });
  });

  it('returns a result over the inline threshold as a resource_link and streams it back whole', async () => {
    const client = await stack.client(alice);
    const bytes = 3 * 1024 * 1024 + 7;
    const taskId = await startTask(client, 'big_result', { bytes });
    const result = (await taskResult(client, taskId, 60_000)) as CallToolResult;
    expect(result.content).toHaveLength(1);
    const link = result.content[0] as Json;
    expect(link).toMatchObject({ type: 'resource_link', mimeType: 'text/plain; charset=utf-8' });
    expect(link['uri']).toMatch(new RegExp(`^taskrelay://tasks/${taskId}/blobs/`));
    const expected = bigText(bytes) as string;
    expect(link['size']).toBe(Buffer.byteLength(expected));
    const read = await client.readResource({ uri: link['uri'] });
    expect(field(read, 'text')).toBe(expected);
  });

  it('moves a large image block out as bytes, and keeps the small text block inline', async () => {
    const client = await stack.client(alice);
    const taskId = await startTask(client, 'big_result', { bytes: 100_000, kind: 'image' });
    const result = (await taskResult(client, taskId)) as CallToolResult;
    expect(result.content[0]).toEqual({ type: 'text', text: 'an image' });
    const link = result.content[1] as Json;
    expect(link).toMatchObject({ type: 'resource_link', mimeType: 'image/png', size: 100_000 });
    const blob = field(await client.readResource({ uri: link['uri'] }), 'blob') as string;
    const bytes = Buffer.from(blob, 'base64');
    expect(bytes.length).toBe(100_000);
    expect([...bytes.subarray(0, 300)].every((b, i) => b === i % 251)).toBe(true);
  });

  it('attaches artifacts as resource_link items readable by the task’s principal', async () => {
    const client = await stack.client(alice);
    const taskId = await startTask(client, 'make_artifacts', { chunks: 3 });
    const result = (await taskResult(client, taskId)) as CallToolResult;
    const links = result.content.filter((c) => c.type === 'resource_link') as Json[];
    expect(links.map((l) => [l['name'], l['mimeType'], l['size']])).toEqual([
      ['report.csv', 'text/csv', 8],
      ['data.bin', 'application/octet-stream', 3000],
    ]);
    const csv = await client.readResource({ uri: links[0]?.['uri'] });
    expect(csv.contents[0]).toMatchObject({ mimeType: 'text/csv', text: 'a,b\n1,2\n' });
    const bin = Buffer.from(field(await client.readResource({ uri: links[1]?.['uri'] }), 'blob') as string, 'base64');
    expect([bin[0], bin[999], bin[1000], bin[2999]]).toEqual([0, 0, 1, 2]);
  });

  it('keeps a batch child’s result over the inline bound by reference instead of dropping it (§26.1)', async () => {
    const client = await stack.client(alice);
    const taskId = await startTask(client, 'big_batch', { children: 2, bytes: 40_000 });
    const result = (await taskResult(client, taskId, 60_000)) as CallToolResult;
    const outcomes = (result.structuredContent as Json)['outcomes'] as Json[];
    expect(outcomes).toHaveLength(2);
    for (const outcome of outcomes) {
      expect(outcome['resultOmitted']).toBeUndefined();
      const link = outcome['result']['content'][0] as Json;
      expect(link).toMatchObject({ type: 'resource_link' });
      expect(link['uri']).toMatch(new RegExp(`^taskrelay://tasks/${taskId}/blobs/`));
      const read = await client.readResource({ uri: link['uri'] });
      expect(field(read, 'text')).toBe(bigText(40_000));
    }
  });

  it('tells another principal nothing: its reads and subscriptions get the unknown-resource error', async () => {
    const owner = await stack.client(alice);
    const taskId = await startTask(owner, 'make_artifacts', { chunks: 1 });
    const result = (await taskResult(owner, taskId)) as CallToolResult;
    const blob = (result.content.find((c) => c.type === 'resource_link') as Json)['uri'] as string;
    const mallory = await connectClient(stack.gateway.url, bob);
    const unknown = await readError(mallory.readResource({ uri: outputUri('f'.repeat(32)) }));
    expect(unknown).toMatchObject({ code: -32602 });
    expect(unknown?.message).toMatch(/Resource not found/);
    for (const uri of [outputUri(taskId), blob]) {
      expect(await readError(mallory.readResource({ uri }))).toEqual(unknown);
      expect(await readError(mallory.subscribeResource({ uri }))).toMatchObject({ code: -32602 });
    }
    // The owner still reads both.
    expect((await owner.readResource({ uri: blob })).contents).toHaveLength(1);
    await mallory.close();
  });

  it('bounds what one task and one principal store apart, naming the bound (§34.4)', async () => {
    const client = await stack.client(bob);
    await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'bounded_artifacts'), {
      message: 'the bounded worker’s tool was not listed',
    });
    const outcomes = async () => {
      const taskId = await startTask(client, 'bounded_artifacts', { size: 3000 });
      return ((await taskResult(client, taskId)).structuredContent as Json)['outcomes'] as string[];
    };
    // 3000 fits the task's 4096; a second 3000 does not.
    const first = await outcomes();
    expect(first[0]).toBe('stored');
    expect(first[1]).toMatch(/^StoredBytesLimitError: A task may store at most 4096 bytes/);
    // bob holds 3000 of his 8192: one more fits (6000), then the principal's bound refuses a third (9000).
    expect((await outcomes())[0]).toBe('stored');
    expect((await outcomes())[0]).toMatch(/^StoredBytesLimitError: A principal may store at most 8192 bytes/);
  });

  it('lets a task’s output and stored values go when the task goes, if that comes before their own TTL', async () => {
    const client = await stack.client(alice);
    const gate = newGate();
    open(gate);
    const taskId = await startTask(client, 'stream_output', { gate, lines: 1 }, { ttl: 60_000 });
    await taskResult(client, taskId);
    const artifacts = await startTask(client, 'make_artifacts', { chunks: 1 }, { ttl: 60_000 });
    await taskResult(client, artifacts);
    const keys = [
      `${stack.prefix}:output:${taskId}`,
      `${stack.prefix}:blobs:${artifacts}`,
      ...(await stack.r.keys(`${stack.prefix}:blob:${artifacts}:*`)),
    ];
    expect(keys).toHaveLength(4);
    for (const key of keys) {
      const left = await stack.r.pttl(key);
      expect(left).toBeGreaterThan(0);
      expect(left).toBeLessThanOrEqual(60_000);
    }
  });

  it('answers a malformed uri with a JSON-RPC error naming it, not a 5xx', async () => {
    const client = await stack.client(alice);
    const res = await fetch(stack.gateway.url, {
      method: 'POST',
      headers: {
        ...alice,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28',
        'mcp-method': 'resources/read',
      },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'resources/read',
        params: {
          uri: 42,
          _meta: {
            'io.modelcontextprotocol/protocolVersion': '2026-07-28',
            'io.modelcontextprotocol/clientCapabilities': {},
          },
        },
      }),
    });
    expect(res.status).toBeLessThan(500);
    expect(((await res.json()) as Json)['error']).toMatchObject({
      code: -32602,
      message: expect.stringMatching(/uri/),
    });
    expect(client).toBeDefined();
  });
});

describe('§34 task output as resources (2026-07-28, the tasks extension)', () => {
  it('lists the templates to a 2026-07-28 client and reads a blob through it', async () => {
    const modern = new ModernClient(
      { name: 'output-2026', version: '0' },
      { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } },
    );
    await modern.connect(
      new StreamableHTTPClientTransport(new URL(stack.gateway.url), { requestInit: { headers: alice } }),
    );
    try {
      const { resourceTemplates } = await modern.listResourceTemplates();
      expect(resourceTemplates.map((t) => t.name)).toEqual(['task-output', 'task-blob']);
      const owner = await stack.client(alice);
      const taskId = await startTask(owner, 'make_artifacts', { chunks: 2 });
      const result = (await taskResult(owner, taskId)) as CallToolResult;
      const csv = (result.content.find((c) => c.type === 'resource_link') as Json)['uri'] as string;
      const read = await modern.readResource({ uri: csv });
      expect(read.contents[0]).toMatchObject({ uri: csv, text: 'a,b\n1,2\n' });
    } finally {
      await modern.close();
    }
  });

  it('follows a running task’s output with subscriptions/listen and reads it while it runs', async () => {
    const gate = newGate();
    const created = (await (
      await post2026('tools/call', { name: 'stream_output', arguments: { gate, lines: 2 } }, alice, 'stream_output')
    ).json()) as Json;
    expect(created['result']).toMatchObject({ resultType: 'task', status: 'working' });
    const taskId = created['result']['taskId'] as string;
    const uri = outputUri(taskId);
    const controller = new AbortController();
    const listening = await fetch(stack.gateway.url, {
      method: 'POST',
      signal: controller.signal,
      headers: {
        ...alice,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2026-07-28',
        'mcp-method': 'subscriptions/listen',
      },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 'listen-1',
        method: 'subscriptions/listen',
        params: {
          notifications: { resourceSubscriptions: [uri, outputUri('0'.repeat(32))] },
          _meta: {
            'io.modelcontextprotocol/protocolVersion': '2026-07-28',
            'io.modelcontextprotocol/clientCapabilities': {},
          },
        },
      }),
    });
    const frames: Json[] = [];
    const reading = (async () => {
      try {
        for await (const event of readSse(listening)) frames.push(event.data as Json);
      } catch {
        // aborted below
      }
    })();
    await waitFor(() => frames.length > 0, { message: 'no acknowledgement' });
    expect(frames[0]).toMatchObject({
      method: 'notifications/subscriptions/acknowledged',
      params: { notifications: { resourceSubscriptions: [uri] } },
    });
    const read = async () => ((await (await post2026('resources/read', { uri }, alice, uri)).json()) as Json)['result'];
    await waitFor(async () => (await read())?.['contents']?.[0]?.['text'] === 'started\n', {
      message: 'the output was not readable while the task ran',
    });
    expect(await read()).toMatchObject({ resultType: 'complete' });
    open(gate);
    await waitFor(() => frames.some((f) => f['method'] === 'notifications/resources/updated'), {
      message: 'no notifications/resources/updated on the listen stream',
    });
    expect(frames.find((f) => f['method'] === 'notifications/resources/updated')?.['params']).toMatchObject({
      uri,
      _meta: { 'io.modelcontextprotocol/subscriptionId': 'listen-1' },
    });
    await waitFor(async () => (await read())?.['contents']?.[0]?.['text'] === 'done: 2 lines\n', {
      message: 'the final output was not read',
    });
    // Another principal: the same not-found as an unknown resource, and its listen acknowledges nothing.
    const foreign = (await (await post2026('resources/read', { uri }, bob, uri)).json()) as Json;
    expect(foreign['error']).toMatchObject({ code: -32602, message: 'Resource not found', data: { uri } });
    controller.abort();
    await reading;
  });

  it('streams a large result to a 2026-07-28 reader with resultType', async () => {
    const created = (await (
      await post2026('tools/call', { name: 'big_result', arguments: { bytes: 1_000_000 } }, alice, 'big_result')
    ).json()) as Json;
    const taskId = created['result']['taskId'] as string;
    let done: Json | undefined;
    await waitFor(
      async () => {
        done = ((await (await post2026('tasks/get', { taskId }, alice, taskId)).json()) as Json)['result'];
        return done?.['status'] === 'completed';
      },
      { message: 'the task did not complete' },
    );
    const link = done?.['result']['content'][0] as Json;
    expect(link).toMatchObject({ type: 'resource_link', size: Buffer.byteLength(bigText(1_000_000)) });
    const res = await post2026('resources/read', { uri: link['uri'] }, alice, link['uri']);
    expect(res.headers.get('content-type')).toContain('application/json');
    const body = (await res.json()) as Json;
    expect(body['result']['resultType']).toBe('complete');
    expect(body['result']['contents'][0]['text']).toBe(bigText(1_000_000));
  });
});

describe.skipIf(PYTHON === undefined)('§34, §29 task output from a Python worker', () => {
  it('reads a Python tool’s output while it runs, then its large result and artifact by reference', async () => {
    const worker = await startPythonWorkerProcess({
      ...stack.env,
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_output_tools.py'),
      TASKRELAY_QUEUE: 'py-output',
      TASKRELAY_INLINE_RESULT_BYTES: String(INLINE),
    });
    try {
      const client = await stack.client(alice);
      await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'py_stream_output'), {
        message: 'the Python tool was not listed',
      });
      const updates: string[] = [];
      client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updates.push(n.params.uri));
      const gate = newGate();
      const taskId = await startTask(client, 'py_stream_output', { gate, bytes: 200_000 });
      const uri = outputUri(taskId);
      await client.subscribeResource({ uri });
      await waitFor(async () => field(await client.readResource({ uri }), 'text') === 'py started\n', {
        message: 'the Python output was not readable while the task ran',
      });
      open(gate);
      const result = (await taskResult(client, taskId, 30_000)) as CallToolResult;
      expect(field(await client.readResource({ uri }), 'text')).toBe('py done\n');
      await waitFor(() => updates.includes(uri), { message: 'no update for the Python output' });
      const [text, artifact] = result.content as Json[];
      expect(text).toMatchObject({ type: 'resource_link', size: 200_000 });
      expect(field(await client.readResource({ uri: text?.['uri'] }), 'text')).toBe('é'.repeat(100_000));
      expect(artifact).toMatchObject({ type: 'resource_link', name: 'py.bin', size: 3000 });
      const bytes = Buffer.from(
        field(await client.readResource({ uri: artifact?.['uri'] }), 'blob') as string,
        'base64',
      );
      expect([bytes[0], bytes[1000], bytes[2999]]).toEqual([0, 1, 2]);
    } finally {
      await worker.kill('SIGKILL');
    }
  });
});

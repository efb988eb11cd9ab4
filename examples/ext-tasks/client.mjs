#!/usr/bin/env node
// `@modelcontextprotocol/ext-tasks` on the 2026-07-28 (sessionless) transport against a taskrelay gateway: calls a
// tool as a task of the tasks extension, prints its status, then its result. Ctrl-C cancels the task.
// Usage: node examples/ext-tasks/client.mjs [url] [tool] [arguments as JSON]
//   e.g. node examples/ext-tasks/client.mjs http://127.0.0.1:3000/mcp build_report '{"report":"q3","items":5}'
// TASKRELAY_TOKEN: a bearer token, when the gateway has authentication on. The walk-through is docs/CLIENTS.md.
import { Buffer } from 'node:buffer';
import { pathToFileURL } from 'node:url';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';

const PROTOCOL_VERSION = '2026-07-28';
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';

/** A header value as SEP-2243 carries it: as is when a header can hold it, else `=?base64?…?=`. */
export function headerValue(value) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  const plain = /^[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?$/.test(text) && !/^=\?base64\?/i.test(text);
  return plain ? text : `=?base64?${Buffer.from(text, 'utf8').toString('base64')}?=`;
}

/**
 * The `rawDispatch` ext-tasks needs on this transport. ext-tasks sends the extension's requests (`tools/call` with a
 * task, `tasks/get`, `tasks/update`, `tasks/cancel`) itself, and on 2026-07-28 the routing headers are the host's job:
 * `Mcp-Method` always, `Mcp-Name` (the tool, or the task id), and `Mcp-Param-<Name>` for every argument a tool maps to a
 * header (`x-mcp-header` in its `inputSchema`, from `tools/list`). The answer is one JSON body or an SSE stream.
 */
export function taskrelayRawDispatch(url, { headers = {}, tools = [] } = {}) {
  const byName = new Map(tools.map((tool) => [tool.name, tool]));
  let nextId = 1;
  return async (message) => {
    const request = { jsonrpc: '2.0', id: `ext-tasks-${nextId++}`, ...message };
    const routing = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-protocol-version': PROTOCOL_VERSION,
      'mcp-method': request.method,
    };
    const name = request.method === 'tools/call' ? request.params?.name : request.params?.taskId;
    if (typeof name === 'string') routing['mcp-name'] = headerValue(name);
    if (request.method === 'tools/call') {
      const properties = byName.get(request.params?.name)?.inputSchema?.properties ?? {};
      for (const [arg, schema] of Object.entries(properties)) {
        const header = schema?.['x-mcp-header'];
        const value = request.params?.arguments?.[arg];
        if (typeof header === 'string' && value !== undefined && value !== null) {
          routing[`mcp-param-${header.toLowerCase()}`] = headerValue(value);
        }
      }
    }
    const res = await fetch(url, {
      method: 'POST',
      headers: { ...routing, ...headers },
      body: JSON.stringify(request),
    });
    return readAnswer(res, request.id);
  };
}

/** The JSON-RPC response to request `id`: the body, or the matching `data:` of an SSE stream. */
async function readAnswer(res, id) {
  const type = res.headers.get('content-type') ?? '';
  if (!type.includes('text/event-stream')) return res.json();
  const text = await res.text();
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).trimStart())
      .join('\n');
    if (!data) continue;
    const parsed = JSON.parse(data);
    if (parsed.id === id && ('result' in parsed || 'error' in parsed)) return parsed;
  }
  throw new Error(`no answer to ${id} in the event stream (HTTP ${res.status})`);
}

/** A v2 SDK client pinned to 2026-07-28 and an ext-tasks session over it. */
export async function connectTasks(url, { token, clientInfo = { name: 'ext-tasks-example', version: '1.0.0' } } = {}) {
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  const client = new Client(clientInfo, { capabilities: {}, versionNegotiation: { mode: { pin: PROTOCOL_VERSION } } });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  const { tools } = await client.listTools();
  const session = createTaskSessionFromClient(client, {
    endpointId: url,
    rawDispatch: taskrelayRawDispatch(url, { headers, tools }),
    v2RequestFraming: {
      protocolVersion: PROTOCOL_VERSION,
      clientInfo,
      clientCapabilities: { extensions: { [TASKS_EXTENSION]: {} } },
    },
  });
  return {
    client,
    session,
    close: async () => {
      await session.close();
      await client.close();
    },
  };
}

async function main() {
  const url = process.argv[2] ?? 'http://127.0.0.1:3000/mcp';
  const tool = process.argv[3] ?? 'build_report';
  const args = JSON.parse(process.argv[4] ?? '{"report":"ext-tasks","items":5}');
  const { session, close } = await connectTasks(url, { token: process.env.TASKRELAY_TOKEN });
  const execution = await session.callTool(tool, args);
  // Ctrl-C cancels from here on. The handler goes in before the line that says the task exists: a Ctrl-C sent on
  // seeing that line (as a person or a test does) could otherwise arrive first and end the process uncancelled.
  process.once('SIGINT', () => {
    console.log('cancelling');
    void execution.cancel();
  });
  console.log(`execution ${execution.kind}`);
  const { outcome } = await execution.settle();
  console.log(`status ${outcome.status}${outcome.task?.statusMessage ? `: ${outcome.task.statusMessage}` : ''}`);
  if (outcome.result)
    console.log(`result ${JSON.stringify(outcome.result.structuredContent ?? outcome.result.content)}`);
  await close();
  process.exitCode = outcome.status === 'completed' && !outcome.result?.isError ? 0 : 1;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((error) => {
    console.error(`ext-tasks example: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  });
}

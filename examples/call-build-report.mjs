#!/usr/bin/env node
// Calls build_report as an MCP task on a running taskrelay gateway, prints live progress, then the result.
// Usage: node examples/call-build-report.mjs [url] [items]
// With authentication on, set TASKRELAY_TOKEN to a token of TASKRELAY_AUTH_TOKENS (the CLI reads the same variable).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const url = new URL(process.argv[2] ?? 'http://127.0.0.1:3000/mcp');
const items = Number(process.argv[3] ?? 20);
const token = process.env.TASKRELAY_TOKEN;

/** What went wrong, in one line: the HTTP status the SDK's error carries says more than its message. */
function explain(error) {
  const status = typeof error?.code === 'number' && error.code >= 100 && error.code < 600 ? error.code : undefined;
  if (status === 401) {
    return token === undefined
      ? `the gateway at ${url} needs a token (HTTP 401): set TASKRELAY_TOKEN`
      : `the gateway at ${url} refused TASKRELAY_TOKEN (HTTP 401)`;
  }
  if (status === 403) return `the gateway at ${url} refused this token for that (HTTP 403)`;
  if (error?.message === 'fetch failed' || error?.cause?.code === 'ECONNREFUSED') {
    return `cannot reach the gateway at ${url}: is it running? (npm start)`;
  }
  return String(error?.message ?? error).split('\n')[0];
}

const client = new Client({ name: 'taskrelay-example', version: '1.0.0' });
try {
  const headers = token === undefined ? {} : { Authorization: `Bearer ${token}` };
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }));
  await client.listTools(); // caches each tool's execution.taskSupport

  const stream = client.experimental.tasks.callToolStream(
    { name: 'build_report', arguments: { report: 'q3-sales', items, delayMs: 100 } },
    CallToolResultSchema,
    {
      task: { ttl: 60_000 },
      onprogress: (p) => console.log(`progress ${p.progress}/${p.total ?? '?'} ${p.message ?? ''}`),
    },
  );
  for await (const message of stream) {
    if (message.type === 'taskCreated') console.log(`task ${message.task.taskId} created`);
    else if (message.type === 'taskStatus') console.log(`status ${message.task.status}`);
    else if (message.type === 'result') console.log('result', JSON.stringify(message.result));
    else if (message.type === 'error') throw message.error;
  }
} catch (error) {
  console.error(`call-build-report: ${explain(error)}`);
  process.exitCode = 1;
} finally {
  await client.close().catch(() => undefined);
}

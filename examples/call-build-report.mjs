#!/usr/bin/env node
// Calls build_report as an MCP task on a running taskrelay gateway, prints live progress, then the result.
// Usage: node examples/call-build-report.mjs [url] [items]
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const url = new URL(process.argv[2] ?? 'http://127.0.0.1:3000/mcp');
const items = Number(process.argv[3] ?? 20);

const client = new Client({ name: 'taskrelay-example', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(url));
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
  else if (message.type === 'error') console.error('error', message.error);
}
await client.close();

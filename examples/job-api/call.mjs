#!/usr/bin/env node
// Calls a job-API tool as an MCP task on a running taskrelay gateway, prints live progress, then the result.
// Ctrl-C cancels the task (and, through taskrelay, the batch job).
// Usage: node examples/job-api/call.mjs [url] [tool] [steps] [stepMs] [fail]
// `fail`: a message the fake batch service fails the job with (to see what a caller gets when the upstream fails).
// A failed task prints its message (the upstream's own) on stderr and exits 1.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const url = new URL(process.argv[2] ?? 'http://127.0.0.1:3000/mcp');
const tool = process.argv[3] ?? 'run_batch';
const steps = Number(process.argv[4] ?? 10);
const stepMs = Number(process.argv[5] ?? 500);
const fail = process.argv[6];

const client = new Client({ name: 'taskrelay-job-api-example', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(url));
await client.listTools(); // caches each tool's execution.taskSupport

let taskId;
process.once('SIGINT', async () => {
  if (taskId) {
    console.log(`cancelling ${taskId}`);
    await client.experimental.tasks.cancelTask(taskId).catch((e) => console.error(String(e)));
  }
  await client.close();
  process.exit(130);
});

const stream = client.experimental.tasks.callToolStream(
  { name: tool, arguments: { label: 'walk-through', steps, stepMs, ...(fail === undefined ? {} : { fail }) } },
  CallToolResultSchema,
  {
    task: { ttl: 3_600_000 },
    onprogress: (p) => console.log(`progress ${p.progress}/${p.total ?? '?'} ${p.message ?? ''}`),
  },
);
let last; // the task as last read: a failed one carries the upstream's message as its statusMessage
for await (const message of stream) {
  if (message.type === 'taskCreated') console.log(`task ${(taskId = message.task.taskId)} created`);
  else if (message.type === 'taskStatus') console.log(`status ${(last = message.task).status}`);
  else if (message.type === 'result') console.log('result', JSON.stringify(message.result));
  else if (message.type === 'error') {
    // The SDK's stream says only "Task <id> failed" (-32603); the task itself says why.
    const why = last?.status === 'failed' || last?.status === 'cancelled' ? last.statusMessage : undefined;
    console.error(`task ${last?.status ?? 'error'}: ${why ?? message.error.message}`);
    process.exitCode = 1;
  }
}
await client.close();

/**
 * The peer taskrelay is compared with: a single-process MCP server built the way the SDK 1.32.2 documents it —
 * `McpServer` + `InMemoryTaskStore` (`registerToolTask`), Streamable HTTP with sessions (one transport and one server
 * per session, `createMcpExpressApp`), serving the same no-op tool as the benchmark's worker (`bench_noop`).
 *
 * Its no-op runs inside `createTask` and stores its result before `createTask` returns, so neither the SDK's
 * automatic polling of plain calls nor `tasks/result`'s re-poll ever waits: this is the SDK's best case (no queue, no
 * second process, no poll interval), the conservative baseline for taskrelay's overhead.
 *
 * Run: `node --import tsx bench/peer-server.ts` with PORT (default 3100). GET /healthz answers 200.
 */
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import { z } from 'zod';

const port = Number(process.env['PORT'] ?? 3100);
const DEFAULT_TTL_MS = 3_600_000;
const store = new InMemoryTaskStore();
const transports = new Map<string, StreamableHTTPServerTransport>();

function createServer(): McpServer {
  const mcp = new McpServer(
    { name: 'sdk-peer', version: '1.32.2' },
    {
      capabilities: { tools: {}, tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } },
      taskStore: store,
    },
  );
  mcp.experimental.tasks.registerToolTask(
    'bench_noop',
    {
      description: 'Does nothing and returns at once.',
      inputSchema: {},
      execution: { taskSupport: 'optional' },
    },
    {
      async createTask(_args, extra) {
        const task = await extra.taskStore.createTask({
          ttl: extra.taskRequestedTtl ?? DEFAULT_TTL_MS,
          pollInterval: 1000,
        });
        const result: CallToolResult = { content: [{ type: 'text', text: 'ok' }] };
        await extra.taskStore.storeTaskResult(task.taskId, 'completed', result);
        return { task: (await extra.taskStore.getTask(task.taskId)) ?? task };
      },
      async getTask(_args, extra) {
        const task = await extra.taskStore.getTask(extra.taskId);
        if (!task) throw new Error(`unknown task ${extra.taskId}`);
        return task;
      },
      async getTaskResult(_args, extra) {
        return (await extra.taskStore.getTaskResult(extra.taskId)) as CallToolResult;
      },
    },
  );
  // The polling-client rows (bench/lib/polling.ts): a task that ends `ms` after it is created, with the SDK
  // examples' fixed 1 s pollInterval.
  mcp.experimental.tasks.registerToolTask(
    'bench_hold',
    {
      description: 'Ends `ms` after it starts.',
      inputSchema: { ms: z.number().int().min(0).max(60_000) },
      execution: { taskSupport: 'optional' },
    },
    {
      async createTask({ ms }, extra) {
        const task = await extra.taskStore.createTask({
          ttl: extra.taskRequestedTtl ?? DEFAULT_TTL_MS,
          pollInterval: 1000,
        });
        const taskStore = extra.taskStore;
        setTimeout(() => {
          const result: CallToolResult = { content: [{ type: 'text', text: 'held' }] };
          void taskStore.storeTaskResult(task.taskId, 'completed', result);
        }, ms);
        return { task };
      },
      async getTask(_args, extra) {
        const task = await extra.taskStore.getTask(extra.taskId);
        if (!task) throw new Error(`unknown task ${extra.taskId}`);
        return task;
      },
      async getTaskResult(_args, extra) {
        return (await extra.taskStore.getTaskResult(extra.taskId)) as CallToolResult;
      },
    },
  );
  return mcp;
}

const app = createMcpExpressApp({ host: '127.0.0.1' });
app.get('/healthz', (_req, res) => {
  res.json({ status: 'ok' });
});

app.post('/mcp', async (req, res) => {
  const sessionId = req.header('mcp-session-id');
  let transport = sessionId === undefined ? undefined : transports.get(sessionId);
  if (!transport) {
    if (sessionId !== undefined || !isInitializeRequest(req.body)) {
      res.status(sessionId === undefined ? 400 : 404).json({
        jsonrpc: '2.0',
        error: { code: -32000, message: 'no valid session' },
        id: null,
      });
      return;
    }
    const created = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => void transports.set(id, created),
      onsessionclosed: (id) => void transports.delete(id),
    });
    created.onclose = () => {
      if (created.sessionId !== undefined) transports.delete(created.sessionId);
    };
    await createServer().connect(created);
    transport = created;
  }
  await transport.handleRequest(req, res, req.body);
});

for (const route of ['get', 'delete'] as const) {
  app[route]('/mcp', async (req, res) => {
    const transport = transports.get(req.header('mcp-session-id') ?? '');
    if (!transport) {
      res.status(404).end();
      return;
    }
    await transport.handleRequest(req, res);
  });
}

const server = app.listen(port, '127.0.0.1', () => console.log(`sdk peer listening on http://127.0.0.1:${port}/mcp`));
const stop = () => {
  for (const transport of transports.values()) void transport.close();
  server.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 1000).unref();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

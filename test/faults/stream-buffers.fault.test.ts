/**
 * Fault suite, PROTOCOL.md §22.2 item 0 (issue 32, R5): clients that open a session's GET stream and never read it,
 * while their tasks flood it with log messages. Each stream's own bound is set high, so only the memory budget can stop
 * the gateway holding their bytes: it counts them, and past it closes the largest stream buffers of the principal
 * holding the most, until the rest fit. The gateway stays up, reports the bytes, and a closed stream's client resumes.
 */
import { connect, type Socket } from 'node:net';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RawSession } from '../helpers/raw-mcp.js';
import { ROOT, readMetric, type GatewayProcess } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait-for.js';

const ABUSE_TOOLS = resolve(ROOT, 'test/fixtures/abuse-tools.mjs');
const BUDGET_BYTES = 24 * 1024 * 1024;
const SESSIONS = 8;

const stack = useStack({
  name: 'f-streams',
  env: { TASKRELAY_PROGRESS_INTERVAL_MS: '0' },
  gateways: [
    {
      TASKRELAY_MEMORY_BUDGET_BYTES: String(BUDGET_BYTES),
      // No stream reaches its own bound here: what stops the growth is the budget.
      TASKRELAY_MAX_STREAM_BUFFER_BYTES: String(64 * 1024 * 1024),
    },
  ],
  workers: [{ TASKRELAY_TOOLS: ABUSE_TOOLS, WORKER_CONCURRENCY: String(SESSIONS) }],
});
let gateway: GatewayProcess;
const sockets: Socket[] = [];

beforeAll(() => {
  ({ gateway } = stack);
});

afterAll(() => {
  for (const socket of sockets) socket.destroy();
});

interface Memory {
  usedBytes: number;
  budgetBytes: number;
  streamBytes: number;
}

async function memory(): Promise<Memory> {
  const body = (await (await fetch(gateway.url.replace(/\/mcp$/, '/readyz'))).json()) as { memory: Memory };
  return body.memory;
}

/** The session's GET stream, opened on a raw socket that then reads nothing. */
function stalledGetStream(sessionId: string): Socket {
  const url = new URL(gateway.url);
  const socket = connect(Number(url.port), url.hostname);
  socket.write(
    `GET ${url.pathname} HTTP/1.1\r\nhost: ${url.host}\r\naccept: text/event-stream\r\n` +
      `mcp-session-id: ${sessionId}\r\nmcp-protocol-version: 2025-11-25\r\n\r\n`,
  );
  socket.pause();
  sockets.push(socket);
  return socket;
}

describe('§22.2 SSE send buffers in the memory budget', () => {
  it('counts unread streams, sheds the largest past the budget, and stays up', async () => {
    const sessions: RawSession[] = [];
    for (let i = 0; i < SESSIONS; i++) {
      const session = await RawSession.open(gateway.url);
      sessions.push(session);
      stalledGetStream(session.sessionId);
    }
    // Each task sends about 12 MB of log messages to its session's GET stream, which nobody reads.
    for (const session of sessions) {
      const created = await session.request('tools/call', {
        name: 'log_flood',
        arguments: { count: 200, bytes: 60_000, stepMs: 1 },
        task: { ttl: 60_000 },
      });
      expect(created.result?.task).toBeDefined();
    }
    await waitFor(async () => (await readMetric(gateway.url, 'taskrelay_sse_streams_shed_total')) > 0, {
      timeoutMs: 60_000,
      message: 'no stream was shed',
    });
    // The floods end; whatever is left fits the budget, and the bytes waiting are counted in it.
    await waitFor(async () => (await memory()).usedBytes <= BUDGET_BYTES, { timeoutMs: 60_000 });
    const after = await memory();
    expect(after.streamBytes).toBeLessThanOrEqual(after.usedBytes);
    expect(gateway.child.exitCode).toBeNull();
    expect(gateway.logs().some((l) => String(l['msg']).startsWith('SSE stream closed: the memory budget'))).toBe(true);
    // A shed stream's session is still there: its client opens the GET stream again.
    const ping = await sessions[0]!.post({ jsonrpc: '2.0', id: 7, method: 'ping' });
    await ping.body?.cancel();
    expect(ping.status).toBe(200);
  }, 120_000);
});

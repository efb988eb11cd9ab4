/**
 * The memory budget as the process sees it (PROTOCOL.md §22.2, issue 48 F3): S sessions each hold a GET stream that
 * nobody reads, while their tasks flood it with log messages; a stream the budget sheds is opened again at once, so
 * the pressure never stops. Every few seconds it samples the gateway's RSS (/proc/<pid>/status) and what the budget
 * counts (`/readyz`), and prints both, then the plateau (the second half of the run) against the budget.
 *
 *   pnpm build && npx tsx bench/memory.ts [--streams 1000] [--budget-mib 512] [--minutes 5] [--sample-s 5]
 *
 * The 2-core CI machine runs it at --streams 250 --budget-mib 128 (the same streams per MiB as 1,000 at 512).
 * Loopback only; everything started is stopped by PID. No thresholds: it prints a table.
 */
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { startRedis, uniquePrefix } from '../test/helpers/redis.js';
import { RawSession } from '../test/helpers/raw-mcp.js';
import { ROOT, startGatewayProcess, startWorkerProcess, stopAll } from '../test/helpers/processes.js';

const { values } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    streams: { type: 'string', default: '1000' },
    'budget-mib': { type: 'string', default: '512' },
    minutes: { type: 'string', default: '5' },
    'sample-s': { type: 'string', default: '5' },
  },
});
const STREAMS = Number(values.streams);
const BUDGET = Number(values['budget-mib']) * 1024 * 1024;
const RUN_MS = Number(values.minutes) * 60_000;
const SAMPLE_MS = Number(values['sample-s']) * 1000;
const MIB = 1024 * 1024;

const redis = await startRedis();
// Whatever fails, stop what was started (by PID) before exiting.
process.on('uncaughtException', (error) => {
  console.error(error);
  void stopAll().finally(() => void redis.stop().finally(() => process.exit(1)));
});
const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('bench-mem'), TASKRELAY_PROGRESS_INTERVAL_MS: '0' };
const gateway = await startGatewayProcess({
  ...env,
  TASKRELAY_MEMORY_BUDGET_BYTES: String(BUDGET),
  TASKRELAY_MAX_SESSIONS_PER_PRINCIPAL: String(STREAMS * 2),
  LOG_LEVEL: 'warn',
});
await startWorkerProcess({
  ...env,
  TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/abuse-tools.mjs'),
  WORKER_CONCURRENCY: String(Math.min(STREAMS, 200)),
});

const url = new URL(gateway.url);
await new Promise((r) => setTimeout(r, 3000));
const baselineRss = rssBytes(gateway.child.pid!);
const sockets = new Set<Socket>();
let stopping = false;
let reopened = 0;

/** The session's GET stream on a raw socket that reads nothing; opened again when the gateway closes it. */
function stalledGetStream(sessionId: string): void {
  const socket = connect(Number(url.port), url.hostname);
  socket.write(
    `GET ${url.pathname} HTTP/1.1\r\nhost: ${url.host}\r\naccept: text/event-stream\r\n` +
      `mcp-session-id: ${sessionId}\r\nmcp-protocol-version: 2025-11-25\r\n\r\n`,
  );
  socket.pause();
  sockets.add(socket);
  socket.on('error', () => undefined);
  socket.on('close', () => {
    sockets.delete(socket);
    if (stopping) return;
    reopened++;
    setTimeout(() => stalledGetStream(sessionId), 200);
  });
}

function rssBytes(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('VmRSS:'));
  return Number(line?.split(/\s+/)[1] ?? 0) * 1024;
}

async function budgetUse(): Promise<{ usedBytes: number; streamBytes: number; eventBytes: number }> {
  const res = await fetch(`${url.origin}/readyz`);
  return ((await res.json()) as { memory: { usedBytes: number; streamBytes: number; eventBytes: number } }).memory;
}

/** The V8 heap in use (live and not yet collected), from the gateway's prom-client process metrics. */
async function heapUsedBytes(): Promise<number> {
  const text = await (await fetch(`${url.origin}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('taskrelay_gateway_nodejs_heap_size_used_bytes '));
  return Number(line?.split(' ')[1] ?? NaN);
}

const sessions: RawSession[] = [];
for (let i = 0; i < STREAMS; i++) {
  const session = await RawSession.open(gateway.url).catch(() => undefined);
  if (session === undefined) break;
  sessions.push(session);
  stalledGetStream(session.sessionId);
}
console.log(
  `${sessions.length} sessions with an unread GET stream; budget ${BUDGET / MIB} MiB; ` +
    `gateway RSS before them ${(baselineRss / MIB).toFixed(0)} MiB`,
);

// Each session's tool floods its stream with 60 KB log messages for the whole run.
const count = Math.ceil(RUN_MS / 50) + 100;
for (const session of sessions) {
  await session
    .request('tools/call', {
      name: 'log_flood',
      arguments: { count, bytes: 60_000, stepMs: 50 },
      task: { ttl: RUN_MS + 120_000 },
    })
    .catch(() => undefined);
}

const pid = gateway.child.pid!;
const samples: Array<{ t: number; rss: number; used: number }> = [];
const started = Date.now();
console.log('t_s\trss_MiB\theap_used_MiB\tbudget_used_MiB\tstream_MiB\tevent_MiB\topen_sockets\treopened');
while (Date.now() - started < RUN_MS) {
  await new Promise((r) => setTimeout(r, SAMPLE_MS));
  const use = await budgetUse().catch(() => undefined);
  const heap = await heapUsedBytes().catch(() => NaN);
  const rss = rssBytes(pid);
  const t = Math.round((Date.now() - started) / 1000);
  samples.push({ t, rss, used: use?.usedBytes ?? NaN });
  console.log(
    [
      t,
      rss / MIB,
      heap / MIB,
      (use?.usedBytes ?? NaN) / MIB,
      (use?.streamBytes ?? NaN) / MIB,
      (use?.eventBytes ?? NaN) / MIB,
    ]
      .map((v) => (typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(0) : String(v)))
      .concat([String(sockets.size), String(reopened)])
      .join('\t'),
  );
}
const plateau = samples.slice(Math.floor(samples.length / 2));
const rss = plateau.map((s) => s.rss);
const maxRss = Math.max(...rss);
const meanRss = rss.reduce((a, b) => a + b, 0) / rss.length;
console.log(
  `plateau (second half): RSS mean ${(meanRss / MIB).toFixed(0)} MiB, max ${(maxRss / MIB).toFixed(0)} MiB = ` +
    `${(maxRss / BUDGET).toFixed(2)} x the budget, ${((maxRss - baselineRss) / BUDGET).toFixed(2)} x over the ` +
    `idle gateway's RSS; gateway alive: ${gateway.child.exitCode === null}`,
);
stopping = true;
for (const socket of sockets) socket.destroy();
await stopAll();
await redis.stop();
process.exit(0);

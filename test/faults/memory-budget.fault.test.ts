/**
 * Fault suite, PROTOCOL.md §22.2 (the gateway’s memory budget): sessions whose event stores fill up, more of them than
 * the budget holds. The least recently seen idle session is closed first; once no session is idle, a new one is
 * refused with 503 and Retry-After; /readyz reports the pressure; the gateway stays up and serves the sessions it kept.
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { uniquePrefix } from '../helpers/redis.js';
import { RawSession } from '../helpers/raw-mcp.js';
import { ROOT, readMetric, type GatewayProcess } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait-for.js';

const ABUSE_TOOLS = resolve(ROOT, 'test/fixtures/abuse-tools.mjs');
/** Three sessions' full event stores (1 MiB each, counted at twice their bytes: §22.2) do not fit; two do. */
const BUDGET_BYTES = 6 * 1024 * 1024;

const stack = useStack({
  name: 'f-budget',
  env: { TASKRELAY_PROGRESS_INTERVAL_MS: '0' },
  gateways: [{ TASKRELAY_MEMORY_BUDGET_BYTES: String(BUDGET_BYTES) }],
  workers: [{ TASKRELAY_TOOLS: ABUSE_TOOLS }],
});
let gateway: GatewayProcess;

beforeAll(() => {
  ({ gateway } = stack);
});

interface Readiness {
  status: string;
  memory?: { usedBytes: number; budgetBytes: number; sessions: number; pressure: boolean };
}

async function readiness(): Promise<Readiness> {
  return (await (await fetch(gateway.url.replace(/\/mcp$/, '/readyz'))).json()) as Readiness;
}

/** Fills a session's event store: a plain call whose six progress events of 200 KB each are kept for replay. */
/** About 1.2 MB of log messages on the session's stream: its event store fills to its 1 MiB bound. */
async function fill(session: RawSession): Promise<void> {
  const answer = await session.request('tools/call', {
    name: 'log_flood',
    arguments: { count: 20, bytes: 60_000, stepMs: 5 },
  });
  expect(answer.result?.structuredContent).toEqual({ count: 20 });
}

async function pingStatus(session: RawSession): Promise<number> {
  const res = await session.post({ jsonrpc: '2.0', id: 99, method: 'ping' });
  await res.body?.cancel();
  return res.status;
}

describe('§22.2 the gateway memory budget', () => {
  it('closes the least recently seen idle session first, then trims busy sessions’ event stores to fit', async () => {
    const a = await RawSession.open(gateway.url);
    await fill(a);
    const b = await RawSession.open(gateway.url);
    await fill(b);
    expect(await pingStatus(a)).toBe(200);
    expect(await pingStatus(b)).toBe(200); // b is now the more recently seen
    const c = await RawSession.open(gateway.url);
    await fill(c);
    // a was idle and seen least recently: it went, and the rest fit.
    await waitFor(async () => (await pingStatus(a)) === 404, { message: 'the oldest idle session was not closed' });
    expect(await pingStatus(b)).toBe(200);
    expect(await pingStatus(c)).toBe(200);
    const after = await readiness();
    expect(after.memory?.usedBytes).toBeLessThanOrEqual(BUDGET_BYTES);

    // Every session busy (a GET stream open on each): nothing idle to close, so the event stores of the principal
    // holding the most drop their older halves (§22.2 item 0) until the rest fit; every session is still served.
    const streams = [b.openGetStream(), c.openGetStream()];
    const d = await RawSession.open(gateway.url);
    streams.push(d.openGetStream());
    await fill(d);
    await waitFor(async () => (await readMetric(gateway.url, 'taskrelay_sse_event_stores_trimmed_total')) > 0, {
      message: 'no event store was trimmed',
    });
    await waitFor(async () => (await readiness()).memory!.usedBytes <= BUDGET_BYTES, { message: 'over the budget' });
    for (const s of [b, c, d]) expect(await pingStatus(s)).toBe(200);

    // Idle again: a new session gets in by closing the least recently seen one.
    for (const stream of streams) stream.close();
    await Promise.all(streams.map((s) => s.done));
    const e = await waitFor(() => RawSession.open(gateway.url).catch(() => undefined), {
      message: 'no new session once the others were idle',
    });
    expect(await pingStatus(e)).toBe(200);
    expect(gateway.child.exitCode).toBeNull();
  });

  it('refuses a new session with 503 when the sessions alone fill the budget and none is idle', async () => {
    // A gateway of its own prefix, stopped with the stack if the test fails before it does.
    const small = await stack.addGateway({
      TASKRELAY_PREFIX: uniquePrefix('f-budget-small'),
      TASKRELAY_MEMORY_BUDGET_BYTES: String(1024 * 1024),
    });
    const held: Array<{ session: RawSession; stream: ReturnType<RawSession['openGetStream']> }> = [];
    let refused: Response | undefined;
    for (let i = 0; i < 20 && refused === undefined; i++) {
      const res = await fetch(small.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 0,
          method: 'initialize',
          params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'late', version: '0' } },
        }),
      });
      if (res.status === 503) {
        refused = res;
        break;
      }
      await res.body?.cancel();
      const session = await RawSession.open(small.url);
      held.push({ session, stream: session.openGetStream() });
    }
    expect(refused?.status).toBe(503);
    expect(Number(refused?.headers.get('retry-after'))).toBeGreaterThan(0);
    const body = (await refused!.json()) as { error?: { message: string } };
    expect(body.error?.message).toMatch(/memory budget/);
    const ready = (await (await fetch(small.url.replace(/\/mcp$/, '/readyz'))).json()) as Readiness;
    expect(ready.memory?.pressure).toBe(true);
    for (const { stream } of held) stream.close();
    await small.kill('SIGTERM');
  });
});

/**
 * Fault suite, PROTOCOL.md §22.4 and §6: the gateway's one subscriber is shared by every task it routes.
 * - A flood of long progress messages must not get it cut. Redis cuts a pub/sub client whose unsent output passes its
 *   `client-output-buffer-limit` (32 MB by default): 200 KB progress messages did, 25 times in one probe, and every
 *   task on that gateway lost its live notifications during each reconnect. A progress message is now at most
 *   MAX_PROGRESS_MESSAGE_BYTES (4 KiB), cut with a marker. The limit is lowered here (1 MB hard, 256 KB soft) so that a
 *   flood a test can afford shows the same cut.
 * - Nor a flood of log messages (`ctx.notify` allows 64 KiB each, and none replaces another): 10 tasks × 1,000 × 60 KB
 *   cut it 4 times in a probe (issue 48 F4). What waits for the gateway on its channel is now bounded below Redis's
 *   limit (§22.4): a message that does not fit is not published, and the caller is told how many were dropped.
 * - When Redis cuts it anyway (`CLIENT KILL TYPE pubsub`), the gateway reconnects, re-reads what it routes, and the
 *   tasks' progress and results reach their callers again.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from 'ioredis';
import {
  CallToolResultSchema,
  LoggingMessageNotificationSchema,
  type Progress,
} from '@modelcontextprotocol/sdk/types.js';
import { ROOT, connectClient, readMetric, type GatewayProcess } from '../helpers/processes.js';
import { retryingUnavailable, testRedis } from '../helpers/faults.js';
import { waitFor } from '../helpers/wait-for.js';
import { startStack, type TestStack } from '../helpers/stack.js';

const ABUSE_TOOLS = `${ROOT}/test/fixtures/abuse-tools.mjs`;
const MAX_PROGRESS_MESSAGE_BYTES = 4_096;

let stack: TestStack;
let r: Redis;
let gateway: GatewayProcess;

beforeAll(async () => {
  stack = await startStack({
    name: 'f-subscriber',
    redis: { owned: true },
    // No coalescing anywhere: every message is published and forwarded.
    env: { TASKRELAY_PROGRESS_INTERVAL_MS: '0' },
    workers: [{ TASKRELAY_TOOLS: ABUSE_TOOLS, WORKER_CONCURRENCY: '4' }],
  });
  gateway = stack.gateway;
  r = testRedis(stack.redis.url);
  await r.config('SET', 'client-output-buffer-limit', 'pubsub 1mb 256kb 10');
  // The gateway read Redis's limit as it started; it follows the change at its next backlog heartbeat (§22.4).
  await waitFor(
    async () => {
      const [key] = await r.keys(`${stack.prefix}:gateway:*:backlog`);
      return key !== undefined && Number(await r.hget(key, 'max')) <= 128 * 1024;
    },
    { timeoutMs: 30_000, message: 'the gateway never took up the lowered pub/sub limit' },
  );
}, 60_000);

afterAll(async () => {
  r?.disconnect();
  await stack?.stop();
});

const subscriberReconnects = () =>
  readMetric(gateway.url, 'taskrelay_redis_reconnects_total', { connection: 'subscriber' });

describe('the gateway’s subscriber', () => {
  it('stays connected through 200 KB progress messages, each bounded and marked', async () => {
    const client = await connectClient(gateway.url);
    try {
      const messages: string[] = [];
      const calls = Array.from({ length: 3 }, (_, i) =>
        client.callTool(
          { name: 'echo_progress', arguments: { text: `${i}`.repeat(200_000), steps: 30, stepMs: 20 } },
          CallToolResultSchema,
          { timeout: 120_000, onprogress: (p: Progress) => void messages.push(String(p.message ?? '')) },
        ),
      );
      // A gateway that falls behind (here: stopped for 2 s while the tools report) is when Redis buffers for it.
      await waitFor(() => messages.length > 0, { message: 'no progress at all' });
      process.kill(gateway.pid, 'SIGSTOP');
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      process.kill(gateway.pid, 'SIGCONT');
      const results = await Promise.all(calls);
      for (const result of results) expect(result.isError).toBeFalsy();
      for (const message of messages) {
        expect(Buffer.byteLength(message)).toBeLessThanOrEqual(MAX_PROGRESS_MESSAGE_BYTES);
        expect(message).toMatch(/ …\[truncated: 2000\d\d bytes\]$/);
      }
      expect(await subscriberReconnects()).toBe(0);
      expect(gateway.logs().some((l) => l['msg'] === 'subscriber reconnected; task routes reconciled')).toBe(false);
    } finally {
      process.kill(gateway.pid, 'SIGCONT');
      await client.close();
    }
  });

  it('stays connected through 10 tasks of 60 KB log messages, and the callers are told how many were dropped (F4)', async () => {
    const client = await connectClient(gateway.url);
    try {
      await client.setLoggingLevel('debug');
      const before = await subscriberReconnects();
      const logs: Array<{ logger?: string; level: string; data: unknown }> = [];
      client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void logs.push(n.params));
      let retried = 0;
      const calls = Array.from({ length: 10 }, () =>
        retryingUnavailable(
          () =>
            client.callTool(
              // 20 ms apart: the tasks still log after the 2 s stop, so a message that fits carries the count of those
              // dropped (at 1 ms they had all ended by then, and nothing was left to carry it). 30 MB/s: a cut without
              // the budget.
              { name: 'log_flood', arguments: { count: 200, bytes: 60_000, stepMs: 20 } },
              CallToolResultSchema,
              { timeout: 180_000 },
            ),
          3,
          () => retried++,
        ),
      );
      await waitFor(() => logs.length > 0, { message: 'no log message at all' });
      process.kill(gateway.pid, 'SIGSTOP');
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      process.kill(gateway.pid, 'SIGCONT');
      const results = await Promise.all(calls);
      for (const result of results) expect(result.isError).toBeFalsy();
      expect(await subscriberReconnects()).toBe(before);
      expect(gateway.logs().some((l) => l['msg'] === 'subscriber reconnected; task routes reconciled')).toBe(false);
      // What did not fit was dropped, and said so: a warning from logger `taskrelay` with the count.
      const notices = logs.filter((l) => l.logger === 'taskrelay');
      expect(notices.length).toBeGreaterThan(0);
      expect(notices[0]).toMatchObject({ level: 'warning', data: { dropped: expect.any(Number) } });
      const flood = logs.filter((l) => l.logger === 'log_flood').length;
      const dropped = notices.reduce((n, l) => n + Number((l.data as { dropped: number }).dropped), 0);
      expect(flood + dropped).toBeLessThanOrEqual(200 * (10 + retried));
    } finally {
      process.kill(gateway.pid, 'SIGCONT');
      await client.close();
    }
  });

  it('reconnects when Redis cuts it anyway, and its callers get their progress and results again', async () => {
    const client = await connectClient(gateway.url);
    try {
      const before = await subscriberReconnects();
      const progress: number[] = [];
      const call = client.callTool(
        { name: 'echo_progress', arguments: { text: 'x', steps: 60, stepMs: 50 } },
        CallToolResultSchema,
        { timeout: 120_000, onprogress: (p: Progress) => void progress.push(p.progress) },
      );
      await waitFor(() => progress.length >= 5, { message: 'no progress before the cut' });
      const killed = Number(await r.client('KILL', 'TYPE', 'pubsub'));
      expect(killed).toBeGreaterThanOrEqual(1);
      const cutAt = progress.length;
      await waitFor(async () => (await subscriberReconnects()) > before, {
        message: 'the subscriber did not reconnect',
      });
      await waitFor(() => gateway.logs().some((l) => l['msg'] === 'subscriber reconnected; task routes reconciled'), {
        message: 'the gateway did not reconcile its routes after the reconnect',
      });
      const result = await call;
      expect(result.isError).toBeFalsy();
      // Progress went on reaching the caller after the cut, up to the last step.
      expect(progress.length).toBeGreaterThan(cutAt);
      expect(progress.at(-1)).toBe(60);
    } finally {
      await client.close();
    }
  });
});

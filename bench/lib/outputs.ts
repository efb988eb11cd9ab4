/**
 * `pnpm bench --outputs`: task output as resources (PROTOCOL.md §34).
 * - Memory: 50 concurrent `resources/read` of one 16 MiB result stored by reference (`resource_link`), each body
 *   read to its end by the client. Sampled every 50 ms: the gateway's RSS and Redis's `used_memory` (which counts
 *   the client output buffers of the GETRANGE replies). What 50 whole copies would take: 50 × 16 MiB = 800 MiB of
 *   strings, twice that as UTF-16 JSON.
 * - Update latency: a tool writes its clock to its output (`ctx.output.set`) every 250 ms (above the 100 ms
 *   coalescing interval, so every write is told); the client, subscribed with `resources/subscribe`, reads the output
 *   on each `notifications/resources/updated` and takes receive time − written time (one machine, one clock).
 */
import { resolve } from 'node:path';
import { ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import type { TestRedis } from '../../test/helpers/redis.js';
import { uniquePrefix } from '../../test/helpers/redis.js';
import { ROOT, connectClient, startGatewayProcess, startWorkerProcess } from '../../test/helpers/processes.js';
import { startTask, taskResult } from '../../test/helpers/tasks.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { probeEnv, probeHeap, rssBytes, type RedisAdmin } from './procs.js';
import { machine, writeResults } from './report.js';
import { latency } from './stats.js';

const READERS = 50;
const RESULT_BYTES = 16 * 1024 * 1024;
const TICKS = 40;
const TICK_MS = 250;
const MiB = 1024 * 1024;

export async function runOutputs(o: {
  redis: TestRedis;
  admin: RedisAdmin;
  log: (m: string) => void;
}): Promise<number> {
  const startedAt = new Date();
  const env = {
    REDIS_URL: o.redis.url,
    TASKRELAY_PREFIX: uniquePrefix('outputs'),
    LOG_LEVEL: 'warn',
  };
  // The heap probe (a full GC, then memoryUsage) tells live memory from garbage not yet collected.
  const gateway = await startGatewayProcess({ ...env, ...probeEnv() });
  const worker = await startWorkerProcess(
    { ...env, LOG_LEVEL: 'info', TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-tools.mjs') },
    { readyTimeoutMs: 60_000 },
  );
  try {
    const client = await connectClient(gateway.url);
    o.log('storing a 16 MiB result by reference');
    const taskId = await startTask(client, 'big_result', { bytes: RESULT_BYTES });
    const result = await taskResult(client, taskId, 120_000);
    const link = result.content[0] as { uri: string; size: number };
    const reads = await concurrentReads(gateway.url, gateway.child.pid ?? -1, o.admin, link, o.log);
    const updates = await updateLatency(client, o.log);
    await client.close();
    const data = { kind: 'outputs', machine: machine(o.admin.version), startedAt, reads, updates };
    const lines = [
      `50 concurrent resources/read of a ${(link.size / MiB).toFixed(1)} MiB result (streamed):`,
      `  all bodies complete and of the right size: ${reads.allComplete} (${reads.seconds.toFixed(1)} s)`,
      `  gateway heap midway (after a full GC): used ${(reads.heapMidway.heapUsed / MiB).toFixed(0)} MiB, external ${(reads.heapMidway.external / MiB).toFixed(0)} MiB, RSS ${(reads.heapMidway.rss / MiB).toFixed(0)} MiB`,
      `  gateway RSS: ${(reads.gatewayRssBefore / MiB).toFixed(0)} MiB before, peak ${(reads.gatewayRssPeak / MiB).toFixed(0)} MiB (+${((reads.gatewayRssPeak - reads.gatewayRssBefore) / MiB).toFixed(0)} MiB)`,
      `  Redis used_memory: ${(reads.redisBefore / MiB).toFixed(0)} MiB before, peak ${(reads.redisPeak / MiB).toFixed(0)} MiB (+${((reads.redisPeak - reads.redisBefore) / MiB).toFixed(0)} MiB)`,
      `update latency, ctx.output.set → notifications/resources/updated (${updates.n} writes): p50 ${updates.p50} ms, p99 ${updates.p99} ms, max ${updates.max} ms`,
    ];
    console.log(lines.join('\n'));
    console.log(`results: ${await writeResults(data, startedAt)}`);
    return reads.allComplete ? 0 : 1;
  } finally {
    await Promise.allSettled([worker.kill('SIGKILL'), gateway.kill('SIGKILL')]);
  }
}

async function concurrentReads(
  url: string,
  gatewayPid: number,
  admin: RedisAdmin,
  link: { uri: string; size: number },
  log: (m: string) => void,
) {
  const headers = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-protocol-version': '2026-07-28',
    'mcp-method': 'resources/read',
    'mcp-name': link.uri,
  };
  const body = JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'resources/read',
    params: {
      uri: link.uri,
      _meta: {
        'io.modelcontextprotocol/protocolVersion': '2026-07-28',
        'io.modelcontextprotocol/clientCapabilities': {},
      },
    },
  });
  const gatewayRssBefore = rssBytes(gatewayPid);
  const redisBefore = await admin.usedMemory();
  let gatewayRssPeak = gatewayRssBefore;
  let redisPeak = redisBefore;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      gatewayRssPeak = Math.max(gatewayRssPeak, rssBytes(gatewayPid));
      redisPeak = Math.max(redisPeak, await admin.usedMemory());
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  log(`${READERS} concurrent reads`);
  const started = Date.now();
  // Once the reads are well under way: the gateway's live heap after a full GC, in the middle of them.
  const heapMidway = new Promise((r) => setTimeout(r, 3_000)).then(() => probeHeap(gatewayPid));
  const sizes = await Promise.all(
    Array.from({ length: READERS }, async () => {
      const res = await fetch(url, { method: 'POST', headers, body });
      let bytes = 0;
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) bytes += chunk.byteLength;
      return bytes;
    }),
  );
  const seconds = (Date.now() - started) / 1000;
  sampling = false;
  await sampler;
  return {
    readers: READERS,
    valueBytes: link.size,
    seconds,
    allComplete: sizes.every((s) => s >= link.size && s === sizes[0]),
    gatewayRssBefore,
    gatewayRssPeak,
    redisBefore,
    redisPeak,
    heapMidway: await heapMidway,
  };
}

async function updateLatency(client: Awaited<ReturnType<typeof connectClient>>, log: (m: string) => void) {
  log(`update latency over ${TICKS} writes`);
  const samples: number[] = [];
  let uri = '';
  let reading = Promise.resolve();
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, () => {
    const receivedAt = Date.now();
    reading = reading.then(async () => {
      const read = await client.readResource({ uri });
      const text = (read.contents[0] as { text?: string } | undefined)?.text ?? '';
      const written = Number(text.trim());
      if (Number.isFinite(written) && written > 0) samples.push(receivedAt - written);
    });
  });
  const taskId = await startTask(client, 'tick_output', { count: TICKS, intervalMs: TICK_MS });
  uri = `taskrelay://tasks/${taskId}/output`;
  await client.subscribeResource({ uri });
  await taskResult(client, taskId, 60_000);
  await waitFor(() => samples.length >= TICKS - 2, { timeoutMs: 10_000, message: 'updates missing' }).catch(
    () => undefined,
  );
  await reading;
  return latency(samples);
}

/**
 * Issue 13: with OTEL_EXPORTER_OTLP_ENDPOINT set, one trace runs from the gateway's tool call through the job to the
 * worker's run of the handler: the worker's span is a child of the gateway's, both exported over OTLP/HTTP (here to
 * a fake collector on loopback). Without it, nothing is carried in the job.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import { connectClient, startGatewayProcess, startWorkerProcess, stopAll } from './helpers/processes.js';

interface ExportedSpan {
  service: string;
  name: string;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  attributes: Record<string, unknown>;
}

let redis: TestRedis;
let collector: Server;
const spans: ExportedSpan[] = [];

/** OTLP/HTTP JSON: resourceSpans[].resource.attributes + scopeSpans[].spans[]. */
function collect(body: string): void {
  const doc = JSON.parse(body) as {
    resourceSpans: Array<{
      resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> };
      scopeSpans: Array<{ spans: Array<Record<string, unknown>> }>;
    }>;
  };
  for (const rs of doc.resourceSpans) {
    const service = rs.resource.attributes.find((a) => a.key === 'service.name')?.value.stringValue ?? '';
    for (const ss of rs.scopeSpans) {
      for (const s of ss.spans) {
        const attributes: Record<string, unknown> = {};
        for (const a of s['attributes'] as Array<{ key: string; value: Record<string, unknown> }>) {
          attributes[a.key] = Object.values(a.value)[0];
        }
        spans.push({
          service,
          name: s['name'] as string,
          traceId: s['traceId'] as string,
          spanId: s['spanId'] as string,
          parentSpanId: (s['parentSpanId'] as string | undefined) || undefined,
          attributes,
        });
      }
    }
  }
}

beforeAll(async () => {
  redis = await startRedis();
  collector = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      if (req.url === '/v1/traces') collect(body);
      res.writeHead(200, { 'Content-Type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => collector.listen(0, '127.0.0.1', resolve));
});

afterAll(async () => {
  await stopAll();
  await redis?.stop();
  await new Promise((resolve) => collector?.close(resolve));
});

describe('traces', () => {
  it('run from the gateway tool call to the worker handler, the worker span a child of the gateway span', async () => {
    const endpoint = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`;
    const env = {
      REDIS_URL: redis.url,
      TASKRELAY_PREFIX: uniquePrefix('traces'),
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      OTEL_BSP_SCHEDULE_DELAY: '50',
    };
    const gateway = await startGatewayProcess(env);
    await startWorkerProcess(env);
    const client = await connectClient(gateway.url);
    const result = await client.callTool(
      { name: 'build_report', arguments: { report: 'traced', items: 2, delayMs: 1 } },
      CallToolResultSchema,
    );
    expect(result.isError).toBeFalsy();
    await client.close();

    const [call, run] = await waitFor(
      () => {
        const c = spans.find((s) => s.service === 'taskrelay-gateway' && s.name === 'tools/call build_report');
        const r = spans.find((s) => s.service === 'taskrelay-worker' && s.name === 'run build_report');
        return c && r ? ([c, r] as const) : undefined;
      },
      { timeoutMs: 15_000, message: 'the collector never got both spans' },
    );
    expect(run.traceId).toBe(call.traceId);
    expect(run.parentSpanId).toBe(call.spanId);
    expect(run.attributes['taskrelay.task_id']).toBe(call.attributes['taskrelay.task_id']);
    expect(call.attributes['taskrelay.tool']).toBe('build_report');
  });
});

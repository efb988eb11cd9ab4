/**
 * Issue 49 item 4, PROTOCOL.md §29.3: a Python worker serves the Node worker's metrics on `WORKER_METRICS_PORT`, moved
 * by its runs, and exports the same trace span as the Node worker (test/metrics-traces.e2e.test.ts): `run <tool>`, a
 * child of the gateway's `tools/call <tool>` span, with the same attributes. The Python exporter speaks OTLP/HTTP in
 * protobuf only: the fake collector decodes it with the worker's own `opentelemetry-proto`.
 */
import { execFileSync } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';
import {
  PYTHON,
  ROOT,
  connectClient,
  startGatewayProcess,
  startPythonWorkerProcess,
  stopAll,
} from './helpers/processes.js';

interface ExportedSpan {
  service: string;
  name: string;
  kind: number;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  attributes: Record<string, unknown>;
}

/** Protobuf OTLP to the JSON shape Node's exporter sends (ids as hex). */
const DECODE = `
import json, sys
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
req = ExportTraceServiceRequest()
req.ParseFromString(sys.stdin.buffer.read())
def value(v):
    kind = v.WhichOneof("value")
    if not kind:
        return {}
    return {kind.split("_")[0] + kind.split("_")[1].title(): getattr(v, kind)}
print(json.dumps({"resourceSpans": [{
    "resource": {"attributes": [{"key": a.key, "value": value(a.value)} for a in rs.resource.attributes]},
    "scopeSpans": [{"spans": [{
        "name": s.name, "kind": s.kind, "traceId": s.trace_id.hex(), "spanId": s.span_id.hex(),
        "parentSpanId": s.parent_span_id.hex(),
        "attributes": [{"key": a.key, "value": value(a.value)} for a in s.attributes]}
        for s in ss.spans]} for ss in rs.scope_spans]} for rs in req.resource_spans]}))
`;

let redis: TestRedis;
let collector: Server;
const spans: ExportedSpan[] = [];

function collect(doc: {
  resourceSpans: Array<{
    resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> };
    scopeSpans: Array<{ spans: Array<Record<string, unknown>> }>;
  }>;
}): void {
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
          kind: Number(s['kind']),
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
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url === '/v1/traces') {
        const json = (req.headers['content-type'] ?? '').includes('protobuf')
          ? execFileSync(PYTHON ?? 'python3', ['-c', DECODE], { input: body }).toString()
          : body.toString();
        collect(JSON.parse(json) as Parameters<typeof collect>[0]);
      }
      res.writeHead(200, { 'Content-Type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((done) => collector.listen(0, '127.0.0.1', done));
});

afterAll(async () => {
  await stopAll();
  await redis?.stop();
  await new Promise((done) => collector?.close(done));
});

describe.skipIf(PYTHON === undefined)('a Python worker', () => {
  it('serves the Node worker’s metrics on WORKER_METRICS_PORT and exports its run span under the gateway’s', async () => {
    const endpoint = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`;
    const env = {
      REDIS_URL: redis.url,
      TASKRELAY_PREFIX: uniquePrefix('py-observe'),
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      OTEL_BSP_SCHEDULE_DELAY: '50',
    };
    const metricsPort = await getPort({ host: '127.0.0.1' });
    const gateway = await startGatewayProcess(env);
    await startPythonWorkerProcess({
      ...env,
      TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'),
      WORKER_METRICS_PORT: String(metricsPort),
    });
    const client = await connectClient(gateway.url);
    const result = await client.callTool({ name: 'py_count', arguments: { n: 3, delay_ms: 5 } }, CallToolResultSchema);
    expect(result.isError).toBeFalsy();
    await client.close();

    const [call, run] = await waitFor(
      () => {
        const c = spans.find((s) => s.service === 'taskrelay-gateway' && s.name === 'tools/call py_count');
        const r = spans.find((s) => s.service === 'taskrelay-worker' && s.name === 'run py_count');
        return c && r ? ([c, r] as const) : undefined;
      },
      { timeoutMs: 15_000, message: `the collector never got both spans: ${JSON.stringify(spans.map((s) => s.name))}` },
    );
    expect(run.traceId).toBe(call.traceId);
    expect(run.parentSpanId).toBe(call.spanId);
    expect(run.kind).toBe(5); // CONSUMER, as Node's
    expect(run.attributes).toMatchObject({
      'taskrelay.task_id': call.attributes['taskrelay.task_id'],
      'taskrelay.tool': 'py_count',
      'taskrelay.attempt': 1,
      'taskrelay.worker_id': expect.any(String),
    });

    const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const sample = (line: string) =>
      Number(new RegExp(`^${line.replace(/[{}]/g, '\\$&')} (\\S+)$`, 'm').exec(text)?.[1]);
    expect(sample('taskrelay_worker_jobs_started_total{tool="py_count"}')).toBe(1);
    expect(sample('taskrelay_worker_run_seconds_count{tool="py_count"}')).toBe(1);
    expect(sample('taskrelay_queue_wait_seconds_count{tool="py_count"}')).toBe(1);
    expect(sample('taskrelay_worker_progress_writes_total')).toBeGreaterThan(0);
    expect(sample('taskrelay_worker_slots{state="busy"}')).toBe(0);
    expect(text).toMatch(/^taskrelay_worker_process_cpu_seconds_total /m);
  });
});

/**
 * Issue 49 item 4, PROTOCOL.md §29.3: a Python worker serves the Node worker's metrics on `WORKER_METRICS_PORT`, moved
 * by its runs, and exports the same trace span as the Node worker (test/metrics-traces.e2e.test.ts): `run <tool>`, a
 * child of the gateway's `tools/call <tool>` span, with the same attributes. The Python exporter speaks OTLP/HTTP in
 * protobuf only: the fake collector decodes it with the worker's own `opentelemetry-proto`.
 */
import { execFileSync } from 'node:child_process';
import { resolve } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { PYTHON, ROOT } from './helpers/processes.js';
import { startStack } from './helpers/stack.js';
import { callAndRun, startCollector, type Collector } from './helpers/otlp-collector.js';

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

let collector: Collector;

beforeAll(async () => {
  collector = await startCollector((body) =>
    execFileSync(PYTHON ?? 'python3', ['-c', DECODE], { input: body }).toString(),
  );
});

afterAll(async () => {
  await collector?.close();
});

describe.skipIf(PYTHON === undefined)('a Python worker', () => {
  it('serves the Node worker’s metrics on WORKER_METRICS_PORT and exports its run span under the gateway’s', async () => {
    const metricsPort = await getPort({ host: '127.0.0.1' });
    const stack = await startStack({
      name: 'py-observe',
      env: {
        OTEL_EXPORTER_OTLP_ENDPOINT: collector.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_BSP_SCHEDULE_DELAY: '50',
      },
      workers: [],
      pythonWorkers: [
        { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'), WORKER_METRICS_PORT: String(metricsPort) },
      ],
    });
    try {
      const client = await stack.client();
      const result = await client.callTool(
        { name: 'py_count', arguments: { n: 3, delay_ms: 5 } },
        CallToolResultSchema,
      );
      expect(result.isError).toBeFalsy();

      const [call, run] = await waitFor(() => callAndRun(collector.spans, 'py_count'), {
        timeoutMs: 15_000,
        message: `the collector never got both spans: ${JSON.stringify(collector.spans.map((s) => s.name))}`,
      });
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
    } finally {
      await stack.stop();
    }
  });
});

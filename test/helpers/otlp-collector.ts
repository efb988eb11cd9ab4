/**
 * A fake OTLP/HTTP trace collector on loopback, for the suites that follow a trace from the gateway into a worker
 * (test/metrics-traces.e2e.test.ts, test/python-observability.e2e.test.ts). It keeps every exported span, flattened.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ExportedSpan {
  service: string;
  name: string;
  kind: number;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  attributes: Record<string, unknown>;
}

/** OTLP/HTTP JSON: resourceSpans[].resource.attributes + scopeSpans[].spans[]. */
interface TracesDocument {
  resourceSpans: Array<{
    resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> };
    scopeSpans: Array<{ spans: Array<Record<string, unknown>> }>;
  }>;
}

export interface Collector {
  /** The base URL, for OTEL_EXPORTER_OTLP_ENDPOINT. */
  readonly endpoint: string;
  readonly spans: ExportedSpan[];
  close(): Promise<void>;
}

/**
 * Starts the collector. `protobuf` turns a protobuf body into the JSON document (a JSON body is read as it is); a
 * protobuf body without it fails the request.
 */
export async function startCollector(protobuf?: (body: Buffer) => string): Promise<Collector> {
  const spans: ExportedSpan[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url === '/v1/traces') {
        const isProtobuf = (req.headers['content-type'] ?? '').includes('protobuf');
        if (isProtobuf && !protobuf) {
          res.writeHead(415).end();
          return;
        }
        const json = isProtobuf && protobuf ? protobuf(body) : body.toString();
        spans.push(...flatten(JSON.parse(json) as TracesDocument));
      }
      res.writeHead(200, { 'Content-Type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    spans,
    close: () => new Promise<void>((done) => server.close(() => done())),
  };
}

function flatten(doc: TracesDocument): ExportedSpan[] {
  const spans: ExportedSpan[] = [];
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
  return spans;
}

/** The two spans of one call: the gateway's `tools/call <tool>` and the worker's `run <tool>`, once both arrived. */
export function callAndRun(spans: ExportedSpan[], tool: string): readonly [ExportedSpan, ExportedSpan] | undefined {
  const call = spans.find((s) => s.service === 'taskrelay-gateway' && s.name === `tools/call ${tool}`);
  const run = spans.find((s) => s.service === 'taskrelay-worker' && s.name === `run ${tool}`);
  return call && run ? ([call, run] as const) : undefined;
}

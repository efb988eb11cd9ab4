/**
 * Issue 13: with OTEL_EXPORTER_OTLP_ENDPOINT set, one trace runs from the gateway's tool call through the job to the
 * worker's run of the handler: the worker's span is a child of the gateway's, both exported over OTLP/HTTP (here to
 * a fake collector on loopback). Without it, nothing is carried in the job.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { startStack } from './helpers/stack.js';
import { callAndRun, startCollector, type Collector } from './helpers/otlp-collector.js';

let collector: Collector;

beforeAll(async () => {
  collector = await startCollector();
});

afterAll(async () => {
  await collector?.close();
});

describe('traces', () => {
  it('run from the gateway tool call to the worker handler, the worker span a child of the gateway span', async () => {
    const stack = await startStack({
      name: 'traces',
      env: {
        OTEL_EXPORTER_OTLP_ENDPOINT: collector.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_BSP_SCHEDULE_DELAY: '50',
      },
    });
    // Stopped once the spans arrived: a SIGKILL before the exporters' next batch would lose them.
    try {
      const client = await stack.client();
      const result = await client.callTool(
        { name: 'build_report', arguments: { report: 'traced', items: 2, delayMs: 1 } },
        CallToolResultSchema,
      );
      expect(result.isError).toBeFalsy();

      const [call, run] = await waitFor(() => callAndRun(collector.spans, 'build_report'), {
        timeoutMs: 15_000,
        message: 'the collector never got both spans',
      });
      expect(run.traceId).toBe(call.traceId);
      expect(run.parentSpanId).toBe(call.spanId);
      expect(run.attributes['taskrelay.task_id']).toBe(call.attributes['taskrelay.task_id']);
      expect(call.attributes['taskrelay.tool']).toBe('build_report');
    } finally {
      await stack.stop();
    }
  });
});

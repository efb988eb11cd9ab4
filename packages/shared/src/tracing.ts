/**
 * OpenTelemetry traces across the gateway and the workers: a span per tool call on the gateway, its W3C context
 * carried in the job's data, and the worker's run span as its child. Export (OTLP over HTTP) is set up only when
 * `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; otherwise the API's no-op tracer
 * is used: a span costs a few function calls and nothing is carried in the job.
 */
import {
  SpanKind,
  SpanStatusCode,
  context,
  propagation,
  trace,
  type Context,
  type Span,
  type Tracer,
} from '@opentelemetry/api';

export interface Tracing {
  /** Whether spans are exported. */
  readonly enabled: boolean;
  /** Flushes pending spans and stops exporting. */
  shutdown(): Promise<void>;
}

const DISABLED: Tracing = { enabled: false, shutdown: async () => undefined };

/**
 * Starts exporting traces as `serviceName` when an OTLP endpoint is configured (standard `OTEL_*` variables: endpoint,
 * headers, `OTEL_BSP_*` batching). The SDK is loaded only then. Call once per process, before serving.
 */
export async function startTracing(serviceName: string, env: NodeJS.ProcessEnv = process.env): Promise<Tracing> {
  if (!env['OTEL_EXPORTER_OTLP_ENDPOINT'] && !env['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT']) return DISABLED;
  const [{ NodeTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, { resourceFromAttributes }] =
    await Promise.all([
      import('@opentelemetry/sdk-trace-node'),
      import('@opentelemetry/exporter-trace-otlp-http'),
      import('@opentelemetry/resources'),
    ]);
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': env['OTEL_SERVICE_NAME'] ?? serviceName }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  });
  // Installs the AsyncLocalStorage context manager and the W3C trace-context propagator.
  provider.register();
  return { enabled: true, shutdown: () => provider.shutdown() };
}

export function tracer(): Tracer {
  return trace.getTracer('taskrelay');
}

/** The active context as W3C headers (`traceparent`, `tracestate`), or undefined when there is none to carry. */
export function injectTraceContext(): Record<string, string> | undefined {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return Object.keys(carrier).length > 0 ? carrier : undefined;
}

/** The context carried by a job, to parent the worker's span; the active one when the job carries none. */
export function extractTraceContext(carrier: Record<string, string> | undefined): Context {
  return carrier ? propagation.extract(context.active(), carrier) : context.active();
}

export type SpanAttributes = Record<string, string | number | boolean | undefined>;

/**
 * A span for a task's creation (the gateway's side of a tool call), and the context to carry in its job. `end` once
 * the job is enqueued (or failed to be).
 */
export function startTaskSpan(
  name: string,
  attributes: SpanAttributes,
): { carrier: Record<string, string> | undefined; end(error?: unknown): void } {
  const span = tracer().startSpan(name, { kind: SpanKind.PRODUCER, attributes: defined(attributes) });
  const carrier = context.with(trace.setSpan(context.active(), span), injectTraceContext);
  return {
    carrier,
    end: (error?: unknown) => {
      if (error !== undefined) recordError(span, error);
      span.end();
    },
  };
}

/** Runs `fn` inside the worker's span for a job, a child of the gateway's span when the job carries its context. */
export function withJobSpan<T>(
  name: string,
  carrier: Record<string, string> | undefined,
  attributes: SpanAttributes,
  fn: () => Promise<T>,
): Promise<T> {
  const parent = extractTraceContext(carrier);
  return tracer().startActiveSpan(name, { kind: SpanKind.CONSUMER, attributes: defined(attributes) }, parent, (span) =>
    fn().then(
      (value) => {
        span.end();
        return value;
      },
      (error: unknown) => {
        recordError(span, error);
        span.end();
        throw error;
      },
    ),
  );
}

function recordError(span: Span, error: unknown): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
}

function defined(attributes: SpanAttributes): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const [k, v] of Object.entries(attributes)) if (v !== undefined) out[k] = v;
  return out;
}

"""OpenTelemetry traces, as the Node worker makes them (``packages/shared/src/tracing.ts``): each run of a job is a
``CONSUMER`` span ``run <tool>``, the child of the gateway's tool-call span whose W3C context the job carries in its
data (``trace``), with the attributes ``taskrelay.task_id``, ``taskrelay.tool``, ``taskrelay.attempt`` and
``taskrelay.worker_id`` (a batch child: its parent's id as ``taskrelay.task_id``, and ``taskrelay.job_id``); an error
out of the run marks it ``ERROR``. Export (OTLP over HTTP) is set up only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; otherwise the API's no-op tracer is used."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .keys import parse_batch_child_id


class Tracing:
    """Whether spans are exported, and how to flush them and stop."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self.enabled = provider is not None

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def start_tracing(service_name: str, env: Mapping[str, str]) -> Tracing:
    """Exports traces as ``service_name`` (or ``OTEL_SERVICE_NAME``) when an OTLP endpoint is configured (the
    standard ``OTEL_*`` variables: endpoint, headers, ``OTEL_BSP_*`` batching). Call once per process."""
    if not env.get("OTEL_EXPORTER_OTLP_ENDPOINT") and not env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return Tracing()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return Tracing(provider)


def traced(process: Callable[[Any, str], Awaitable[Any]], worker_id: str) -> Callable[[Any, str], Awaitable[Any]]:
    """``process`` (the worker's processor) run inside each job's span."""

    async def run(job: Any, token: str) -> Any:
        data = job.data if isinstance(job.data, dict) else {}
        carrier = data.get("trace")
        parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        job_id = str(job.id)
        attempt = max(1, int(getattr(job, "attemptsStarted", 0) or 0) or job.attemptsMade + 1)
        child = isinstance(data.get("child"), int) or parse_batch_child_id(job_id) is not None
        attributes: dict[str, Any] = {"taskrelay.tool": job.name, "taskrelay.attempt": attempt}
        if child:
            parent_id = data.get("taskId")
            if isinstance(parent_id, str):
                attributes["taskrelay.task_id"] = parent_id
            attributes["taskrelay.job_id"] = job_id
        else:
            attributes["taskrelay.task_id"] = job_id
            attributes["taskrelay.worker_id"] = worker_id
        tracer = trace.get_tracer("taskrelay")
        with tracer.start_as_current_span(
            f"run {job.name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                return await process(job, token)
            except BaseException as error:
                span.set_status(Status(StatusCode.ERROR, str(error)))
                raise

    return run

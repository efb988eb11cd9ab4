"""The worker's Prometheus metrics (``WORKER_METRICS_PORT``), with the Node worker's names, types and labels
(``packages/worker/src/metrics.ts`` and the shared ``ProcessMetrics``; ``tests/test_metrics.py`` reads the Node source
and checks the two cannot drift). prometheus_client, the Prometheus project's own client, does the registry and the
text format. One registry per worker, as in Node. Node's ``nodejs_*`` runtime metrics have no Python counterpart;
the ``process_*`` ones do (prometheus_client's process collector, under the same ``taskrelay_worker_`` prefix)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .protocol import CANCEL

# prom-client writes no ``*_created`` series: neither does this worker (a process-wide switch of the library).
disable_created_metrics()

#: The Node worker's buckets (metrics.ts), in seconds.
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)
CANCEL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30)


class _Slots(Collector):
    """Busy and idle slots, read at scrape time (Node's ``watchSlots``)."""

    def __init__(self, busy: Callable[[], int], concurrency: int) -> None:
        self._busy = busy
        self._concurrency = concurrency

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "taskrelay_worker_slots", "Job slots of this worker (WORKER_CONCURRENCY), by state: busy or idle.", labels=["state"]
        )
        busy = self._busy()
        family.add_metric(["busy"], busy)
        family.add_metric(["idle"], max(0, self._concurrency - busy))
        yield family


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="taskrelay_worker", registry=self.registry)
        r = self.registry
        # prometheus_client writes a counter's name with its ``_total``; it is given without it.
        self.redis_errors = Counter(
            "taskrelay_redis_errors", "Errors reported by this process's Redis connections, by connection.", ["connection"], registry=r
        )
        self.redis_reconnects = Counter(
            "taskrelay_redis_reconnects",
            "Reconnect attempts of this process's Redis connections, by connection.",
            ["connection"],
            registry=r,
        )
        self.jobs_started = Counter(
            "taskrelay_worker_jobs_started",
            "Runs started by this worker, by tool (a retry or a takeover after a crash is a new run).",
            ["tool"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "taskrelay_queue_wait_seconds", "From enqueue to the first run starting, by tool.", ["tool"], buckets=WAIT_BUCKETS, registry=r
        )
        self.run_duration = Histogram(
            "taskrelay_worker_run_seconds",
            "One run of a tool's handler on this worker, from start to its slot being free, by tool.",
            ["tool"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.cancel_latency = Histogram(
            "taskrelay_worker_cancel_seconds",
            "From a run's signal aborting to its slot being free (how fast handlers honour a cancel), by reason.",
            ["reason"],
            buckets=CANCEL_BUCKETS,
            registry=r,
        )
        self.limit_waits = Counter(
            "taskrelay_worker_limit_waits",
            "Runs sent back to wait by a per-key or shared limit (PROTOCOL.md §3.5), by tool and limit (slot, rate).",
            ["tool", "limit"],
            registry=r,
        )
        self.back_offs = Counter(
            "taskrelay_worker_back_offs",
            "Runs that ended with RetryAfterError (or an upstream 429/503 with Retry-After): delayed, no attempt used.",
            ["tool"],
            registry=r,
        )
        self.progress_written = Counter(
            "taskrelay_worker_progress_writes", "Progress updates written to Redis (after the throttle).", registry=r
        )
        self.progress_coalesced = Counter(
            "taskrelay_worker_progress_coalesced",
            "ctx.progress() values merged by the worker's per-task throttle (a newer value replaced them).",
            registry=r,
        )
        # Registered for the same names on every worker; a Python tool fans out no batch yet (PROTOCOL.md §29.3).
        self.batch_children_released = Counter(
            "taskrelay_worker_batch_children_released",
            "Batch children whose jobs a parent added (PROTOCOL.md §26), by child tool.",
            ["tool"],
            registry=r,
        )
        self.batch_children = Counter(
            "taskrelay_worker_batch_children",
            "Batch children recorded by this worker, by child tool and outcome (completed, failed); each child once.",
            ["tool", "outcome"],
            registry=r,
        )

    def watch_slots(self, busy: Callable[[], int], concurrency: int) -> None:
        self.registry.register(_Slots(busy, concurrency))

    def run_started(self, job: Any) -> float:
        """Counts a run of ``job`` and, for its first run, its wait in the queue; the start time for ``run_ended``."""
        started = time.time()
        self.jobs_started.labels(job.name).inc()
        if job.attemptsMade == 0 and not getattr(job, "stalledCounter", 0):
            self.queue_wait.labels(job.name).observe(max(0.0, started - job.timestamp / 1000))
        return started

    def run_ended(self, tool: str, started: float, aborted_at: float | None, reason: str | None) -> None:
        """The run's slot is free: its duration, and how long it took to honour its abort (``aborted_at``: monotonic)."""
        self.run_duration.labels(tool).observe(time.time() - started)
        if aborted_at is not None:
            self.cancel_latency.labels(reason or CANCEL.CLIENT_CANCELLED).observe(time.monotonic() - aborted_at)

    def progress(self, what: str) -> None:
        """A run's progress value: ``written`` to Redis, or ``coalesced`` (replaced by a newer one before its write)."""
        (self.progress_written if what == "written" else self.progress_coalesced).inc()


class MetricsServer:
    """``GET /metrics`` in the Prometheus text format on ``host:port`` (a thread of prometheus_client's own server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

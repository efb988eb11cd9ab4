"""The Python worker's metrics have the Node worker's names, types and labels (issue 49 item 4, PROTOCOL.md §29.3):
the list is read from the Node source (``packages/worker/src/metrics.ts`` and the shared ``ProcessMetrics``), so the
two cannot drift. Each metric gets one value on its labels as Node names them (a label Python lacks raises), and the
``/metrics`` scrape of ``WORKER_METRICS_PORT``'s server is compared with the list."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from taskrelay_worker.config import ConfigError, load_config
from taskrelay_worker.metrics import MetricsServer, WorkerMetrics

ROOT = Path(__file__).resolve().parents[3]
NODE_SOURCES = [ROOT / "packages/worker/src/metrics.ts", ROOT / "packages/shared/src/metrics.ts"]


def node_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, label names), from each ``this.counter|histogram|gauge({ name: ..., labelNames: [...] })``."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for source in NODE_SOURCES:
        text = source.read_text()
        for match in re.finditer(r"this\.(counter|histogram|gauge)(?:<[^>]*>)?\(\{(.*?)\n\s*\}\)", text, re.S):
            kind, body = match.groups()
            name = re.search(r"name: '([^']+)'", body)
            assert name, body
            labels = re.search(r"labelNames: \[([^\]]*)\]", body)
            found[name.group(1)] = (kind, frozenset(re.findall(r"'([^']+)'", labels.group(1)) if labels else ()))
    return found


pytestmark = pytest.mark.skipif(not NODE_SOURCES[0].is_file(), reason="the Node worker's source is not beside this package")


def scrape(port: int) -> dict[str, tuple[str, frozenset[str]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    families: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = {name for sample in family.samples for name in sample.labels if name != "le"}
        # The parser names a counter without its _total; Node's source names it with.
        name = family.name + "_total" if family.type == "counter" else family.name
        families[name] = (family.type, frozenset(labels))
    return families


def test_node_list_is_read():
    node = node_metrics()
    assert node["taskrelay_worker_jobs_started_total"] == ("counter", frozenset({"tool"}))
    assert node["taskrelay_worker_slots"] == ("gauge", frozenset({"state"}))
    assert node["taskrelay_redis_errors_total"] == ("counter", frozenset({"connection"}))
    assert len(node) >= 13


def test_names_types_and_labels_are_the_node_workers():
    node = node_metrics()
    metrics = WorkerMetrics()
    metrics.watch_slots(lambda: 1, 4)
    by_name = {}
    for value in vars(metrics).values():
        if isinstance(value, (Counter, Histogram)):
            family = value.describe()[0]
            by_name[family.name + "_total" if family.type == "counter" else family.name] = value
    assert set(by_name) | {"taskrelay_worker_slots"} == set(node), "the Python worker's metrics are not Node's"
    for name, metric in by_name.items():
        kind, labels = node[name]
        child = metric.labels(**{label: "x" for label in labels}) if labels else metric
        child.inc() if kind == "counter" else child.observe(0.5)

    server = MetricsServer(metrics.registry, "127.0.0.1", 0)
    try:
        served = scrape(server.port)
    finally:
        server.close()
    ours = {name: value for name, value in served.items() if not name.startswith("taskrelay_worker_process_")}
    assert ours == node
    # Node's default process metrics, under the same prefix, where Python has them.
    assert {"taskrelay_worker_process_cpu_seconds_total", "taskrelay_worker_process_resident_memory_bytes"} <= set(served)


def test_slots_are_read_at_scrape_time():
    metrics = WorkerMetrics()
    busy = [0]
    metrics.watch_slots(lambda: busy[0], 4)
    server = MetricsServer(metrics.registry, "127.0.0.1", 0)
    try:
        busy[0] = 3
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    finally:
        server.close()
    assert 'taskrelay_worker_slots{state="busy"} 3.0' in text
    assert 'taskrelay_worker_slots{state="idle"} 1.0' in text


def test_metrics_port_is_read_and_bounded():
    base = {"REDIS_URL": "redis://127.0.0.1:6379", "TASKRELAY_TOOLS": "tools.py"}
    assert load_config(base).metrics_port is None
    config = load_config({**base, "WORKER_METRICS_PORT": "9464", "HOST": "::1"})
    assert (config.metrics_port, config.metrics_host) == (9464, "::1")
    with pytest.raises(ConfigError, match=r"^Invalid configuration: WORKER_METRICS_PORT must be at most 65535 \(got 70000\)$"):
        load_config({**base, "WORKER_METRICS_PORT": "70000"})

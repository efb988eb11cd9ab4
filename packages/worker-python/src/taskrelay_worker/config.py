"""The worker's configuration from the environment: the Node worker's variables, bounds and defaults
(``workerEnvSchema`` in packages/shared/src/config.ts). A bad value is one line, naming the variable."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlparse

from .log import LEVELS


class ConfigError(Exception):
    """A configuration the worker cannot start with: printed as one line, exit code 1."""


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: one server by URL, a Cluster by its seed nodes, or a master found through Sentinels."""

    url: str | None = None
    cluster_nodes: tuple[tuple[str, int], ...] = ()
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_name: str | None = None

    def describe(self) -> str:
        if self.cluster_nodes:
            return "the Redis Cluster at " + ",".join(f"{h}:{p}" for h, p in self.cluster_nodes)
        if self.sentinels:
            return f"master {self.sentinel_name} of the Sentinels at " + ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return str(self.url)


@dataclass(frozen=True)
class Config:
    redis_url: str
    prefix: str
    queue: str
    tools: str
    concurrency: int
    lock_duration_ms: int
    shutdown_grace_ms: int
    heartbeat_ms: int
    abort_grace_ms: int
    cancel_sweep_ms: int
    progress_interval_ms: int
    log_level: str
    redis: RedisTarget = RedisTarget()
    #: ``TASKRELAY_KEY_LAYOUT`` resolved (PROTOCOL.md §1.1): ``single`` or ``sharded``.
    key_layout: str = "single"
    #: ``TASKRELAY_WAITPOINT_SECRET``: seals waitpoint tokens (§32.2); None: the key kept in Redis.
    waitpoint_secret: str | None = None
    #: Bounds of task output, results by reference and artifacts (PROTOCOL.md §34), as the Node worker reads them.
    inline_result_bytes: int = 1024 * 1024
    max_output_bytes: int = 1024 * 1024
    blob_ttl_ms: int = 86_400_000
    max_task_bytes: int = 64 * 1024 * 1024
    max_principal_bytes: int = 1024 * 1024 * 1024
    #: ``WORKER_METRICS_PORT``: Prometheus ``/metrics`` on this port, on ``HOST``; None: no listener.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


def _nodes(name: str, raw: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        match = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+):(\d{1,5})", item)
        if not match or not 1 <= int(match.group(2)) <= 65_535:
            raise ConfigError(f"Invalid configuration: {name} must be a comma list of host:port (bad entry {item!r})")
        nodes.append((match.group(1).strip("[]"), int(match.group(2))))
    if not nodes:
        raise ConfigError(f"Invalid configuration: {name} must list at least one host:port")
    return tuple(nodes)


#: name -> (min, max, default)
_INTS: dict[str, tuple[int, int, int]] = {
    "WORKER_CONCURRENCY": (1, 10_000, 8),
    "WORKER_LOCK_DURATION_MS": (1_000, 3_600_000, 30_000),
    "WORKER_SHUTDOWN_GRACE_MS": (0, 86_400_000, 30_000),
    "WORKER_HEARTBEAT_MS": (100, 600_000, 5_000),
    "WORKER_ABORT_GRACE_MS": (0, 3_600_000, 5_000),
    "WORKER_CANCEL_SWEEP_MS": (50, 600_000, 2_000),
    "TASKRELAY_PROGRESS_INTERVAL_MS": (0, 60_000, 50),
    "TASKRELAY_INLINE_RESULT_BYTES": (1_024, 1024**3, 1024 * 1024),
    "TASKRELAY_MAX_OUTPUT_BYTES": (1_024, 512 * 1024**2, 1024 * 1024),
    "TASKRELAY_BLOB_TTL_MS": (1_000, 365 * 86_400_000, 86_400_000),
    "TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK": (1_024, 1024**4, 64 * 1024 * 1024),
    "TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL": (1_024, 1024**4, 1024**3),
    "WORKER_METRICS_PORT": (1, 65_535, 0),
}


def _int(env: Mapping[str, str], name: str) -> int:
    low, high, default = _INTS[name]
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if not re.fullmatch(r"-?\d+", raw):
        raise ConfigError(f"Invalid configuration: {name} must be a whole number (got {raw!r})")
    value = int(raw)
    if value < low:
        raise ConfigError(f"Invalid configuration: {name} must be at least {low} (got {value})")
    if value > high:
        raise ConfigError(f"Invalid configuration: {name} must be at most {high} (got {value})")
    return value


def load_config(env: Mapping[str, str]) -> Config:
    cluster = env.get("REDIS_CLUSTER_NODES", "").strip()
    sentinels = env.get("REDIS_SENTINELS", "").strip()
    redis_url = env.get("REDIS_URL", "").strip()
    target: RedisTarget
    if cluster:
        if sentinels:
            raise ConfigError("Invalid configuration: set REDIS_CLUSTER_NODES or REDIS_SENTINELS, not both")
        target = RedisTarget(cluster_nodes=_nodes("REDIS_CLUSTER_NODES", cluster))
    elif sentinels:
        name = env.get("REDIS_SENTINEL_NAME", "").strip()
        if not name:
            raise ConfigError("Invalid configuration: REDIS_SENTINEL_NAME (the master name) is required with REDIS_SENTINELS")
        target = RedisTarget(sentinels=_nodes("REDIS_SENTINELS", sentinels), sentinel_name=name)
    else:
        if not redis_url:
            raise ConfigError("Invalid configuration: REDIS_URL is required (for example redis://127.0.0.1:6379)")
        parsed = urlparse(redis_url)
        if parsed.scheme not in ("redis", "rediss") or not parsed.hostname or re.search(r"\s", redis_url):
            raise ConfigError("Invalid configuration: REDIS_URL must be a redis:// or rediss:// URL")
        target = RedisTarget(url=redis_url)
    prefix = env.get("TASKRELAY_PREFIX", "taskrelay").strip() or "taskrelay"
    if re.search(r"\s", prefix):
        raise ConfigError("Invalid configuration: TASKRELAY_PREFIX must not contain spaces")
    layout = env.get("TASKRELAY_KEY_LAYOUT", "auto").strip() or "auto"
    if layout not in ("auto", "single", "sharded"):
        raise ConfigError(f"Invalid configuration: TASKRELAY_KEY_LAYOUT must be one of auto, single, sharded (got {layout!r})")
    # As redis.ts `keyLayoutOf` and `clusterPrefixProblem` (PROTOCOL.md §1.1): `auto` is sharded on a Cluster with an
    # unbraced prefix; the sharded layout puts hash tags of its own after the prefix, the single one on a Cluster needs
    # the prefix to start with one.
    if layout == "auto":
        layout = "sharded" if target.cluster_nodes and not re.search(r"[{}]", prefix) else "single"
    bare = prefix.replace("{", "").replace("}", "") or "taskrelay"
    if layout == "sharded" and re.search(r"[{}]", prefix):
        raise ConfigError(
            "Invalid configuration: TASKRELAY_PREFIX must have no braces with the sharded key layout "
            f"(TASKRELAY_KEY_LAYOUT=sharded), e.g. {bare} (got {prefix!r})"
        )
    if layout == "single" and target.cluster_nodes and not re.fullmatch(r"\{[^{}]+\}.*", prefix):
        raise ConfigError(
            f"Invalid configuration: TASKRELAY_PREFIX must be wrapped in {{}} on a Redis Cluster with the single key "
            f"layout (one hash slot for every key), e.g. {{{bare}}}, or be unbraced with TASKRELAY_KEY_LAYOUT=auto "
            f"(got {prefix!r})"
        )
    queue = env.get("TASKRELAY_QUEUE", "default").strip() or "default"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", queue):
        raise ConfigError("Invalid configuration: TASKRELAY_QUEUE must be letters, digits, _ . or -")
    tools = env.get("TASKRELAY_TOOLS", "").strip()
    if not tools:
        raise ConfigError(
            "Invalid configuration: TASKRELAY_TOOLS is required (a .py file or a module name that defines tools)"
        )
    log_level = env.get("LOG_LEVEL", "info").strip() or "info"
    if log_level not in LEVELS:
        raise ConfigError(f"Invalid configuration: LOG_LEVEL must be one of {', '.join(LEVELS)} (got {log_level!r})")
    # Refused rather than ignored: a Python worker would keep the values in Redis where the deployment asked for S3.
    blob_store = env.get("TASKRELAY_BLOB_STORE", "").strip()
    if blob_store not in ("", "redis"):
        raise ConfigError(
            f"Invalid configuration: TASKRELAY_BLOB_STORE={blob_store} is not supported by the Python worker yet "
            "(it stores values in Redis; leave the variable unset for Python workers: gateways read both)"
        )
    metrics_port = None
    if env.get("WORKER_METRICS_PORT", "").strip():
        metrics_port = _int(env, "WORKER_METRICS_PORT")
    secret = env.get("TASKRELAY_WAITPOINT_SECRET")
    if secret is not None and len(secret) < 32:
        raise ConfigError("Invalid configuration: TASKRELAY_WAITPOINT_SECRET must be at least 32 characters")
    return Config(
        waitpoint_secret=secret,
        redis_url=redis_url or target.describe(),
        redis=target,
        prefix=prefix,
        key_layout=layout,
        queue=queue,
        tools=tools,
        concurrency=_int(env, "WORKER_CONCURRENCY"),
        lock_duration_ms=_int(env, "WORKER_LOCK_DURATION_MS"),
        shutdown_grace_ms=_int(env, "WORKER_SHUTDOWN_GRACE_MS"),
        heartbeat_ms=_int(env, "WORKER_HEARTBEAT_MS"),
        abort_grace_ms=_int(env, "WORKER_ABORT_GRACE_MS"),
        cancel_sweep_ms=_int(env, "WORKER_CANCEL_SWEEP_MS"),
        progress_interval_ms=_int(env, "TASKRELAY_PROGRESS_INTERVAL_MS"),
        log_level=log_level,
        inline_result_bytes=_int(env, "TASKRELAY_INLINE_RESULT_BYTES"),
        max_output_bytes=_int(env, "TASKRELAY_MAX_OUTPUT_BYTES"),
        blob_ttl_ms=_int(env, "TASKRELAY_BLOB_TTL_MS"),
        max_task_bytes=_int(env, "TASKRELAY_MAX_ARTIFACT_BYTES_PER_TASK"),
        max_principal_bytes=_int(env, "TASKRELAY_MAX_ARTIFACT_BYTES_PER_PRINCIPAL"),
        metrics_port=metrics_port,
        metrics_host=env.get("HOST", "").strip() or "127.0.0.1",
    )

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


#: name -> (min, max, default)
_INTS: dict[str, tuple[int, int, int]] = {
    "WORKER_CONCURRENCY": (1, 10_000, 8),
    "WORKER_LOCK_DURATION_MS": (1_000, 3_600_000, 30_000),
    "WORKER_SHUTDOWN_GRACE_MS": (0, 86_400_000, 30_000),
    "WORKER_HEARTBEAT_MS": (100, 600_000, 5_000),
    "WORKER_ABORT_GRACE_MS": (0, 3_600_000, 5_000),
    "WORKER_CANCEL_SWEEP_MS": (50, 600_000, 2_000),
    "TASKRELAY_PROGRESS_INTERVAL_MS": (0, 60_000, 50),
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
    for name in ("REDIS_CLUSTER_NODES", "REDIS_SENTINELS"):
        if env.get(name, "").strip():
            raise ConfigError(
                f"Invalid configuration: {name} is not supported by the Python worker yet "
                "(it connects to one Redis by REDIS_URL); run Node workers on a Cluster or Sentinel deployment"
            )
    redis_url = env.get("REDIS_URL", "").strip()
    if not redis_url:
        raise ConfigError("Invalid configuration: REDIS_URL is required (for example redis://127.0.0.1:6379)")
    parsed = urlparse(redis_url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname or re.search(r"\s", redis_url):
        raise ConfigError("Invalid configuration: REDIS_URL must be a redis:// or rediss:// URL")
    prefix = env.get("TASKRELAY_PREFIX", "taskrelay").strip() or "taskrelay"
    if re.search(r"\s", prefix):
        raise ConfigError("Invalid configuration: TASKRELAY_PREFIX must not contain spaces")
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
    return Config(
        redis_url=redis_url,
        prefix=prefix,
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
    )

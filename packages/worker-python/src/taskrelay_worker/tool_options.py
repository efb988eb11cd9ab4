"""The checks ``define_tool`` makes of each option (``define-tool.ts``'s schemas): a bad option is an error when the
tools module loads, naming the tool and the option."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from typing import Any

from .isolate import MIN_MEMORY_MB, Isolation
from .tool_definition import Handler

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_TASK_SUPPORT = ("forbidden", "optional", "required")
_VERSION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ON_VERSION_CHANGE = ("resume", "restart", "fail")


def _flag(tool: str, what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"tool {tool}: {what} must be true or false (got {value!r})")
    return value


def _positive(name: str, value: Any, *, low: int = 1, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {bound} (got {value!r})")


def _schema_of(tool_name: str, input_schema: Any) -> tuple[dict[str, Any], Any]:
    if input_schema is None:
        return {"type": "object", "properties": {}}, None
    if isinstance(input_schema, dict):
        if input_schema.get("type") != "object":
            raise ValueError(f"tool {tool_name}: input_schema must be a JSON Schema of type 'object'")
        json.dumps(input_schema)
        return input_schema, None
    if inspect.isclass(input_schema) and hasattr(input_schema, "model_json_schema"):
        return input_schema.model_json_schema(), input_schema
    raise ValueError(f"tool {tool_name}: input_schema must be a JSON Schema dict or a pydantic model class")


def _isolation_of(
    tool: str, run: Handler, isolate: Any, module: Any, max_memory_mb: Any, kill_grace_ms: Any
) -> Isolation | None:
    """The isolation options (Node's ``isolate``, ``module``, ``maxMemoryMb``, ``killGraceMs``), checked as Node does."""
    if isolate is False:
        stray = [n for n, v in (("module", module), ("max_memory_mb", max_memory_mb), ("kill_grace_ms", kill_grace_ms)) if v is not None]
        if stray:
            raise TypeError(f"tool {tool}: {', '.join(stray)} needs isolate=True")
        return None
    if isolate == "thread":
        raise ValueError(f"tool {tool}: isolate='thread' is Node's; a Python tool is isolated in a process (isolate=True)")
    if isolate is not True and isolate != "process":
        raise ValueError(f"tool {tool}: isolate must be True or 'process' (got {isolate!r})")
    if max_memory_mb is not None:
        _positive(f"tool {tool}: max_memory_mb", max_memory_mb, low=MIN_MEMORY_MB, high=1_048_576)
    if kill_grace_ms is not None:
        _positive(f"tool {tool}: kill_grace_ms", kill_grace_ms, low=0, high=600_000)
    if module is None:
        module = _module_of(run)
    if not isinstance(module, str) or not module:
        raise ValueError(f"tool {tool}: module must name the tools module (a .py path or a module name)")
    return Isolation(module, max_memory_mb, 5_000 if kill_grace_ms is None else kill_grace_ms)


def _module_of(run: Handler) -> str:
    """Where an isolated run's child loads the tool: the module that defines ``run`` by its name when it was imported
    by name, else its file (a ``TASKRELAY_TOOLS`` path is loaded under a name of its own)."""
    import sys

    name = getattr(run, "__module__", None) or ""
    loaded = sys.modules.get(name)
    if name and name != "__main__" and not name.startswith("taskrelay_tools_") and loaded is not None:
        return name
    path = inspect.getsourcefile(run)
    if path is None:
        raise ValueError("cannot tell which module defines the tool: pass module=")
    return path


#: Node's bounds for ``dedupe.ttlMs`` (define-tool.ts) and its default.
_DEDUPE_MAX_TTL_MS = 30 * 86_400_000
_DEDUPE_TTL_MS = 3_600_000


def _dedupe_of(tool: str, dedupe: Any) -> tuple[list[str] | None, int] | None:
    if dedupe is None or dedupe is False:
        return None
    if dedupe is True:
        return None, _DEDUPE_TTL_MS
    if not isinstance(dedupe, dict) or set(dedupe) - {"key", "ttl_ms"}:
        raise ValueError(f"tool {tool}: dedupe must be True or {{'key': [argument names], 'ttl_ms': ms}}, nothing else")
    key = _key_names(tool, "dedupe.key", dedupe["key"]) if "key" in dedupe else None
    ttl_ms = dedupe.get("ttl_ms", _DEDUPE_TTL_MS)
    _positive(f"tool {tool}: dedupe.ttl_ms", ttl_ms, high=_DEDUPE_MAX_TTL_MS)
    return key, ttl_ms


def _key_names(tool: str, what: str, key: Any) -> list[str]:
    """A limit's key: a non-empty list of argument names (a function cannot cross to the Node side's keys)."""
    if not isinstance(key, list) or not key or not all(isinstance(k, str) and k for k in key):
        raise ValueError(f"tool {tool}: {what} must be a non-empty list of argument names")
    return key


def _derived_version(name: str, schema: dict[str, Any], output_schema: dict[str, Any] | None, run: Handler) -> str:
    """The first 12 hex digits of SHA-256 over the name, the schemas and the handler's source (its bytecode when the
    source is not available): the same build gives the same version on every worker."""
    try:
        code = inspect.getsource(run)
    except (OSError, TypeError):
        code = getattr(getattr(run, "__code__", None), "co_code", b"").hex()
    text = json.dumps([name, schema, output_schema, code], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]

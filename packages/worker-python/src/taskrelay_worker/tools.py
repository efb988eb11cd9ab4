"""Tools in Python: ``define_tool(...)`` or the ``@tool(...)`` decorator, with the Node ``defineTool``'s options
under Python names. An option the worker does not know is a ``TypeError`` when the module loads, never ignored."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .isolate import IsolatedHandler
from .limits import RateLimit, SlotLimit
from .protocol import MAX_TOOL_SHARDS
from .tool_definition import Handler, ToolDefinition
from .tool_options import (
    _NAME,
    _ON_VERSION_CHANGE,
    _TASK_SUPPORT,
    _VERSION,
    _dedupe_of,
    _derived_version,
    _flag,
    _isolation_of,
    _key_names,
    _positive,
    _schema_of,
)
from .tool_result import to_tool_result

def define_tool(
    *,
    name: str,
    description: str,
    run: Handler,
    input_schema: Any = None,
    title: str | None = None,
    output_schema: dict[str, Any] | None = None,
    task_support: str = "optional",
    timeout_ms: int | None = None,
    attempts: int = 1,
    max_stalls: int = 10,
    input_timeout_ms: int = 86_400_000,
    concurrency: int | dict[str, Any] | None = None,
    rate_limit: dict[str, Any] | None = None,
    priority: int | None = None,
    version: str | None = None,
    on_version_change: str = "resume",
    dedupe: bool | dict[str, Any] | None = None,
    shards: int = 1,
    isolate: bool | str = False,
    module: str | None = None,
    max_memory_mb: int | None = None,
    kill_grace_ms: int | None = None,
) -> ToolDefinition:
    """A tool the worker serves. ``run`` is ``async def run(args, ctx)``; its return value becomes the result: a
    dict shaped like a ``CallToolResult`` (with ``content``) as it is, another dict as ``structuredContent`` plus a
    text copy, a string as text. ``concurrency`` is ``n``, or ``{"limit": n, "key": [argument names]}`` (per key,
    PROTOCOL.md §3.5). ``rate_limit`` is ``{"max": n, "per_ms": ms}``, with an optional ``"key"`` (argument names)
    and ``"name"`` (a budget shared by every tool of that name, in Node workers too). A keyed limit counts each
    principal's runs apart unless it has ``"across_principals": True`` (one limit per key value for everyone). ``version`` names the build of the
    tool (default: derived from its name, schemas and source) and ``on_version_change`` (``resume``, ``restart`` or
    ``fail``) what a run does with a task another version ran (PROTOCOL.md §12.11). ``dedupe`` (``True``, or
    ``{"key": [argument names], "ttl_ms": ms}``, both optional) makes a call that repeats an unfinished call of this
    tool by the same principal, in the same mode, join it instead of starting another, for at most ``ttl_ms`` after
    the first (default 1 h; PROTOCOL.md §25.2): the gateway decides, from the catalog, as for a Node tool. ``shards``
    (default 1) spreads the tool's calls over that many queues in the sharded key layout (PROTOCOL.md §1.1); every
    worker of the tool consumes all of them.
    ``isolate=True`` (or ``"process"``) runs each run in a child process (PROTOCOL.md §31, §29.5): ``max_memory_mb``
    (at least 64) bounds what the run allocates, ``kill_grace_ms`` (default 5000) is how long an aborted child may take
    to end before it is killed, and ``module`` (default: the module that defines ``run``) is where the child loads the
    tool from, as ``TASKRELAY_TOOLS`` names a module."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool name must be 1 to 128 of A-Z a-z 0-9 _ - . (got {name!r})")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"tool {name}: description must be a non-empty string")
    if not inspect.iscoroutinefunction(run):
        raise TypeError(f"tool {name}: run must be an async function: async def run(args, ctx)")
    if task_support not in _TASK_SUPPORT:
        raise ValueError(f"tool {name}: task_support must be one of {', '.join(_TASK_SUPPORT)} (got {task_support!r})")
    if timeout_ms is not None:
        _positive(f"tool {name}: timeout_ms", timeout_ms)
    _positive(f"tool {name}: attempts", attempts, high=100)
    _positive(f"tool {name}: max_stalls", max_stalls, low=0, high=1000)
    _positive(f"tool {name}: input_timeout_ms", input_timeout_ms)
    slot: SlotLimit | None = None
    if isinstance(concurrency, dict):
        if set(concurrency) - {"limit", "key", "across_principals"} or "limit" not in concurrency:
            raise ValueError(
                f"tool {name}: concurrency must be n or {{'limit': n, 'key': [argument names]}}, "
                "with 'across_principals' optional"
            )
        _positive(f"tool {name}: concurrency.limit", concurrency["limit"])
        across = _flag(name, "concurrency.across_principals", concurrency.get("across_principals", False))
        if "key" in concurrency:
            slot = SlotLimit(concurrency["limit"], _key_names(name, "concurrency.key", concurrency["key"]), across)
        concurrency = concurrency["limit"] if slot is None else None
    elif concurrency is not None:
        _positive(f"tool {name}: concurrency", concurrency)
    limit: tuple[int, int] | None = None
    rate: RateLimit | None = None
    if rate_limit is not None:
        if not isinstance(rate_limit, dict) or not {"max", "per_ms"} <= set(rate_limit) or set(rate_limit) - {
            "max",
            "per_ms",
            "key",
            "name",
            "across_principals",
        }:
            raise ValueError(
                f"tool {name}: rate_limit must be {{'max': n, 'per_ms': ms}}, with 'key', 'name' and "
                "'across_principals' optional, and nothing else"
            )
        _positive(f"tool {name}: rate_limit.max", rate_limit["max"])
        _positive(f"tool {name}: rate_limit.per_ms", rate_limit["per_ms"])
        shared = rate_limit.get("name")
        if shared is not None and (not isinstance(shared, str) or not _NAME.match(shared)):
            raise ValueError(f"tool {name}: rate_limit.name must be 1 to 128 of A-Z a-z 0-9 _ - . (got {shared!r})")
        if "key" in rate_limit or shared is not None:
            key = _key_names(name, "rate_limit.key", rate_limit["key"]) if "key" in rate_limit else None
            scope = f"name:{shared}" if shared is not None else f"tool:{name}"
            across = _flag(name, "rate_limit.across_principals", rate_limit.get("across_principals", False))
            rate = RateLimit(rate_limit["max"], rate_limit["per_ms"], scope, key, key is None or across)
        else:
            # Counted exactly by the worker and paced by bullmq's limiter of the tool's queue (§3.3).
            limit = (rate_limit["max"], rate_limit["per_ms"])
            rate = RateLimit(rate_limit["max"], rate_limit["per_ms"], f"tool:{name}", None, True, paced=True)
    if priority is not None:
        _positive(f"tool {name}: priority", priority, high=5)
    if version is not None and (not isinstance(version, str) or not _VERSION.match(version)):
        raise ValueError(f"tool {name}: version must be 1 to 64 of A-Z a-z 0-9 _ - . (got {version!r})")
    if on_version_change not in _ON_VERSION_CHANGE:
        raise ValueError(f"tool {name}: on_version_change must be one of {', '.join(_ON_VERSION_CHANGE)}")
    _positive(f"tool {name}: shards", shards, high=MAX_TOOL_SHARDS)
    deduped = _dedupe_of(name, dedupe)
    isolation = _isolation_of(name, run, isolate, module, max_memory_mb, kill_grace_ms)
    schema, model = _schema_of(name, input_schema)
    properties = set((schema.get("properties") or {}).keys()) if isinstance(schema, dict) else set()
    for what, names in (
        ("concurrency.key", slot.key if slot else None),
        ("rate_limit.key", rate.key if rate else None),
        ("dedupe.key", deduped[0] if deduped else None),
    ):
        unknown = [n for n in names or [] if n not in properties]
        if unknown:
            raise ValueError(f"tool {name}: {what} names {', '.join(unknown)}, which input_schema does not")
    return ToolDefinition(
        name=name,
        description=description,
        input_schema=schema,
        run=run if isolation is None else IsolatedHandler(name, isolation, run),
        model=model,
        title=title,
        output_schema=output_schema,
        task_support=task_support,
        timeout_ms=timeout_ms,
        attempts=attempts,
        max_stalls=max_stalls,
        input_timeout_ms=input_timeout_ms,
        concurrency=concurrency,
        rate_limit=limit,
        admitted_slot=slot,
        admitted_rate=rate,
        priority=priority,
        version=version or _derived_version(name, schema, output_schema, run),
        on_version_change=on_version_change,
        dedupe=deduped,
        shards=shards,
        isolation=isolation,
    )


def tool(**options: Any) -> Callable[[Handler], ToolDefinition]:
    """``define_tool`` as a decorator: ``@tool(name="train", description="...")`` over ``async def run(args, ctx)``."""

    def wrap(run: Handler) -> ToolDefinition:
        return define_tool(run=run, **options)

    return wrap


def collect_tools(namespace: dict[str, Any]) -> list[ToolDefinition]:
    """The tools a module defines: its ``TOOLS`` list when it has one, else every ``ToolDefinition`` it holds."""
    listed = namespace.get("TOOLS")
    if listed is not None:
        tools = list(listed)
        for entry in tools:
            if not isinstance(entry, ToolDefinition):
                raise TypeError(f"TOOLS must hold tool definitions made by define_tool or @tool (got {entry!r})")
    else:
        tools = [value for value in namespace.values() if isinstance(value, ToolDefinition)]
    if not tools:
        raise ValueError("defines no tools (define_tool(...) or @tool(...) at module level, or a TOOLS list)")
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"defines tool {', '.join(duplicates)} more than once")
    return tools


__all__ = ["Handler", "ToolDefinition", "collect_tools", "define_tool", "to_tool_result", "tool"]

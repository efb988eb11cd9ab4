"""Tools in Python: ``define_tool(...)`` or the ``@tool(...)`` decorator, with the Node ``defineTool``'s options
under Python names. An option the worker does not know is a ``TypeError`` when the module loads, never ignored."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .errors import NonRetryableError
from .isolate import MIN_MEMORY_MB, IsolatedHandler, Isolation
from .limits import RateLimit, SlotLimit
from .protocol import MAX_TOOL_SHARDS

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_TASK_SUPPORT = ("forbidden", "optional", "required")
_VERSION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ON_VERSION_CHANGE = ("resume", "restart", "fail")

Handler = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Handler
    #: The pydantic model arguments are validated with (and passed as), when ``input_schema`` was one.
    model: Any = None
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    task_support: str = "optional"
    timeout_ms: int | None = None
    attempts: int = 1
    max_stalls: int = 10
    input_timeout_ms: int = 86_400_000
    concurrency: int | None = None
    rate_limit: tuple[int, int] | None = None
    #: Limits the worker admits runs by (PROTOCOL.md §3.5): per key of the arguments, or a rate shared by name.
    admitted_slot: SlotLimit | None = None
    admitted_rate: RateLimit | None = None
    priority: int | None = None
    #: The tool's version (PROTOCOL.md §12.11): explicit, or derived from its name, schemas and source.
    version: str = ""
    on_version_change: str = "resume"
    #: Calls that repeat an unfinished one join it (PROTOCOL.md §25.2): the argument names (None: all) and how long.
    dedupe: tuple[list[str] | None, int] | None = None
    #: How many queues (tool shards) its calls spread over in the sharded key layout (PROTOCOL.md §1.1).
    shards: int = 1
    #: Runs in a child process per run (PROTOCOL.md §31, §29.5); ``run`` is then the ``IsolatedHandler``.
    isolation: Isolation | None = None

    def descriptor(self) -> dict[str, Any]:
        """The tool as the catalog lists it (``ToolDescriptorSchema``, PROTOCOL.md §3.1)."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "taskSupport": self.task_support,
            "attempts": self.attempts,
            "maxStalls": self.max_stalls,
        }
        if self.title is not None:
            out["title"] = self.title
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        if self.timeout_ms is not None:
            out["timeoutMs"] = self.timeout_ms
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.admitted_slot is not None:
            out["concurrency"] = self.admitted_slot.limit
            out["concurrencyKey"] = self.admitted_slot.key
        if self.rate_limit is not None:
            out["rateLimit"] = {"max": self.rate_limit[0], "perMs": self.rate_limit[1]}
        if self.admitted_rate is not None:
            rate = self.admitted_rate
            out["rateLimit"] = {"max": rate.max, "perMs": rate.per_ms}
            if rate.key:
                out["rateLimit"]["key"] = rate.key
            if rate.scope.startswith("name:"):
                out["rateLimit"]["name"] = rate.scope[5:]
        if self.priority is not None:
            out["priority"] = self.priority
        if self.dedupe is not None:
            key, ttl_ms = self.dedupe
            out["dedupe"] = {"ttlMs": ttl_ms} if key is None else {"key": key, "ttlMs": ttl_ms}
        if self.shards > 1:
            out["shards"] = self.shards
        out["version"] = self.version
        if self.on_version_change != "resume":
            out["onVersionChange"] = self.on_version_change
        return out

    def parse_arguments(self, arguments: dict[str, Any]) -> Any:
        """The handler's ``args``: the pydantic model's instance, or the arguments as given (the gateway already
        validated them against ``input_schema``)."""
        if self.model is None:
            return arguments
        from pydantic import ValidationError

        try:
            return self.model.model_validate(arguments)
        except ValidationError as error:
            issues = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"] for e in error.errors()
            )
            raise NonRetryableError(f"Invalid arguments for tool {self.name}: {issues}") from None


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
            limit = (rate_limit["max"], rate_limit["per_ms"])
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


def tool(**options: Any) -> Callable[[Handler], ToolDefinition]:
    """``define_tool`` as a decorator: ``@tool(name="train", description="...")`` over ``async def run(args, ctx)``."""

    def wrap(run: Handler) -> ToolDefinition:
        return define_tool(run=run, **options)

    return wrap


def to_tool_result(tool_def: ToolDefinition, value: Any) -> dict[str, Any]:
    """What a handler returned, as a ``CallToolResult`` (the Node worker's ``toToolResult``)."""
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        for item in value["content"]:
            if not isinstance(item, dict) or not isinstance(item.get("type"), str):
                raise NonRetryableError(f"Tool {tool_def.name} returned an invalid result: each content item needs a type")
        return value
    if value is None:
        return {"content": []}
    if hasattr(value, "model_dump") and callable(value.model_dump):
        value = value.model_dump(mode="json")
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise NonRetryableError(f"Tool {tool_def.name} returned a value that is not JSON: {error}") from None
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


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

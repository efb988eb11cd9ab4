"""A tool as the worker holds it (``tool-definition.ts``): its options after ``define_tool`` checked them, the
descriptor the catalog lists, and how its arguments reach the handler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .errors import NonRetryableError
from .isolate import Isolation
from .limits import RateLimit, SlotLimit

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

"""The worker's side of an isolated run (PROTOCOL.md §31, §29.5): a tool defined with ``isolate=True`` runs each run
in a child process (``python -m taskrelay_worker.isolate_child``, started with ``asyncio.create_subprocess_exec``), so
a CPU-bound or memory-hungry handler never blocks the worker's event loop, which renews the job locks. The child's
``ctx`` calls are carried out on the run's real ``ToolContext``; an abort is sent on, and the child killed when it does
not end within ``kill_grace_ms``; its memory is bounded (``max_memory_mb``). The run's outcome is what the handler
returned or raised in the child, or the error its child's end stands for, with the Node worker's messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .isolated_run import IsolatedRun, MemoryLimitError

#: Node's bounds (define-tool.ts): ``max_memory_mb`` at least 64; ``kill_grace_ms`` default 5 s.
MIN_MEMORY_MB = 64
DEFAULT_KILL_GRACE_MS = 5_000


@dataclass(frozen=True)
class Isolation:
    #: The tools module the child loads the tool from: a ``.py`` path or a module name (``TASKRELAY_TOOLS``'s forms).
    module: str
    max_memory_mb: int | None = None
    kill_grace_ms: int = DEFAULT_KILL_GRACE_MS


def check_isolated_tools(tools: list[Any], load: Any) -> None:
    """The start check of isolated tools (PROTOCOL.md §31.1): each one's module loads and defines it, so its child can
    load it. ``load`` is ``__main__.load_tools``; raises its ``ConfigError``, or a ValueError naming the tool."""
    for tool in tools:
        isolation = getattr(tool, "isolation", None)
        if isolation is None:
            continue
        if not any(t.name == tool.name for t in load(isolation.module)):
            raise ValueError(
                f"Tool {tool.name} is isolated, but its module {isolation.module} defines no tool of that name "
                "(define it there, or give the module that does as module=)"
            )


class IsolatedHandler:
    """The ``run`` of an isolated tool: runs ``handler`` (its own ``run``) in a child per run."""

    def __init__(self, name: str, isolation: Isolation, handler: Any) -> None:
        self.name = name
        self.isolation = isolation
        self.handler = handler

    async def __call__(self, args: Any, ctx: Any) -> Any:
        return await IsolatedRun(self.name, self.isolation, ctx).run(args)


__all__ = ["DEFAULT_KILL_GRACE_MS", "MIN_MEMORY_MB", "IsolatedHandler", "Isolation", "MemoryLimitError", "check_isolated_tools"]

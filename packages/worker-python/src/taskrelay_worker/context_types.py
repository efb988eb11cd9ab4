"""The pieces of a run's ``ctx`` the engine holds too (``context-types.ts``): its suspension, its cancellation, its
durable state."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import ToolContext


@dataclass
class Suspension:
    kind: str  # "input" or "time"
    until: int  # ms since epoch
    n: int = 0
    #: The waitpoint a timed suspension waits on (§32.3): the worker re-reads it after delaying the job.
    waitpoint: str | None = None
    #: The run waits for its batch's children (§26.3 step 3): the worker re-checks the batch after delaying the job.
    batch: bool = False


@dataclass
class _Ask:
    n: int
    position: int
    key: str | None
    method: str
    params: dict[str, Any]
    future: asyncio.Future


class RunSignal:
    """The run's cancellation: set once, with its reason (the engine sets it; tools read it through ``ctx``)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None

    def abort(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.event.set()

    @property
    def aborted(self) -> bool:
        return self.reason is not None


class ToolState:
    """Durable per-task state (§12.1): what a resumed run needs to skip work already done."""

    def __init__(self, ctx: "ToolContext", value: Any) -> None:
        self._ctx = ctx
        self._value = value

    def get(self) -> Any:
        return self._value

    async def set(self, value: Any) -> None:
        self._ctx._check_running()
        await self._ctx._write_durable("state", value)
        self._value = json.loads(json.dumps(value))

"""What crosses between the worker and the child of an isolated run (PROTOCOL.md §31.2, §29.5): JSON lines, one
message a line, both ways; the child's messages are checked on arrival (pydantic), since the child runs a tool's code.
Errors cross as their fields and are made again on the other side (``to_wire_error`` / ``from_wire_error``)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter

from .errors import NonRetryableError, RetryAfterError, SuspendedError, TaskCancelledError, TaskrelayError
from .protocol import ERROR

#: The ``ctx`` members that are calls answered by the worker (Node's ISOLATE_CALLS, in snake_case).
ISOLATE_CALLS = (
    "elicit",
    "sample",
    "list_roots",
    "suspend",
    "tag",
    "state.set",
    "step",
    "fan_out",
    "batch_outcomes",
    "waitpoint",
    "waitpoint.wait",
    "output.write",
    "output.set",
    "artifact",
)
LOG_LEVEL_NAMES = ("trace", "debug", "info", "warn", "error", "fatal")


class WireError(BaseModel):
    name: str
    message: str
    code: str | None = None
    data: dict[str, Any] | None = None
    reason: str | None = None
    retry_after: float | None = None


class Settled(BaseModel):
    ok: bool
    value: Any = None
    error: WireError | None = None


class ProgressMessage(BaseModel):
    t: Literal["progress"]
    progress: float
    total: float | None = None
    message: str | None = None


class NotifyMessage(BaseModel):
    t: Literal["notify"]
    level: str
    data: Any = None
    logger: str | None = None


class LogMessage(BaseModel):
    t: Literal["log"]
    level: Literal["trace", "debug", "info", "warn", "error", "fatal"]
    msg: str
    fields: dict[str, Any] = Field(default_factory=dict)


class CallMessage(BaseModel):
    t: Literal["call"]
    id: int
    method: Literal[ISOLATE_CALLS]  # type: ignore[valid-type]
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class InvokedMessage(BaseModel):
    t: Literal["invoked"]
    id: int
    settled: Settled


class EndMessage(BaseModel):
    t: Literal["end"]
    settled: Settled


ChildMessage = Annotated[
    Union[ProgressMessage, NotifyMessage, LogMessage, CallMessage, InvokedMessage, EndMessage], Field(discriminator="t")
]
CHILD_MESSAGE: TypeAdapter[Any] = TypeAdapter(ChildMessage)


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line. A value that is not JSON fails here, in the side that sent it."""
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode()


def to_wire_error(error: BaseException) -> dict[str, Any]:
    wire: dict[str, Any] = {"name": type(error).__name__, "message": str(error)}
    if isinstance(error, TaskrelayError):
        wire["code"] = error.code
        if isinstance(error.data, dict):
            wire["data"] = error.data
    if isinstance(error, TaskCancelledError):
        wire["reason"] = error.reason
    if isinstance(error, RetryAfterError):
        wire["retry_after"] = error.retry_after
    return wire


def from_wire_error(wire: WireError) -> BaseException:
    """The error again, as the engine's ``settle`` branches on it: suspension, cancel, back-off, a taskrelay code;
    anything else an ``Exception`` with the same message (its class named in the message when it is not one)."""
    if wire.name == "SuspendedError":
        return SuspendedError()
    if wire.name == "TaskCancelledError" and wire.reason:
        return TaskCancelledError(wire.reason)
    if wire.name == "RetryAfterError" and wire.retry_after is not None:
        return RetryAfterError(wire.retry_after, wire.message)
    if wire.name == "NonRetryableError" or wire.code == ERROR.NON_RETRYABLE:
        return NonRetryableError(wire.message)
    if wire.code is not None:
        return TaskrelayError(wire.code, wire.message, wire.data)
    return _named(wire.name)(wire.message or wire.name)


_CLASSES: dict[str, type] = {}


def _named(name: str) -> type:
    """An ``Exception`` subclass of the child's error's class name, so its logs and its message read the same."""
    if not name.isidentifier():
        return RuntimeError
    found = _CLASSES.get(name)
    if found is None:
        found = type(name, (RuntimeError,), {})
        _CLASSES[name] = found
    return found

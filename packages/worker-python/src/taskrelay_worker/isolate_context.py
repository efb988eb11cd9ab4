"""``ctx`` in an isolated run's child (PROTOCOL.md §31.2), as Node's ``engine/isolate-context.ts``: a proxy whose
members are messages to the worker, where the run's real ``ToolContext`` does the work. Nothing here talks to Redis."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import math
import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from .errors import TaskCancelledError
from .isolate_messages import to_wire_error
from .log import LEVELS, Logger
from .protocol import CANCEL

if TYPE_CHECKING:
    from .isolate_child import _Channel

_NOTIFY_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_MAX_NOTIFY_BYTES = 65_536


class _State:
    def __init__(self, ctx: "ChildContext", value: Any) -> None:
        self._ctx = ctx
        self._value = value

    def get(self) -> Any:
        return self._value

    async def set(self, value: Any) -> None:
        await self._ctx._call("state.set", [value])
        self._value = json.loads(json.dumps(value))


class _Output:
    def __init__(self, ctx: "ChildContext") -> None:
        self._ctx = ctx

    async def write(self, chunk: str) -> None:
        await self._ctx._call("output.write", [chunk])

    async def set(self, snapshot: str) -> None:  # noqa: A003 - the Node API's name
        await self._ctx._call("output.set", [snapshot])


class _Waitpoint:
    def __init__(self, ctx: "ChildContext", fields: dict[str, Any]) -> None:
        self._ctx = ctx
        self.name = fields["name"]
        self.url = fields["url"]
        self.timeout_at = datetime.fromtimestamp(int(fields["timeoutAt"]) / 1000, tz=timezone.utc)

    async def wait(self) -> dict[str, Any]:
        return await self._ctx._call("waitpoint.wait", [self.name])


class ChildContext:
    """``ctx`` in the child: a proxy whose members are messages to the worker, where the run's real ``ToolContext``
    does the work (§31.2). ``sleep``, ``cancelled``, ``throw_if_cancelled`` are the child's own (the worker sends
    ``abort``); ``state.get()``, ``answers`` and the run's names are copies."""

    def __init__(self, start: dict[str, Any], channel: _Channel) -> None:
        self._channel = channel
        self.task_id: str = start["taskId"]
        self.tool: str = start["tool"]
        self.attempt: int = start["attempt"]
        self._answers: dict[str, Any] = dict(start.get("answers") or {})
        self.state = _State(self, start.get("state"))
        self.output = _Output(self)
        level = start.get("logLevel") if start.get("logLevel") in LEVELS else "info"
        self.log = Logger(level, stream=open(os.devnull, "w"), sink=self._log_line)  # noqa: SIM115 - lives with the run
        self._abort = asyncio.Event()
        self._reason: str | None = None
        self._next = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._steps: dict[int, Callable[[], Any]] = {}
        self._last_progress: float | None = None

    # The worker's messages ---------------------------------------------------------------------------------------

    def receive(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == "abort":
            if self._reason is None:
                self._reason = str(message.get("reason") or CANCEL.CLIENT_CANCELLED)
                self._abort.set()
        elif kind == "reply":
            if isinstance(message.get("answers"), dict):
                self._answers = dict(message["answers"])
            future = self._pending.pop(int(message.get("id", -1)), None)
            if future is not None and not future.done():
                future.set_result(message.get("settled") or {})
        elif kind == "invoke":
            asyncio.ensure_future(self._invoke(int(message.get("id", -1))))

    async def _invoke(self, call_id: int) -> None:
        fn = self._steps.pop(call_id, None)
        try:
            if fn is None:
                raise RuntimeError("ctx.step: no function for this step")
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            settled: dict[str, Any] = {"ok": True, "value": value}
        except Exception as error:  # noqa: BLE001 - the step's error goes to the worker's ctx.step
            settled = {"ok": False, "error": to_wire_error(error)}
        self._channel.send({"t": "invoked", "id": call_id, "settled": settled})

    async def _call(self, method: str, args: list[Any], kwargs: dict[str, Any] | None = None, step: Any = None) -> Any:
        self._next += 1
        call_id = self._next
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        if step is not None:
            self._steps[call_id] = step
        self._channel.send({"t": "call", "id": call_id, "method": method, "args": args, "kwargs": kwargs or {}})
        settled = await future
        if settled.get("ok"):
            return settled.get("value")
        from .isolate_messages import WireError, from_wire_error

        raise from_wire_error(WireError.model_validate(settled.get("error") or {"name": "Error", "message": "?"}))

    def _log_line(self, level: str, msg: str, fields: dict[str, Any]) -> None:
        safe = json.loads(json.dumps(fields, default=str))
        self._channel.send({"t": "log", "level": level, "msg": msg, "fields": safe})

    # Local members -------------------------------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    @property
    def cancel_reason(self) -> str | None:
        return self._reason

    def throw_if_cancelled(self) -> None:
        if self._reason is not None:
            raise TaskCancelledError(self._reason)

    async def sleep(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"ctx.sleep needs a finite, non-negative number of seconds (got {seconds!r})")
        self.throw_if_cancelled()
        try:
            await asyncio.wait_for(self._abort.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        self.throw_if_cancelled()

    @property
    def answers(self) -> dict[str, Any]:
        return dict(self._answers)

    # Messages without an answer ------------------------------------------------------------------------------------

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        for name, value in (("progress", done), ("total", total)):
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise ValueError(f"{name} must be a finite number (got {value!r})")
        if self._last_progress is not None and done <= self._last_progress:
            return
        self._last_progress = done
        out: dict[str, Any] = {"t": "progress", "progress": done}
        if total is not None:
            out["total"] = total
        if message is not None:
            out["message"] = str(message)
        self._channel.send(out)

    async def notify(self, level: str, data: Any, logger: str | None = None) -> None:
        if level not in _NOTIFY_LEVELS:
            raise ValueError(f"ctx.notify: level must be one of {', '.join(_NOTIFY_LEVELS)} (got {level!r})")
        if len(json.dumps(data, ensure_ascii=False).encode()) > _MAX_NOTIFY_BYTES:
            raise ValueError(f"ctx.notify: data is over {_MAX_NOTIFY_BYTES} bytes as JSON")
        out: dict[str, Any] = {"t": "notify", "level": level, "data": data}
        if logger is not None:
            out["logger"] = logger
        self._channel.send(out)

    # Calls the worker answers --------------------------------------------------------------------------------------

    async def elicit(self, message: str, requested_schema: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        return await self._call("elicit", [message, requested_schema], {"key": key})

    async def sample(self, messages: list[dict[str, Any]], max_tokens: int, *, key: str | None = None, **params: Any) -> dict[str, Any]:
        return await self._call("sample", [messages, max_tokens], {"key": key, **params})

    async def list_roots(self, *, key: str | None = None) -> dict[str, Any]:
        return await self._call("list_roots", [], {"key": key})

    async def suspend(self, seconds: float) -> None:
        await self._call("suspend", [seconds])

    async def tag(self, *tags: str) -> None:
        await self._call("tag", list(tags))

    async def step(self, name: str, fn: Callable[[], Any], *, version: str | None = None) -> Any:
        if not callable(fn):
            raise TypeError("ctx.step needs a function")
        return await self._call("step", [name], {"version": version}, step=fn)

    async def fan_out(self, items: list[dict[str, Any]], *, tool: str, concurrency: int = 64, fail_fast: bool = False) -> dict[str, Any]:
        return await self._call("fan_out", [items], {"tool": tool, "concurrency": concurrency, "fail_fast": fail_fast})

    async def batch_outcomes(self, start: int, count: int) -> list[dict[str, Any]]:
        return await self._call("batch_outcomes", [start, count])

    async def waitpoint(self, name: str, *, timeout_ms: int | None = None) -> _Waitpoint:
        return _Waitpoint(self, await self._call("waitpoint", [name], {"timeout_ms": timeout_ms}))

    async def artifact(self, name: str, data: Any, mime_type: str) -> dict[str, Any]:
        """A stream cannot cross: it is read to its end here first (bytes cross as base64)."""
        if hasattr(data, "__aiter__"):
            parts = [part.encode() if isinstance(part, str) else bytes(part) async for part in data]
            data = b"".join(parts)
        if isinstance(data, (bytes, bytearray)):
            return await self._call("artifact", [name, {"base64": base64.b64encode(bytes(data)).decode()}, mime_type])
        return await self._call("artifact", [name, data, mime_type])

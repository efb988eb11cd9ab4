"""An isolated run's ``ctx`` calls (PROTOCOL.md §31.2): each member the child calls is carried out on the run's real
``ToolContext`` and its answer (or error) sent back by its id; a step's function runs in the child, asked for by the
real ``ctx.step``."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from .errors import SuspendedError
from .isolate_messages import CallMessage, to_wire_error

#: The members whose answer carries the run's answers back (the questions, §12.3).
_ASKED = ("elicit", "sample", "list_roots", "fan_out")


class ChildCalls:
    """The call members of ``IsolatedRun`` (a mixin over its context, its waitpoints and steps, and ``_post``)."""

    ctx: Any
    waitpoints: dict[str, Any]
    steps: dict[int, asyncio.Future]

    def _post(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def _kill_after_grace(self, kind: str, reason: str) -> None:
        raise NotImplementedError

    async def _call(self, message: CallMessage) -> None:
        """A ``ctx`` call of the child, carried out on the real context; its answer (or error) goes back by its id."""
        try:
            reply: dict[str, Any] = {"ok": True, "value": await self._dispatch(message)}
        except (Exception, SuspendedError) as error:  # noqa: BLE001 - every error crosses back
            reply = {"ok": False, "error": to_wire_error(error)}
        out: dict[str, Any] = {"t": "reply", "id": message.id, "settled": reply}
        if message.method in _ASKED:
            out["answers"] = self.ctx.answers
        try:
            self._post(out)
        except (TypeError, ValueError) as error:
            self._post({"t": "reply", "id": message.id, "settled": {"ok": False, "error": to_wire_error(error)}})
        # The run suspended (§12.7): what the handler does after it is discarded, so the child gets its grace.
        if self.ctx.suspension is not None:
            self._kill_after_grace("suspended", "")

    async def _dispatch(self, message: CallMessage) -> Any:
        ctx, a, k = self.ctx, message.args, message.kwargs
        method = message.method
        if method == "elicit":
            return await ctx.elicit(*a, **k)
        if method == "sample":
            return await ctx.sample(*a, **k)
        if method == "list_roots":
            return await ctx.list_roots(**k)
        if method == "suspend":
            return await ctx.suspend(*a)
        if method == "tag":
            return await ctx.tag(*a)
        if method == "state.set":
            return await ctx.state.set(*a)
        if method == "step":
            return await ctx.step(a[0], lambda: self._run_step(message.id), **k)
        if method == "fan_out":
            return await ctx.fan_out(*a, **k)
        if method == "batch_outcomes":
            return await ctx.batch_outcomes(*a)
        if method == "waitpoint":
            waitpoint = await ctx.waitpoint(*a, **k)
            self.waitpoints[waitpoint.name] = waitpoint
            return {"name": waitpoint.name, "url": waitpoint.url, "timeoutAt": int(waitpoint.timeout_at.timestamp() * 1000)}
        if method == "waitpoint.wait":
            found = self.waitpoints.get(a[0] if a else "")
            if found is None:
                raise TypeError(f"ctx.waitpoint {a[0] if a else '?'} was not opened in this run")
            return await found.wait()
        if method == "output.write":
            return await ctx.output.write(*a)
        if method == "output.set":
            return await ctx.output.set(*a)
        if method == "artifact":
            name, data, mime_type = (a + [None, None, None])[:3]
            if isinstance(data, dict) and isinstance(data.get("base64"), str):
                data = base64.b64decode(data["base64"])
            return await ctx.artifact(name, data, mime_type)
        raise TypeError(f"isolated run: no ctx member {method}")

    def _run_step(self, call_id: int) -> Any:
        """The real ``ctx.step`` runs the step's function by asking the child to run it (§31.2)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.steps[call_id] = future
        self._post({"t": "invoke", "id": call_id})
        return future

"""The worker's side of one isolated run (PROTOCOL.md §31, §29.5), as Node's ``engine/isolated-run.ts``: the child
is started (``python -m taskrelay_worker.isolate_child``), its messages carried out on the run's real ``ToolContext``
(isolate_calls.py), an abort sent on and the child killed when it does not end within ``kill_grace_ms``. The run's
outcome is what the handler returned or raised in the child, or the error its child's end stands for."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .errors import NonRetryableError, SuspendedError, TaskCancelledError, TaskrelayError
from .isolate_calls import ChildCalls
from .isolate_messages import CHILD_MESSAGE, EndMessage, Settled, encode, from_wire_error, to_wire_error
from .protocol import ERROR

if TYPE_CHECKING:
    from .isolate import Isolation

#: How much of the child's stderr is kept to tell a memory failure from another crash.
STDERR_TAIL_BYTES = 8_192


class MemoryLimitError(NonRetryableError):
    """An isolated run past its ``max_memory_mb``: not retried (the next run would most likely do the same)."""

    def __init__(self, message: str, max_memory_mb: int | None) -> None:
        TaskrelayError.__init__(self, ERROR.MEMORY_LIMIT, message, {"maxMemoryMb": max_memory_mb})



class IsolatedRun(ChildCalls):
    def __init__(self, name: str, isolation: Isolation, ctx: Any) -> None:
        self.name = name
        self.isolation = isolation
        self.ctx = ctx
        self.log = ctx.log
        self.proc: asyncio.subprocess.Process | None = None
        self.end: asyncio.Future | None = None
        self.kill_cause: tuple[str, str] | None = None
        self.kill_timer: asyncio.TimerHandle | None = None
        self.stderr_tail = b""
        self.waitpoints: dict[str, Any] = {}
        self.steps: dict[int, asyncio.Future] = {}
        self.calls: set[asyncio.Task] = set()
        self.readers: list[asyncio.Task] = []
        self.notes: set[asyncio.Task] = set()

    async def run(self, args: Any) -> Any:
        self.end = asyncio.get_running_loop().create_future()
        if hasattr(args, "model_dump") and callable(args.model_dump):
            args = args.model_dump(mode="json")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "taskrelay_worker.isolate_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=16 * 1024 * 1024,
        )
        self.log.debug("isolated run started", isolate="process", childPid=self.proc.pid)
        self._post(
            {
                "t": "start",
                "start": {
                    "module": self.isolation.module,
                    "tool": self.name,
                    "input": args,
                    "taskId": self.ctx.task_id,
                    "attempt": self.ctx.attempt,
                    "state": self.ctx.state.get(),
                    "answers": self.ctx.answers,
                    "logLevel": self.log.level,
                    "maxMemoryMb": self.isolation.max_memory_mb,
                },
            }
        )
        self.readers = [asyncio.ensure_future(self._read_messages()), asyncio.ensure_future(self._read_stderr())]
        aborted = asyncio.ensure_future(self.ctx._signal.event.wait())
        aborted.add_done_callback(lambda _: self._aborted())
        try:
            settled: Settled = await self.end
        except asyncio.CancelledError:
            # The engine cancelled the run past its abort grace: the child goes with it.
            self._kill_now()
            raise
        finally:
            aborted.cancel()
            for task in list(self.calls):
                task.cancel()
        # The child exits by itself once its end is written; one that does not within its grace is killed. Waited for,
        # so no child outlives its run (a few ms for one that ends as it should).
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout=self.isolation.kill_grace_ms / 1000)
        except asyncio.TimeoutError:
            self._kill_now()
            await self.proc.wait()
        except asyncio.CancelledError:
            self._kill_now()
            raise
        await asyncio.gather(*self.readers, return_exceptions=True)
        if settled.ok:
            return settled.value
        assert settled.error is not None
        if settled.error.name == "MemoryError" and self.isolation.max_memory_mb is not None:
            raise self._memory_error()
        raise from_wire_error(settled.error)

    # The child's messages ----------------------------------------------------------------------------------------

    async def _read_messages(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except ValueError:
                self.log.debug("isolated run: a message over the line limit ignored")
                continue
            if not line:
                break
            try:
                message = CHILD_MESSAGE.validate_json(line)
            except ValidationError:
                self.log.debug("isolated run: a message that is not the protocol's ignored")
                continue
            self._receive(message)
        code = await self.proc.wait()
        self._child_ended(code)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            chunk = await self.proc.stderr.read(4096)
            if not chunk:
                return
            # Passed through to the worker's stderr, and its tail kept: a MemoryError there is a memory end.
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
            self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]

    def _receive(self, message: Any) -> None:
        kind = message.t
        if kind == "progress":
            self._quietly(self.ctx.progress(message.progress, message.total, message.message))
        elif kind == "notify":
            self._quietly(self.ctx.notify(message.level, message.data, message.logger))
        elif kind == "log":
            getattr(self.log, message.level if message.level in ("debug", "info", "warn", "error") else "info")(
                message.msg, **message.fields
            )
        elif kind == "call":
            task = asyncio.ensure_future(self._call(message))
            self.calls.add(task)
            task.add_done_callback(self.calls.discard)
        elif kind == "invoked":
            waiter = self.steps.pop(message.id, None)
            if waiter is not None and not waiter.done():
                if message.settled.ok:
                    waiter.set_result(message.settled.value)
                else:
                    waiter.set_exception(from_wire_error(message.settled.error))
        elif kind == "end":
            self._settle(message.settled)

    def _quietly(self, coroutine: Any) -> None:
        """A progress or notify the real context refuses (a bad value) is the child's mistake: logged, never raised."""

        async def run() -> None:
            try:
                await coroutine
            except Exception as error:  # noqa: BLE001
                self.log.debug("isolated run: ctx message refused", err=error)

        # Not cancelled with the run's end: a report made before the end is written.
        task = asyncio.ensure_future(run())
        self.notes.add(task)
        task.add_done_callback(self.notes.discard)

    # Ends --------------------------------------------------------------------------------------------------------

    def _aborted(self) -> None:
        reason = self.ctx.cancel_reason
        if reason is None or self.end is None or self.end.done():
            return
        self._post({"t": "abort", "reason": reason})
        self._kill_after_grace("abort", reason)

    def _kill_after_grace(self, kind: str, reason: str) -> None:
        if self.kill_cause is not None or self.end is None or self.end.done():
            return
        self.kill_cause = (kind, reason)
        grace = self.isolation.kill_grace_ms
        self.kill_timer = asyncio.get_running_loop().call_later(grace / 1000, self._kill_after, kind, grace)

    def _kill_after(self, kind: str, grace: int) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.log.warn("isolated run did not end within kill_grace_ms; killing its child", killGraceMs=grace, cause=kind)
        self._kill_now()

    def _kill_now(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def _settle(self, settled: Settled) -> None:
        if self.end is not None and not self.end.done():
            self.end.set_result(settled)
        for waiter in self.steps.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError("the isolated run ended"))
        self.steps.clear()

    def _child_ended(self, code: int) -> None:
        """The child is gone. Without an end of its own, the run ends with what its going stands for."""
        if self.kill_timer is not None:
            self.kill_timer.cancel()
        if self.end is None or self.end.done():
            return
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        error = self._error_of_end(how)
        self.log.info("isolated run ended without a result of its own", how=how, code=getattr(error, "code", None))
        self._settle(EndMessage.model_validate({"t": "end", "settled": {"ok": False, "error": to_wire_error(error)}}).settled)

    def _error_of_end(self, how: str) -> BaseException:
        if b"MemoryError" in self.stderr_tail and self.isolation.max_memory_mb is not None:
            return self._memory_error()
        if self.kill_cause is not None and self.kill_cause[0] == "abort":
            return TaskCancelledError(self.kill_cause[1])
        if self.kill_cause is not None and self.kill_cause[0] == "suspended":
            return SuspendedError()
        return TaskrelayError(ERROR.TOOL_FAILED, f"Tool {self.name}'s isolated run ended without a result ({how})")

    def _memory_error(self) -> MemoryLimitError:
        limit = self.isolation.max_memory_mb
        return MemoryLimitError(
            f"Tool {self.name} ran out of memory: its run used more than maxMemoryMb {limit if limit is not None else '?'} "
            "MB and was stopped",
            limit,
        )

    def _post(self, message: dict[str, Any]) -> None:
        if self.proc is None or self.proc.stdin is None or self.proc.stdin.is_closing():
            return
        try:
            self.proc.stdin.write(encode(message))
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as error:
            self.log.debug("isolated run: message to the child not sent", err=error)

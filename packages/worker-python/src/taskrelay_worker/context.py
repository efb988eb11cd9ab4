"""What a tool's ``run(args, ctx)`` gets besides its arguments (PROTOCOL.md §5.2, §6, §12): the Python counterpart
of the Node worker's ``TaskContext``, writing through the same scripts with the same job lock."""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import time
from typing import Any, Awaitable, Callable

from .batch_parent import FanOutHost
from .context_asks import InputAsks
from .context_batch import BatchMembers
from .context_checks import MAX_TAGS, _TAG, bounded_text, question_identity
from .context_types import RunSignal, Suspension, ToolState
from .errors import SuspendedError, TaskCancelledError, TaskrelayError
from .log import Logger
from .protocol import CANCEL, ERROR
from .run_messages import RunMessages
from .store import JobLock, TaskRecord, TaskStore
from .waitpoints import Waitpoint, WaitpointOpener, as_datetime, check_waitpoint_args, waitpoint_message

__all__ = ["RunSignal", "Suspension", "ToolContext", "ToolState", "bounded_text", "question_identity"]


class ToolContext(InputAsks, BatchMembers):
    def __init__(
        self,
        *,
        task_id: str,
        tool: str,
        attempt: int,
        signal: RunSignal,
        store: TaskStore,
        lock: JobLock,
        log: Logger,
        record: TaskRecord,
        progress_interval_ms: int,
        input_timeout_ms: int,
        queue_timeout_ms: int,
        on_lock_lost: Callable[[], None],
        waitpoints: WaitpointOpener | None = None,
        start: Awaitable[bool | None] | None = None,
        batch: FanOutHost | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.task_id = task_id
        #: The batch engine behind ``fan_out`` (PROTOCOL.md §26, §29.4); without it ``fan_out`` raises.
        self._batch_host = batch
        self._record = record
        self._waitpoints = waitpoints
        self.tool = tool
        self.attempt = attempt
        self.log = log
        self._signal = signal
        self._store = store
        self._lock = lock
        self._on_lock_lost = on_lock_lost
        #: Progress and log messages, written in the background (run_messages.py).
        self._messages = RunMessages(
            task_id=task_id,
            store=store,
            lock=lock,
            log=log,
            progress_interval_ms=progress_interval_ms,
            on_lock_lost=on_lock_lost,
            on_progress=on_progress or (lambda what: None),
        )
        self._input_timeout_ms = input_timeout_ms
        self._queue_timeout_ms = queue_timeout_ms
        #: A first run's start, on its way (§21.2.1): members that read the record or write durably await it.
        self._start = start
        #: The record's read after a start that answered without it: one for every member that needs it.
        self._record_read: asyncio.Future | None = None
        self._caps = record.client_capabilities
        self._steps: dict[str, Any] = dict(record.steps)
        self._stored_steps = set(self._steps)
        self._steps_asked: set[str] = set()
        self._init_asks(record)
        self.state = ToolState(self, record.state)
        #: Set once the run suspended: the worker delays the job instead of finishing it (§12.7).
        self.suspension: Suspension | None = None
        self._output: Any = None

    async def _started(self, needs_record: bool = False) -> None:
        """A first run awaits its start's answer before anything that writes durably or reads the task (§21.2.1): a
        task that never ran has no state or questions, but its client's capabilities and a redrive's step results are
        only in Redis, and a task ended before the start must not see a step run. The start answers without the
        record (issue 46): a member that reads it (``needs_record``: asks, ``step``, ``fan_out``) reads it once, after
        the start's answer. No-op once the record is read."""
        start = self._start
        if start is None:
            return
        goes = await start
        if goes and not needs_record:
            self.throw_if_cancelled()
            return
        record = None
        if goes:
            if self._record_read is None:
                self._record_read = asyncio.ensure_future(self._store.get(self.task_id))
            read = self._record_read
            try:
                record = await read
            except Exception:
                # Redis did not answer: the next member that needs the record reads again.
                if self._record_read is read:
                    self._record_read = None
                raise
        if self._start is start:
            self._start = None
            if record is not None:
                self._record = record
                self._caps = record.client_capabilities
                # A redrive's task starts with the original's step results (§30.3).
                self._steps = dict(record.steps)
                self._stored_steps = set(self._steps)
        self.throw_if_cancelled()

    # Output (PROTOCOL.md §34) ------------------------------------------------------------------------------------

    def attach_output(self, run_output: Any) -> None:
        """The run's output side (``output.RunOutput``), set by the engine."""
        self._output = run_output

    @property
    def output(self) -> Any:
        """``await ctx.output.write(chunk)`` appends, ``await ctx.output.set(snapshot)`` replaces the task's partial
        output, readable as ``taskrelay://tasks/{task_id}/output`` while the task runs and after."""
        if self._output is None:
            raise TypeError("ctx.output needs a worker (no output store here)")
        return self._output.output

    async def artifact(self, name: str, data: Any, mime_type: str) -> dict[str, Any]:
        """Attaches a file (bytes, str or an async iterable of them) to the task and returns its ``resource_link``,
        also appended to the result's content (PROTOCOL.md §34.4)."""
        if self._output is None:
            raise TypeError("ctx.artifact needs a worker (no output store here)")
        await self._started()
        return await self._output.artifact(name, data, mime_type)

    async def finish_result(self, result: dict[str, Any], inline_at_most: int | None = None) -> dict[str, Any]:
        """The result as it is stored: artifacts appended, large parts moved out by reference (§34.3)."""
        return result if self._output is None else await self._output.finish(result, inline_at_most)

    # Cancellation -----------------------------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the client cancelled the task, its timeout passed, or the worker is shutting down."""
        return self._signal.aborted

    @property
    def cancel_reason(self) -> str | None:
        return self._signal.reason

    def throw_if_cancelled(self) -> None:
        if self._signal.aborted:
            raise TaskCancelledError(self._signal.reason or CANCEL.CLIENT_CANCELLED)

    async def sleep(self, seconds: float) -> None:
        """Waits ``seconds``; raises ``TaskCancelledError`` as soon as the run is cancelled."""
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"ctx.sleep needs a finite, non-negative number of seconds (got {seconds!r})")
        self.throw_if_cancelled()
        try:
            await asyncio.wait_for(self._signal.event.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        self.throw_if_cancelled()

    # Progress and log messages ----------------------------------------------------------------------------------

    # Progress and log messages (run_messages.py) -----------------------------------------------------------------

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Reports progress to the caller, on its own progress token. Values must increase (a smaller one is
        dropped); they are throttled per task (``TASKRELAY_PROGRESS_INTERVAL_MS``, newest wins) and written in the
        background, so this returns at once."""
        await self._messages.progress(done, total, message)

    async def notify(self, level: str, data: Any, logger: str | None = None) -> None:
        """Sends an MCP log message (``notifications/message``) to the task's caller (§15)."""
        await self._messages.notify(level, data, logger)

    async def flush(self) -> None:
        """Writes the pending progress value and waits for every write in flight (before the terminal write)."""
        await self._messages.flush()

    def close(self) -> None:
        self._messages.close()

    # Durable state, steps, suspension ---------------------------------------------------------------------------

    async def tag(self, *tags: str) -> None:
        """Adds tags to the task (PROTOCOL.md §30.2), beside its call's: operators find tasks by them. Each tag is 1 to
        64 characters of letters, digits and ``_.:/=@+-``; a task carries at most 10 (ValueError beyond)."""
        bad = next((t for t in tags if not isinstance(t, str) or not _TAG.fullmatch(t)), None)
        if bad is not None:
            raise ValueError(f"ctx.tag: each tag must be 1 to 64 characters of letters, digits and _.:/=@+-; got {bad!r}")
        if len(tags) > MAX_TAGS:
            raise ValueError(f"ctx.tag: a task carries at most {MAX_TAGS} tags")
        if not tags:
            return
        await self._started()
        outcome = await self._store.add_tags(self.task_id, self._lock, list(tags))
        if outcome == "full":
            raise ValueError(f"ctx.tag: a task carries at most {MAX_TAGS} tags")
        self._settle_write(outcome)

    async def step(self, name: str, fn: Callable[[], Any], *, version: str | None = None) -> Any:
        """Runs ``fn`` (sync or async) once per task and returns its JSON result; later runs get the stored one.
        ``version`` is part of the step's key (§12.1): bump it when a deploy changes what the step does."""
        if not isinstance(name, str) or not name:
            raise TypeError("ctx.step needs a non-empty name")
        if not callable(fn):
            raise TypeError("ctx.step needs a function")
        if version is not None:
            if not isinstance(version, str) or not re.match(r"^[A-Za-z0-9_.-]{1,64}$", version):
                raise TypeError("ctx.step: version must be 1 to 64 of A-Z a-z 0-9 _ - .")
            name = f"{name}@{version}"
        await self._started(True)
        self._steps_asked.add(name)
        if name in self._steps:
            return self._steps[name]
        self._check_running()
        unasked = sorted(s for s in self._stored_steps if s not in self._steps_asked)
        if unasked:
            self.log.warn(
                "ctx.step runs a step earlier runs never stored while steps they stored are unasked: renamed by a "
                "deploy? Its side effect runs again",
                step=name,
                storedSteps=unasked,
            )
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        steps = {**self._steps, name: value}
        await self._write_durable("steps", steps)
        self._steps = steps
        return value

    async def suspend(self, seconds: float) -> None:
        """Ends this run; the handler runs again from the top in ``seconds``, on any worker, holding no slot
        meanwhile. Always raises ``SuspendedError``: let it propagate."""
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
            raise ValueError(f"ctx.suspend needs a non-negative number of seconds (got {seconds!r})")
        await self._started()
        self._check_running()
        until = int(time.time() * 1000 + seconds * 1000)
        outcome, _ = await self._store.suspend(self.task_id, self._lock, until + self._queue_timeout_ms)
        self._settle_suspend(outcome)
        if self.suspension is None:
            self.suspension = Suspension("time", until)
        raise SuspendedError()

    async def waitpoint(self, name: str, *, timeout_ms: int | None = None) -> Waitpoint:
        """A URL another system calls to resume this tool (PROTOCOL.md §32), the same for ``name`` on every run of the
        task: hand ``wp.url`` out (inside a ``ctx.step``), then ``await wp.wait()``. Default timeout 24 h."""
        timeout = check_waitpoint_args(name, timeout_ms)
        await self._started()
        self._check_running()
        if self._waitpoints is None:
            raise TaskrelayError(ERROR.INTERNAL, "ctx.waitpoint is not available in this context")
        outcome, record, url = await self._waitpoints.open(self.task_id, self._lock, name, timeout)
        if record is None:
            self._settle_suspend(outcome)
            raise TaskCancelledError(self._signal.reason or CANCEL.CLIENT_CANCELLED)
        return Waitpoint(name, url, as_datetime(record["timeoutAt"]), lambda: self._wait_on(name, record))

    async def _wait_on(self, name: str, record: dict[str, Any]) -> dict[str, Any]:
        if record["state"] == "completed":
            return {"ok": True, "value": record.get("value")}
        if record["state"] == "timedOut":
            return {"ok": False, "reason": "timeout"}
        self._check_running()
        until = int(record["timeoutAt"])
        outcome, _ = await self._store.suspend(
            self.task_id, self._lock, until + self._queue_timeout_ms, status_message=waitpoint_message(name)
        )
        self._settle_suspend(outcome)
        if self.suspension is None:
            self.suspension = Suspension("time", until, waitpoint=name)
        raise SuspendedError()

    def _settle_suspend(self, outcome: str) -> None:
        if outcome == "lock_lost":
            self._on_lock_lost()
            raise TaskCancelledError(ERROR.LOCK_LOST)
        if outcome == "gone":
            self._ended_elsewhere()

    async def _write_durable(self, field_name: str, value: Any) -> None:
        await self._started()
        self._settle_write(await self._store.set_state(self.task_id, self._lock, field_name, value))

    def _settle_write(self, outcome: str) -> None:
        """Turns a refused lock-checked write into the error the handler sees."""
        if outcome == "lock_lost":
            self._on_lock_lost()
            raise TaskCancelledError(ERROR.LOCK_LOST)
        if outcome == "gone":
            self._ended_elsewhere()

    def _ended_elsewhere(self) -> None:
        """A write found the task ended (cancelled, or failed by the reaper) before the cancel message arrived: the
        run is cancelled now, so the worker ends it as a cancel and not as the tool's failure."""
        self._signal.abort(self._signal.reason or CANCEL.CLIENT_CANCELLED)
        raise TaskCancelledError(self._signal.reason or CANCEL.CLIENT_CANCELLED)

    def _check_running(self) -> None:
        if self.suspension is not None:
            raise SuspendedError()
        self.throw_if_cancelled()

"""What a tool's ``run(args, ctx)`` gets besides its arguments (PROTOCOL.md §5.2, §6, §12): the Python counterpart
of the Node worker's ``TaskContext``, writing through the same scripts with the same job lock."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .errors import SuspendedError, TaskCancelledError, TaskrelayError
from .fan_out import MAX_PAGE, FanOutHost, FanOutRun, batch_message, check_fan_out_args, redis_unavailable
from .log import Logger
from .protocol import CANCEL, ERROR, FIELDS
from .store import JobLock, TaskRecord, TaskStore
from .waitpoints import Waitpoint, WaitpointOpener, as_datetime, check_waitpoint_args, waitpoint_message

#: The rules of a tag (PROTOCOL.md §30.2), as the Node worker's ``TAG_PATTERN`` and ``MAX_TAGS``.
_TAG = re.compile(r"[A-Za-z0-9_.:/=@+-]{1,64}")
MAX_TAGS = 10

#: Progress and log message text above this many UTF-8 bytes is cut, with a marker (PROTOCOL.md §22.4).
MAX_PROGRESS_MESSAGE_BYTES = 4_096
MAX_LOG_BYTES = 65_536
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_TRUNCATED = "… [truncated]"


def bounded_text(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    room = max_bytes - len(_TRUNCATED.encode())
    return data[:room].decode("utf-8", "ignore") + _TRUNCATED


def question_identity(method: str, params: dict[str, Any], key: str | None) -> str:
    """A question's identity (``questionIdentity`` in task-model.ts): its method, key and, for a form, its schema."""
    schema = params.get("requestedSchema") if method == "elicitation/create" else None
    return json.dumps([method, key, schema], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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


class ToolContext:
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
        #: Told of each progress value written, or coalesced (replaced before its write): the worker's metrics.
        self._on_progress = on_progress or (lambda what: None)
        self._record = record
        self._waitpoints = waitpoints
        self.tool = tool
        self.attempt = attempt
        self.log = log
        self._signal = signal
        self._store = store
        self._lock = lock
        self._on_lock_lost = on_lock_lost
        self._interval = progress_interval_ms / 1000
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
        self._answered: dict[str, Any] = dict(record.input_responses)
        self._stored = [
            {
                "n": int(n),
                "identity": question_identity(r.get("method", ""), r.get("params") or {}, r.get("key")),
                "key": r.get("key"),
                "position": r.get("position", int(n)),
            }
            for n, r in record.input_requests.items()
            if str(n).isdigit()
        ]
        self._used: set[int] = set()
        self._last_number = max([record.input_floor, *(r["n"] for r in self._stored)])
        self._requests = 0
        self._batch: list[_Ask] = []
        self._last_progress: float | None = None
        self._pending: tuple[float, float | None, str | None] | None = None
        self._last_sent = 0.0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task] = set()
        self._closed = False
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

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Reports progress to the caller, on its own progress token. Values must increase (a smaller one is
        dropped); they are throttled per task (``TASKRELAY_PROGRESS_INTERVAL_MS``, newest wins) and written in the
        background, so this returns at once."""
        for name, value in (("progress", done), ("total", total)):
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise ValueError(f"{name} must be a finite number (got {value!r})")
        if self._closed:
            return
        if self._last_progress is not None and done <= self._last_progress:
            self.log.debug("progress not greater than the last value dropped", progress=done, last=self._last_progress)
            return
        self._last_progress = done
        text = None if message is None else bounded_text(str(message), MAX_PROGRESS_MESSAGE_BYTES)
        if self._pending is not None:
            self._on_progress("coalesced")
        self._pending = (done, total, text)
        wait = self._last_sent + self._interval - time.monotonic()
        if wait <= 0:
            self._send_pending()
        elif self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(wait, self._send_pending)

    def _send_pending(self) -> None:
        self._flush_handle = None
        if self._pending is None or self._closed:
            return
        done, total, text = self._pending
        self._pending = None
        self._last_sent = time.monotonic()
        self._track(self._write_progress(done, total, text))

    async def _write_progress(self, done: float, total: float | None, text: str | None) -> None:
        try:
            outcome = await self._store.record_progress(self.task_id, done, total, text, self._lock)
        except Exception as error:  # noqa: BLE001 - a failed write is logged, never raised into the tool
            self.log.warn("progress write failed", err=error, progress=done)
            return
        self._on_progress("written")
        if outcome == "lock_lost":
            self.log.warn("progress refused: this worker no longer holds the job", progress=done)
            self._on_lock_lost()

    async def notify(self, level: str, data: Any, logger: str | None = None) -> None:
        """Sends an MCP log message (``notifications/message``) to the task's caller (§15)."""
        if level not in LOG_LEVELS:
            raise ValueError(f"ctx.notify: level must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
        text = json.dumps(data, ensure_ascii=False)
        if len(text.encode()) > MAX_LOG_BYTES:
            raise ValueError(f"ctx.notify: data is over {MAX_LOG_BYTES} bytes as JSON")
        if self._closed:
            return
        self._track(self._write_log(level, data, logger))

    async def _write_log(self, level: str, data: Any, logger: str | None) -> None:
        try:
            outcome = await self._store.record_log(self.task_id, level, data, logger, self._lock)
        except Exception as error:  # noqa: BLE001
            self.log.warn("log message write failed", err=error, level=level)
            return
        if outcome == "lock_lost":
            self._on_lock_lost()

    def _track(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def flush(self) -> None:
        """Writes the pending progress value and waits for every write in flight (before the terminal write)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._send_pending()
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def close(self) -> None:
        self._closed = True
        self._pending = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()

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

    async def elicit(self, message: str, requested_schema: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        """Asks the user (MCP elicitation, form mode). The task is ``input_required`` meanwhile and the run
        suspends: the handler runs again from the top when the answer comes, and this call then returns it at once
        (``{"action": "accept", "content": {...}}``, or ``decline`` / ``cancel``). Ask in the same order every run."""
        if not isinstance(message, str) or not message:
            raise ValueError("ctx.elicit: message must be a non-empty string")
        if not isinstance(requested_schema, dict) or requested_schema.get("type") != "object":
            raise ValueError("ctx.elicit: requested_schema must be a JSON Schema object ({'type': 'object', ...})")
        if not isinstance(requested_schema.get("properties"), dict):
            raise ValueError("ctx.elicit: requested_schema.properties must be an object")
        answer = await self._ask(
            "elicitation/create", "elicitation", {"message": message, "requestedSchema": requested_schema}, key
        )
        if not isinstance(answer, dict) or answer.get("action") not in ("accept", "decline", "cancel"):
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to elicitation/create is malformed")
        return answer

    async def sample(
        self, messages: list[dict[str, Any]], max_tokens: int, *, key: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """Asks the client's model (MCP sampling), like ``elicit``; extra keyword arguments (``systemPrompt``...)
        go into the request as they are."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("ctx.sample: messages must be a non-empty list")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError("ctx.sample: max_tokens must be a positive whole number")
        answer = await self._ask(
            "sampling/createMessage", "sampling", {"messages": messages, "maxTokens": max_tokens, **params}, key
        )
        if not isinstance(answer, dict) or "model" not in answer:
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to sampling/createMessage is malformed")
        return answer

    async def list_roots(self, *, key: str | None = None) -> dict[str, Any]:
        """Asks the client for its roots (MCP ``roots/list``), like ``elicit`` (capability ``roots``): the answer is
        ``{"roots": [{"uri": ..., "name"?: ...}, ...]}``, as the client sent it."""
        answer = await self._ask("roots/list", "roots", {}, key)
        roots = answer.get("roots") if isinstance(answer, dict) else None
        if not isinstance(roots, list) or not all(
            isinstance(r, dict) and isinstance(r.get("uri"), str) and isinstance(r.get("name", ""), str) for r in roots
        ):
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to roots/list is malformed")
        return answer

    # Batch fan-out (PROTOCOL.md §26, §29.4) ------------------------------------------------------------------------

    async def fan_out(
        self, items: list[dict[str, Any]], *, tool: str, concurrency: int = 64, fail_fast: bool = False
    ) -> dict[str, Any]:
        """Runs ``tool`` once per item (each item is one child's arguments) on every worker of the tool, at most
        ``concurrency`` at a time, and returns ``{"total", "completed", "failed", "cancelled", "outcomes", "truncated",
        "outcomesOmitted"}`` once every child is done (or, with ``fail_fast``, at the first failure). Once per task,
        with the same items on every run: the run suspends while the children run (raising ``SuspendedError``: let it
        propagate) and the handler runs again from the top when they are done."""
        args = check_fan_out_args(items, tool, concurrency, fail_fast)
        await self._started(True)
        self._check_running()
        if self._batch_host is None:
            raise TaskrelayError(ERROR.INTERNAL, "ctx.fan_out is not available in this context")
        record = self._record
        ttl = record.fields.get(FIELDS["ttl"]) if record is not None else None
        run = FanOutRun(
            task_id=self.task_id,
            lock=self._lock,
            principal=record.principal if record is not None else "",
            ttl_ms=int(ttl) if isinstance(ttl, str) and ttl.isdigit() else 3_600_000,
            log=self.log,
        )
        try:
            kind, value = await self._batch_host.fan_out(run, args)
        except TaskCancelledError as error:
            if error.reason == CANCEL.LOCK_LOST:
                self._on_lock_lost()
            raise
        except Exception as error:
            # Redis unreachable mid-release: not the tool's failure. The run ends as one that lost its lock (nothing
            # more written, the job handed back or taken over), and the replay goes on from what Redis holds.
            if redis_unavailable(error):
                self._on_lock_lost()
                raise TaskCancelledError(CANCEL.LOCK_LOST) from None
            raise
        if kind == "done":
            result = value
            done = result["completed"] + result["failed"]
            await self.progress(done, result["total"], batch_message(result["completed"], result["failed"], result["total"]))
            return result
        # The children run; this run ends without holding its slot. A child's record promotes the job (§26.3 step 4);
        # the poll is the safety net for a lost promotion.
        until = int(time.time() * 1000) + int(value)
        outcome, _ = await self._store.suspend(self.task_id, self._lock, until + self._queue_timeout_ms)
        self._settle_suspend(outcome)
        if self.suspension is None:
            self.suspension = Suspension("time", until, batch=True)
        raise SuspendedError()

    async def batch_outcomes(self, start: int, count: int) -> list[dict[str, Any]]:
        """Outcomes of children ``start .. start + count - 1`` of this task's batch: the ones ``fan_out`` did not list
        (``outcomesOmitted`` of them, from ``len(result["outcomes"])``)."""
        for name, value in (("start", start), ("count", count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ctx.batch_outcomes needs a whole {name} >= 0 (got {value!r})")
        if count > MAX_PAGE:
            raise ValueError(f"ctx.batch_outcomes reads at most {MAX_PAGE} outcomes at a time")
        if self._batch_host is None:
            raise TaskrelayError(ERROR.INTERNAL, "ctx.batch_outcomes is not available in this context")
        await self._started()
        return await self._batch_host.outcomes(self.task_id, start, count)

    @property
    def answers(self) -> dict[str, Any]:
        return dict(self._answered)

    async def _ask(self, method: str, capability: str, params: dict[str, Any], key: str | None) -> Any:
        await self._started(True)
        if self.suspension is not None:
            raise SuspendedError()
        if key is not None:
            if not isinstance(key, str) or not _KEY.match(key):
                raise ValueError("key must be 1 to 100 of A-Z a-z 0-9 _ - .")
            if any(entry.key == key for entry in self._batch):
                raise ValueError(f"key {key} is already asked in this turn")
        self._requests += 1
        position = self._requests
        n = self._number_for(position, key, question_identity(method, params, key))
        if str(n) in self._answered:
            return self._answered[str(n)]
        self.throw_if_cancelled()
        if self._caps is not None and capability not in self._caps:
            raise TaskrelayError(
                ERROR.CAPABILITY_MISSING,
                f"The client of this task did not declare the {capability} capability, so it cannot be asked ({method})",
                {"capability": capability},
            )
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batch.append(_Ask(n, position, key, method, params, future))
        if len(self._batch) == 1:
            # Questions asked in the same turn (asyncio.gather) go out together, in one suspend.
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush_batch()))
        return await future

    def _number_for(self, position: int, key: str | None, identity: str) -> int:
        """The request number of this ask (§12.3): the stored question it is, when unchanged; else a new one."""
        candidates = [
            r
            for r in self._stored
            if (r["key"] == key if key is not None else r["key"] is None and r["position"] == position)
            and r["n"] not in self._used
        ]
        latest = max(candidates, key=lambda r: r["n"], default=None)
        if latest is not None and latest["identity"] == identity:
            self._used.add(latest["n"])
            return latest["n"]
        if latest is not None:
            self.log.warn(
                "the question asked here changed since its answer was stored (a deploy?): asking it again",
                inputRequest=latest["n"],
                position=position,
            )
        self._last_number += 1
        self._used.add(self._last_number)
        return self._last_number

    async def _flush_batch(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            until = int(time.time() * 1000) + self._input_timeout_ms
            requests = []
            for entry in batch:
                request: dict[str, Any] = {"n": entry.n, "method": entry.method, "params": entry.params}
                if entry.key is not None:
                    request["key"] = entry.key
                request["position"] = entry.position
                requests.append(request)
            outcome, answers = await self._store.suspend(self.task_id, self._lock, until, requests)
            self._settle_suspend(outcome)
            waiting = [entry for entry in batch if str(entry.n) not in answers]
            if waiting:
                self.suspension = Suspension("input", until, waiting[0].n)
                self.log.info(
                    "input requested; run suspends until the answers",
                    inputRequests=[e.n for e in waiting],
                    methods=[e.method for e in waiting],
                )
            for entry in batch:
                if entry.future.done():
                    continue
                if str(entry.n) in answers:
                    self._answered[str(entry.n)] = answers[str(entry.n)]
                    entry.future.set_result(answers[str(entry.n)])
                else:
                    entry.future.set_exception(SuspendedError())
        except BaseException as error:  # noqa: BLE001 - every ask of the batch learns what went wrong
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(error)

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

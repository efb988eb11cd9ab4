"""The run of one task's job (PROTOCOL.md §5, §10, §12, §21.2), as the Node worker's ``engine/job-run.ts``: record the
run's start (a first run's pipelined with its tool, §21.2.1), check the job, admit it by its tool's limits, run the tool
with its context under its timeout, then carry out how it ended (``job_end.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..context import ToolContext
from ..errors import NonRetryableError
from ..limits import LimitWait
from ..log import Logger
from ..log_keeper import TaskLogKeeper
from ..output import RunOutput
from ..protocol import CANCEL, ERROR, message_problem
from ..store import TERMINAL, JobLock, TaskRecord
from ..tools import ToolDefinition
from .bullmq_adapter import UNREADABLE_JOB_DATA
from .end_write import now_ms
from .run_envelope import MAX_TIMER_MS
from .running_jobs import RunEntry

DEFAULT_QUEUE_TIMEOUT_MS = 3_600_000


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def queue_timeout_of(data: dict) -> int:
    """How long the job may wait in its queue: its data's, or the gateway's default."""
    return _int_or_none(data.get("queueTimeoutMs")) or DEFAULT_QUEUE_TIMEOUT_MS


@dataclass
class RunScope:
    """What a task's run knows once its start is recorded."""

    job: Any
    token: str
    task_id: str
    data: dict
    attempt: int
    entry: RunEntry
    log: Logger
    lock: JobLock
    queue_timeout_ms: int


class TaskTimeout:
    """A task's timeout (§5): once, unless the run was aborted or suspended first, it aborts the run with ``TIMEOUT``,
    closes its context and fails the task (the write is awaited as the run ends)."""

    def __init__(self, worker: Any, run: RunScope, ctx: ToolContext, tool: ToolDefinition, timeout_ms: int | None):
        self.worker, self.run, self.ctx, self.timeout_ms = worker, run, ctx, timeout_ms
        self.message = f"Tool {tool.name} timed out after {timeout_ms or 0} ms"
        self.write: asyncio.Task | None = None

    def start(self) -> asyncio.TimerHandle | None:
        if self.timeout_ms is None:
            return None
        return asyncio.get_running_loop().call_later(min(self.timeout_ms, MAX_TIMER_MS) / 1000, self.fire)

    def fire(self) -> None:
        run = self.run
        if run.entry.signal.aborted or self.ctx.suspension is not None:
            return
        run.log.info("tool timed out; aborting it", reason=CANCEL.TIMEOUT, timeoutMs=self.timeout_ms)
        self.worker._abort(run.task_id, CANCEL.TIMEOUT)
        self.ctx.close()
        error = {"code": ERROR.TIMEOUT, "message": self.message}
        self.write = asyncio.ensure_future(self.worker._fail_task(run.task_id, run.lock, self.message, error, run.log))


class JobRun:
    """The run of a task's job in ``TaskrelayWorker`` (a part of it)."""

    async def _run(
        self, job: Any, token: str, task_id: str, data: dict, attempt: int, entry: RunEntry, log: Logger
    ) -> Any:
        assert self.store is not None
        if self.closing:
            return await self.hand_back(job, token, log)
        lock = JobLock(entry.queue, token)
        queue_timeout_ms = queue_timeout_of(data)
        timeout_hint = _int_or_none(data.get("timeoutMs"))
        deadline_at = now_ms() + min(timeout_hint or MAX_TIMER_MS, MAX_TIMER_MS) + self.config.lock_duration_ms + queue_timeout_ms
        principal = data.get("principal") if isinstance(data.get("principal"), str) else None
        run = RunScope(job, token, task_id, data, attempt, entry, log, lock, queue_timeout_ms)
        first = self._first_run(job, task_id, data, principal, queue_timeout_ms)
        if first is not None and principal is not None:
            # Sent before anything else of the run is written, and not awaited before its tool (§21.2.1).
            started = self.store.start_pipelined(task_id, lock, attempt, deadline_at, principal, first.version or "")
            start = asyncio.ensure_future(self._read_start(started, task_id, log))
            # What a task that never ran holds: no state, steps or questions, and the job's principal.
            record = TaskRecord(task_id=task_id, status="working", principal=principal, tool=first.name, fields={})
            entry.principal = principal
            try:
                return await self._run_started(run, record, start)
            finally:
                # The job leaves this run only once its start is answered: bullmq's next move of the job goes on
                # another connection and must not overtake it.
                await start
        task = await self._record_start(run, deadline_at, principal)
        if task is None:
            return None
        return await self._run_started(run, task, None)

    async def _record_start(self, run: RunScope, deadline_at: int, principal: str | None) -> TaskRecord | None:
        """The run's start, awaited before its tool: the task as it starts, or None when it is not to run. The run
        records the tool version it runs, and does not start a task another version ran (§12.11)."""
        assert self.store is not None
        task_id, lock, log = run.task_id, run.lock, run.log
        tool_name = run.data.get("tool")
        versioned = self.tools.get(tool_name) if isinstance(tool_name, str) else None
        lock_lost, task, other = await self.store.start_run(
            task_id, lock, run.attempt, deadline_at, principal, versioned.version if versioned else "", versioned is not None
        )
        if not lock_lost and other is not None and versioned is not None:
            policy = await self._version_change(run.job, run.token, task_id, lock, versioned, other, log)
            lock_lost, task, _ = await self.store.start_run(
                task_id, lock, run.attempt, deadline_at, principal, versioned.version, False, policy == "restart"
            )
        if lock_lost:
            log.warn("job lock already lost at start; tool not run")
            raise DelayedError()
        if task is not None and task.principal != principal:
            await self._redis.zrem(self.keys.for_task(task_id).fair_share(lock.queue, task.principal), task_id)  # type: ignore[union-attr]
        if task is None or task.status in TERMINAL:
            log.info("task is missing or already terminal; tool not run", status=task.status if task else "missing")
            if task is not None and task.status == "cancelled":
                await self._stop_batch(task_id, log)
            return None
        if principal != task.principal:
            log.bind(principal=task.principal)
        run.entry.principal = task.principal
        return task

    async def _run_started(self, run: RunScope, task: TaskRecord, start: asyncio.Future | None) -> Any:
        assert self.store is not None
        tool, arguments, args = await self._check_job(run)
        # A per-key or shared limit (§3.5) may send the run back to wait, holding no slot.
        wait = await self._admit(tool, arguments, run.job, run.entry)
        if wait is not None:
            return await self._wait_for_limit(run, tool, arguments, wait)
        timeout_ms = min((t for t in (_int_or_none(run.data.get("timeoutMs")), tool.timeout_ms) if t is not None), default=None)
        # The tool's log lines are also kept with its task (§30.4); the engine's own lines are not.
        keeper = TaskLogKeeper(self.store, run.task_id, run.attempt, run.log)
        ctx = self._task_context(run, task, tool, keeper, start)
        timeout = TaskTimeout(self, run, ctx, tool, timeout_ms)
        timer = timeout.start()
        run.log.info("tool started", timeoutMs=timeout_ms)
        ok, value, error = await self._run_tool(run.entry, tool, args, ctx, timer)
        run.entry.settling = True
        await keeper.flush()
        return await self._end_run(run, tool, arguments, ctx, timeout, ok, value, error)

    async def _check_job(self, run: RunScope) -> tuple[ToolDefinition, dict, Any]:
        """The job's data, its tool and its arguments, or the task failed and the job ended unrecoverably."""
        task_id, data, lock, log = run.task_id, run.data, run.lock, run.log
        tool_name, arguments = data.get("tool"), data.get("arguments")
        # The manifest's `jobData` shape (messages.ts `JobDataSchema`), and the job's own id as its taskId.
        problem = message_problem("jobData", data)
        if data.get("taskId") != task_id or problem is not None:
            unreadable = data.get(UNREADABLE_JOB_DATA)
            message = (
                f"Invalid job data: {unreadable}"
                if isinstance(unreadable, str)
                else f"Invalid job data: {problem or 'its taskId is not the job id'}"
            )
            await self._fail_job(run, ERROR.INTERNAL, message)
        tool = self.tools.get(tool_name)
        if tool is None:
            await self._fail_job(run, ERROR.TOOL_NOT_FOUND, f"Tool {tool_name} is not served by worker {self.worker_id} (queue {lock.queue})")
        stalls = run.job.stalledCounter
        if stalls > tool.max_stalls:
            message = (
                f"The worker running this task stopped responding {stalls} times (crashed or lost its "
                f"lock); giving up (maxStalls {tool.max_stalls})"
            )
            await self._fail_job(run, ERROR.JOB_LOST, message)
        try:
            args = tool.parse_arguments(arguments)
        except NonRetryableError as error:
            await self._fail_task(task_id, lock, str(error), {"code": ERROR.INVALID_ARGUMENTS, "message": str(error)}, log)
            raise UnrecoverableError(str(error)) from None
        return tool, arguments, args

    async def _fail_job(self, run: RunScope, code: str, message: str) -> Any:
        """Fails the task with ``code`` and ends its job unrecoverably."""
        await self._fail_task(run.task_id, run.lock, message, {"code": code, "message": message}, run.log)
        raise UnrecoverableError(message)

    async def _wait_for_limit(self, run: RunScope, tool: ToolDefinition, arguments: dict, wait: LimitWait) -> Any:
        """The run waits for its tool's limit: the task says so, and its job goes to the delayed set (§3.5)."""
        assert self.store is not None
        until = now_ms() + wait.wait_ms
        held, _ = await self.store.suspend(run.task_id, run.lock, until + run.queue_timeout_ms, status_message=wait.message)
        if held == "lock_lost":
            self._lost_while_writing(run.log, "limit wait")
        if held == "gone":
            run.log.info("task ended meanwhile; no limit wait")
            return None
        return await self._delay_for_limit(run.job, run.token, tool, arguments, wait, run.entry.principal, run.log)

    def _task_context(
        self, run: RunScope, task: TaskRecord, tool: ToolDefinition, keeper: TaskLogKeeper, start: asyncio.Future | None
    ) -> ToolContext:
        """The ``ctx`` of a task's run, with its output side (§34)."""
        assert self.store is not None
        task_id = run.task_id
        ctx = ToolContext(
            task_id=task_id,
            tool=tool.name,
            attempt=run.attempt,
            signal=run.entry.signal,
            store=self.store,
            lock=run.lock,
            log=keeper.wrap(run.log),
            record=task,
            progress_interval_ms=self.config.progress_interval_ms,
            input_timeout_ms=tool.input_timeout_ms,
            queue_timeout_ms=run.queue_timeout_ms,
            on_lock_lost=lambda: self._abort(task_id, CANCEL.LOCK_LOST),
            waitpoints=self.waitpoints,
            start=start,
            batch=None if self.batches is None else self.batches.for_run(run.data.get("maxOpen"), run.data.get("priority")),
            on_progress=self.metrics.progress,
        )
        output = RunOutput(self.store, self._output_limits, task_id, task.principal, run.lock, task_id, run.log)
        ctx.attach_output(output)
        return ctx

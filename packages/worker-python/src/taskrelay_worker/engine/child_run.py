"""The run of one batch child's job (PROTOCOL.md §26.3), as the Node worker's ``engine/batch-child.ts``: it runs while
its parent is live and its outcome unrecorded, records that outcome once under its job lock, moves the parent's
progress and wakes the parent when a window or the batch is done."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..context import ToolContext
from ..errors import NonRetryableError, serialize_error
from ..fair_share import priority_level_of
from ..keys import parse_batch_child_id
from ..log import Logger
from ..output import RunOutput, StoredBytesLimitError
from ..protocol import CANCEL, ERROR
from ..store import MAX_STORED_CHILD_RESULT_CHARS, JobLock, TaskRecord, TaskStore
from ..tools import ToolDefinition, to_tool_result
from .bullmq_adapter import UNREADABLE_JOB_DATA
from .end_write import bull_lock_ms, now_ms, write_through_outage
from .job_run import DEFAULT_QUEUE_TIMEOUT_MS
from .running_jobs import RunEntry
from .settle import SettleInput, is_suspended_error, settle


class _NoProgressStore:
    """A child reports no progress of its own: its parent's is the children's count (§26.3)."""

    def __init__(self, store: TaskStore) -> None:
        self._store = store

    async def record_progress(self, *_: Any) -> str:
        return "accepted"

    async def record_log(self, *_: Any) -> str:
        return "unrouted"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def failed(code: str, message: str) -> dict:
    """A child's failed outcome, as its parent's results list it."""
    return {
        "status": "failed",
        "result": {"content": [{"type": "text", "text": message}], "isError": True},
        "error": {"code": code, "message": message},
    }


@dataclass
class ChildScope:
    """What a batch child's run knows once it starts."""

    job: Any
    token: str
    entry: RunEntry
    log: Logger
    lock: JobLock
    parent_id: str
    index: int
    owner: str
    parent_pool: str
    tool_name: str
    arguments: dict
    #: Why the child's data cannot be read (issue 48 F5, §5.8), or None.
    unreadable: str | None


#: The shard code at the end of a sharded BullMQ prefix: ``<prefix>:{<code>}:<queue name>`` (a queue name has no braces).
_SHARD_OF_QUEUE = re.compile(r"\{([0-9a-f]{4})\}:[^{}]*$")


def shard_of_job(job: Any) -> str | None:
    """The shard of the queue a job was taken from (the sharded layout, §26.10): a batch child's id names its parent's
    shard, not its own, as the Node worker's ``shardOfBullPrefix``."""
    match = _SHARD_OF_QUEUE.search(str(getattr(job, "queueQualifiedName", "") or ""))
    return match.group(1) if match else None


class ChildRun:
    """The run of a batch child's job in ``TaskrelayWorker`` (a part of it)."""

    async def _run_child(self, job: Any, token: str, data: dict, attempt: int, entry: RunEntry, log: Logger) -> Any:
        assert self.store is not None
        if self.closing:
            return await self.hand_back(job, token, log)
        child = await self._start_child(job, token, data, entry, log)
        if child is None:
            return None
        claimed = await self.store.claimed_child(child.parent_id, child.index, child.lock)
        if claimed is not None:
            log.info("batch child claimed by an earlier run; counting it")
            return await self._record_child(child, claimed)
        tool_name, arguments = child.tool_name, child.arguments
        if child.unreadable is not None:
            log.warn(child.unreadable)
            return await self._record_child(child, failed(ERROR.INTERNAL, child.unreadable))
        tool = self.tools.get(tool_name)
        if tool is None:
            message = f"Tool {tool_name} is not served by this worker (queue {child.lock.queue})"
            return await self._record_child(child, failed(ERROR.TOOL_NOT_FOUND, message))
        if job.stalledCounter > tool.max_stalls:
            message = f"The worker running this child stopped responding {job.stalledCounter} times; giving up"
            return await self._record_child(child, failed(ERROR.JOB_LOST, message))
        try:
            args = tool.parse_arguments(arguments)
        except NonRetryableError as error:
            return await self._record_child(child, failed(ERROR.INVALID_ARGUMENTS, str(error)))
        wait = await self._admit(tool, arguments, job, entry)
        if wait is not None:
            return await self._delay_for_limit(job, token, tool, arguments, wait, entry.principal, log)
        timeout_ms = data.get("timeoutMs") if isinstance(data.get("timeoutMs"), int) else tool.timeout_ms
        ctx = self._child_context(child, tool, attempt)
        loop = asyncio.get_running_loop()
        timer = None if timeout_ms is None else loop.call_later(timeout_ms / 1000, self._abort, str(job.id), CANCEL.TIMEOUT)
        log.info("batch child started")
        ok, value, error = await self._run_tool(entry, tool, args, ctx, timer)
        ctx.close()
        return await self._end_child(child, tool, arguments, ctx, timeout_ms, ok, value, error)

    async def _start_child(self, job: Any, token: str, data: dict, entry: RunEntry, log: Logger) -> ChildScope | None:
        """Records the child's start under its job lock: its scope, or None when it is not to run."""
        assert self.store is not None
        parent_id, index, tool_name = data.get("taskId"), data.get("child"), data.get("tool")
        arguments = data.get("arguments")
        unreadable: str | None = None
        if not isinstance(parent_id, str) or not isinstance(index, int) or not isinstance(tool_name, str) or not isinstance(arguments, dict):
            # Data that cannot be read (issue 48 F5, §5.8) fails this child, recorded once; its id names it (§26.2).
            why = data.get(UNREADABLE_JOB_DATA)
            unreadable = f"Invalid job data: {why if isinstance(why, str) else 'it needs taskId, child, tool and an arguments object'}"
            ids = parse_batch_child_id(str(job.id))
            if ids is None:
                raise UnrecoverableError(unreadable)
            (parent_id, index), tool_name, arguments = ids, job.name, {}
        entry.parent_id = parent_id
        log.bind(parentId=parent_id, child=index)
        # In the sharded layout the job's shard is its queue's, not the one its id names (its parent's, §26.10).
        shard = shard_of_job(job) if self.keys.layout == "sharded" else None
        lock = JobLock(entry.queue, token, shard)
        entry.shard = shard
        start, owner, parent_pool = await self.store.start_child(parent_id, index, lock)
        owner = owner if start == "run" else (data.get("principal") or "")
        entry.principal = owner
        try:
            share_keys = self.keys.for_task(str(job.id)) if shard is None else self.keys.for_shard(shard)
            await self._redis.zrem(share_keys.fair_share(lock.queue, owner), str(job.id))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - the fair share prunes what it misses
            pass
        if start == "lock_lost":
            log.warn("child job lock already lost at start; tool not run", shard=shard)
            raise DelayedError()
        if start != "run":
            log.info("batch child not run (parent ended, batch stopped, or recorded)", outcome=start)
            return None
        return ChildScope(job, token, entry, log, lock, parent_id, index, owner, parent_pool, tool_name, arguments, unreadable)  # type: ignore[arg-type]

    def _child_context(self, child: ChildScope, tool: ToolDefinition, attempt: int) -> ToolContext:
        """A child's ``ctx``: no progress or task of its own; its output is its parent task's (§26.1, §34)."""
        assert self.store is not None
        job_id = str(child.job.id)
        ctx = ToolContext(
            task_id=job_id,
            tool=tool.name,
            attempt=attempt,
            signal=child.entry.signal,
            store=_NoProgressStore(self.store),  # type: ignore[arg-type]
            lock=child.lock,
            log=child.log,
            record=TaskRecord(task_id=job_id, status="working", principal="", tool=tool.name, fields={}),
            progress_interval_ms=self.config.progress_interval_ms,
            input_timeout_ms=tool.input_timeout_ms,
            queue_timeout_ms=DEFAULT_QUEUE_TIMEOUT_MS,
            on_lock_lost=lambda: self._abort(job_id, CANCEL.LOCK_LOST),
        )
        ctx.attach_output(RunOutput(self.store, self._output_limits, child.parent_id, child.owner, child.lock, job_id, child.log))
        return ctx

    async def _end_child(
        self,
        child: ChildScope,
        tool: ToolDefinition,
        arguments: dict,
        ctx: ToolContext,
        timeout_ms: int | None,
        ok: bool,
        value: Any,
        error: BaseException | None,
    ) -> Any:
        job, token, log = child.job, child.token, child.log
        action = settle(
            SettleInput(
                ok=ok,
                value=value,
                error=error,
                reason=child.entry.signal.reason,
                # A child cannot suspend (it has no task to wait in): a SuspendedError stops it with its batch.
                suspended=is_suspended_error(error),
                attempts_made=job.attemptsMade,
                attempts=int(job.opts.get("attempts") or 1),
            )
        )
        kind = action.kind
        if kind == "hand_back":
            return await self.hand_back(job, token, log, action.reason or CANCEL.LOCK_LOST)
        if kind == "timed_out":
            return await self._record_child(child, failed(ERROR.TIMEOUT, f"Tool {tool.name} timed out after {timeout_ms or 0} ms"))
        if kind in ("cancelled", "ended_by_gateway", "suspend"):
            log.info("batch child stopped with its batch")
            return None
        if kind == "complete":
            try:
                result = await ctx.finish_result(to_tool_result(tool, action.value), MAX_STORED_CHILD_RESULT_CHARS - 1_024)
                return await self._record_child(child, {"status": "completed", "result": result})
            except StoredBytesLimitError as bad:
                return await self._record_child(child, failed(ERROR.NON_RETRYABLE, str(bad)))
            except NonRetryableError as bad:
                return await self._record_child(child, {**failed(ERROR.NON_RETRYABLE, str(bad)), "error": serialize_error(bad)})
        if kind == "back_off":
            assert action.ms is not None
            await self._hold(tool, arguments, child.entry.principal, action.ms, log)
            try:
                await job.moveToDelayed(now_ms() + action.ms, token)
                log.info("batch child backs off; it runs again after the wait", retryAfterMs=action.ms)
            except Exception as moved:  # noqa: BLE001
                log.info("batch child not delayed (its lock is gone); it returns to the queue", err=moved)
            raise DelayedError()
        failure = action.error
        assert failure is not None
        if kind == "fail":
            serialized = serialize_error(failure)
            return await self._record_child(child, {**failed(serialized["code"], serialized["message"]), "error": serialized})
        log.warn("batch child failed; it will be retried", err=failure, attemptsMade=job.attemptsMade + 1)
        raise failure if isinstance(failure, Exception) else RuntimeError(str(failure))

    async def _record_child(self, child: ChildScope, outcome: dict) -> None:
        """Records the child's outcome once, under its job lock; moves its parent's progress, and wakes the parent when
        a window or the batch is done (§26.4)."""
        store = self.store
        assert store is not None
        log = child.log
        written = await write_through_outage(
            lambda: store.record_child(child.parent_id, child.index, child.owner, child.lock, outcome),
            bull_lock_ms(self.config.lock_duration_ms),
            log,
            "child outcome",
        )
        if written["outcome"] == "lock_lost":
            self._lost_while_writing(log, "child outcome")
        if written["outcome"] != "recorded":
            log.info("child outcome not recorded (already recorded, or the batch is gone)", outcome=written["outcome"])
            return
        self.metrics.batch_children.labels(child.tool_name, outcome["status"]).inc()
        done, size, failed_count = written["done"], written["size"], written["failed"]
        message = f"{done} of {size} children done ({failed_count} failed)"
        try:
            await store.record_progress(child.parent_id, done, size, message, None)
        except Exception as error:  # noqa: BLE001
            log.debug("batch progress write failed", err=error)
        promoted = written["wake"] and await self._promote(child.parent_pool, child.parent_id, log)
        # The parent should run and this record did not promote it (its run is live, queued, or lost with its
        # worker until a takeover): the child releases the next window itself (§26.3 step 4, batch_parent.py).
        if not promoted and (written["wake"] or written["below"]) and self.batches is not None:
            try:
                level = priority_level_of((child.job.opts or {}).get("priority") or 0)
                max_open = child.job.data.get("maxOpen") if isinstance(child.job.data, dict) else None
                await self.batches.release_from_child(child.parent_id, max_open, level, log)  # type: ignore[arg-type]
            except Exception as error:  # noqa: BLE001 - the parent's next run releases it
                log.warn("could not release the next window for a parent that is not waiting", err=error, parentId=child.parent_id)

"""``ctx.fan_out`` and ``ctx.batch_outcomes`` (PROTOCOL.md §26, §29.4): the parent's calls into the batch engine."""

from __future__ import annotations

import time
from typing import Any

from .batch_parent import FanOutHost, FanOutRun, redis_unavailable
from .context_checks import MAX_PAGE, batch_message, check_fan_out_args
from .context_types import Suspension
from .errors import SuspendedError, TaskCancelledError, TaskrelayError
from .log import Logger
from .protocol import CANCEL, ERROR, FIELDS
from .store import JobLock, TaskRecord, TaskStore


class BatchMembers:
    """The batch members of ``ToolContext`` (a mixin: they share the run's lock, record and suspension)."""

    task_id: str
    log: Logger
    suspension: Suspension | None
    _batch_host: FanOutHost | None
    _record: TaskRecord
    _store: TaskStore
    _lock: JobLock
    _queue_timeout_ms: int

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

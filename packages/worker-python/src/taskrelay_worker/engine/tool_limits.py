"""A run's side of its tool's own limits (PROTOCOL.md §3.5), as the Node worker's ``engine/tool-limits.ts`` is used by
its job run: admit the run or send its job to wait in the delayed set (no slot held, no attempt used), and hold a
shared rate limit on a back-off. The limits themselves are ``taskrelay_worker.limits``."""

from __future__ import annotations

from typing import Any

from bullmq.custom_errors import DelayedError

from ..limits import LimitWait
from ..log import Logger
from ..tools import ToolDefinition
from .bullmq_adapter import hold_takes, move_to_wait
from .end_write import now_ms
from .running_jobs import RunEntry


class RunLimits:
    """The limit waits of ``TaskrelayWorker`` (a part of it)."""

    async def _admit(self, tool: ToolDefinition, arguments: dict, job: Any, entry: RunEntry) -> LimitWait | None:
        """The tool's own limits (§3.5): None when the run may start, else why and how long it waits."""
        if self.limits is None or (tool.admitted_slot is None and tool.admitted_rate is None):
            return None

        async def promote(pool: str, job_id: str) -> str:
            """"woken", "there" (not delayed: still running, or woken already) or "gone" (no job, or it ended)."""
            if await self._promote(pool, job_id, self.log):
                return "woken"
            try:
                state = await self._queue_of(pool, job_id).getJobState(job_id)
            except Exception:  # noqa: BLE001 - unreadable counts as gone: the line must move on
                return "gone"
            return "gone" if state in ("unknown", "completed", "failed") else "there"

        return await self.limits.admit(tool, arguments, job, entry, promote, lambda ms: hold_takes(job, ms))

    async def _delay_for_limit(
        self, job: Any, token: str, tool: ToolDefinition, arguments: dict, wait: LimitWait, principal: str, log: Logger
    ) -> Any:
        """The refused run's job waits in the delayed set (no attempt used, no slot held); a slot waiter that slipped
        past its releaser's promotion promotes itself (§3.5 step 3)."""
        self.metrics.limit_waits.labels(tool.name, wait.limit).inc()
        if wait.paced:
            await self._back_to_front(job, token, wait, log)
        try:
            await job.moveToDelayed(now_ms() + wait.wait_ms, token)
        except Exception as moved:  # noqa: BLE001
            log.info("waiting job not delayed (its lock is gone); it returns to the queue", err=moved)
            raise DelayedError() from None
        if wait.limit == "slot" and self.limits is not None:
            try:
                if await self.limits.room_now(tool, arguments, job, principal):
                    await job.promote()
            except Exception as error:  # noqa: BLE001 - the delay's end brings it back
                log.debug("could not re-check the slot after waiting", err=error)
        log.info("run waits for its tool's limit, holding no slot", limit=wait.limit, waitMs=wait.wait_ms)
        raise DelayedError()

    async def _back_to_front(self, job: Any, token: str, wait: LimitWait, log: Logger) -> None:
        """A plain rate limit's refused run (§3.3, step 3): the queue's bullmq limiter is held for the wait first, so
        no worker takes the job again before there is room, then the job goes back to the front of its wait list, its
        attempts kept; ``DelayedError`` tells bullmq the move is done. The hold's marker wakes a worker when it ends:
        bullmq's move back sets none for a job with a priority (every taskrelay job has one)."""
        try:
            await hold_takes(job, wait.wait_ms)
        except Exception as error:  # noqa: BLE001 - a take refused again costs a take; nothing is lost
            log.debug("queue's rate limiter not held", err=error)
        try:
            await move_to_wait(job, token)
        except Exception as moved:  # noqa: BLE001
            log.info("waiting job not moved back (its lock is gone); it returns to the queue", err=moved)
            raise DelayedError() from None
        log.info("run waits for its tool's rate limit at the front of its queue", limit=wait.limit, waitMs=wait.wait_ms)
        raise DelayedError()

    async def _hold(self, tool: ToolDefinition, arguments: dict, principal: str, ms: int, log: Logger) -> None:
        """A back-off of a tool with its own rate limit holds it for every tool that shares it (§3.4, §3.5)."""
        if self.limits is None or tool.admitted_rate is None:
            return
        try:
            await self.limits.hold(tool, arguments, principal, ms)
        except Exception as error:  # noqa: BLE001
            log.warn("could not hold the shared rate limit", err=error)

"""A first run's start, pipelined with its tool (PROTOCOL.md §21.2.1), as the Node worker's
``engine/first-run-start.ts``: which runs may start that way, and what the start's answer means for the run."""

from __future__ import annotations

import asyncio
from typing import Any

from ..log import Logger
from ..protocol import CANCEL
from ..store import TERMINAL, TaskRecord
from ..tools import ToolDefinition
from .end_write import now_ms


class FirstRunStart:
    """The pipelined start of ``TaskrelayWorker`` (a part of it)."""

    def _first_run(
        self, job: Any, task_id: str, data: dict, principal: str | None, queue_timeout_ms: int
    ) -> ToolDefinition | None:
        """The tool of a first run, whose start is pipelined (§21.2.1), or None when this run awaits its start before
        its tool as every other does: bullmq's first fetch of the job, data naming its principal and a tool served here
        without per-key or shared limits, and the job younger than half its queue timeout."""
        if int(getattr(job, "attemptsStarted", 0) or 0) != 1 or principal is None or data.get("taskId") != task_id:
            return None
        tool = self.tools.get(data.get("tool")) if isinstance(data.get("tool"), str) else None
        if tool is None or tool.admitted_slot is not None or tool.admitted_rate is not None:
            return None
        delay = int((getattr(job, "opts", None) or {}).get("delay") or 0)
        if now_ms() - int(getattr(job, "timestamp", 0) or 0) - delay > queue_timeout_ms / 2:
            return None
        return tool

    async def _read_start(self, started: asyncio.Future, task_id: str, log: Logger) -> bool | None:
        """A first run's start answered: True when the run goes on (the start answers without the task's hash, issue
        46: the context reads it when a member needs it), or None when the run must stop, its signal aborted at once
        (one round trip after the run began). Never raises."""
        try:
            lock_lost, task, goes = await started
        except Exception as error:  # noqa: BLE001 - as at a start before the tool: the job is handed back
            log.warn("Redis unreachable while recording the start; the run stops", err=error)
            self._abort(task_id, CANCEL.LOCK_LOST)
            return None
        if lock_lost:
            self._abort(task_id, CANCEL.LOCK_LOST)
            return None
        if goes:
            return True
        if task is None or task.status in TERMINAL:
            # Cancelled (or ended, or deleted) before this run began, and the cancel's remove did not reach the job.
            reason = CANCEL.LOCK_LOST
            if task is not None and task.status == "cancelled":
                reason = task.cancel_reason or CANCEL.CLIENT_CANCELLED
            elif task is not None and task.status == "failed" and '"TIMEOUT"' in task.fields.get("error", ""):
                reason = CANCEL.TIMEOUT
            status = task.status if task is not None else "missing"
            log.info("task ended before its run recorded its start; aborting tool", status=status)
            self._abort(task_id, reason)
            return None
        return True

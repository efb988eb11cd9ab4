"""The runs of this process (PROTOCOL.md §7), as the Node worker's ``engine/running-jobs.ts``: one entry per job id
while its run lasts, and the abort of a run's signal, with the grace after which its asyncio task is cancelled."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from ..context import RunSignal


@dataclass
class RunEntry:
    signal: RunSignal
    token: str
    queue: str
    parent_id: str | None = None
    run_task: asyncio.Task | None = None
    grace: asyncio.TimerHandle | None = None
    aborted_at: float | None = None
    #: Gives back the run's slot of a per-key limit (§3.5); called as the run ends, however it ends.
    release: Any = None
    #: Whose keyed limits the run counts in (§3.5): the task's principal, or a batch child's owner.
    principal: str = ""
    #: The tool has returned and the run writes its own end: the cancel sweep leaves it alone, or it would take the
    #: terminal status the run itself just wrote for another's (``LOCK_LOST``, issue 48 F6).
    settling: bool = False
    #: The sharded layout: the shard of the job's queue when its id names another (a batch child's, §26.10), where
    #: its lock is.
    shard: str | None = None


class RunningJobs:
    """The aborts of ``TaskrelayWorker.running`` (a part of ``TaskrelayWorker``)."""

    running: dict[str, RunEntry]

    def _abort(self, task_id: str, reason: str) -> None:
        entry = self.running.get(task_id)
        if entry is None or entry.signal.aborted:
            return
        entry.signal.abort(reason)
        entry.aborted_at = time.monotonic()
        self.log.info("tool signal aborted", taskId=task_id, reason=reason)

        def past_grace() -> None:
            if entry.run_task is not None and not entry.run_task.done():
                self.log.warn(
                    "tool still running after its cancellation; its asyncio task is cancelled",
                    taskId=task_id,
                    reason=reason,
                    abortGraceMs=self.config.abort_grace_ms,
                )
                entry.run_task.cancel()

        entry.grace = asyncio.get_running_loop().call_later(self.config.abort_grace_ms / 1000, past_grace)

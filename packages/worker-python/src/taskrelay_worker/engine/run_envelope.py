"""The envelope of every run a worker makes, a task's (``job_run.py``) and a batch child's (``child_run.py``) alike
(PROTOCOL.md §21.2), as the Node worker's ``engine/run-envelope.ts``: the run is tracked in ``running`` before anything
is read (a cancel during its start is not lost); Redis lost while the run records its start or outcome is not the
tool's fault (the job is handed back, no attempt used); one hand-back for a draining worker, a lost lock and a lost
Redis alike; the entry is released only by the run that added it; the tool runs as an asyncio task of its own."""

from __future__ import annotations

import asyncio
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..context import RunSignal, ToolContext
from ..errors import TaskCancelledError
from ..keys import parse_batch_child_id, queue_of_bull_name
from ..log import Logger
from ..protocol import CANCEL
from ..tools import ToolDefinition
from .bullmq_adapter import move_to_wait, wake_idle_workers
from .end_write import is_redis_loss
from .running_jobs import RunEntry

#: setTimeout's ceiling in the Node worker: a longer timeout counts as none.
MAX_TIMER_MS = 2_147_483_647


class RunEnvelope:
    """BullMQ's processor of ``TaskrelayWorker`` (a part of it): what surrounds every run."""

    async def process(self, job: Any, token: str) -> Any:
        task_id = str(job.id)
        data = job.data if isinstance(job.data, dict) else {}
        attempt = max(1, int(getattr(job, "attemptsStarted", 0) or 0) or job.attemptsMade + 1)
        log = self.log.child(taskId=task_id, jobId=task_id, tool=job.name, attempt=attempt)
        if isinstance(data.get("principal"), str):
            log.bind(principal=data["principal"])
        queue = queue_of_bull_name(job.queue.name)
        entry = RunEntry(signal=RunSignal(), token=token, queue=queue)
        self.running[task_id] = entry
        # Several runs at once: their script calls of one turn go to Redis as one pipeline (§21.2.2).
        self.store.coalesce = len(self.running) > 1
        started = self.metrics.run_started(job)
        try:
            if (isinstance(data.get("child"), int) and not isinstance(data.get("child"), bool)) or parse_batch_child_id(task_id):
                return await self._run_child(job, token, data, attempt, entry, log)
            return await self._run(job, token, task_id, data, attempt, entry, log)
        except (DelayedError, UnrecoverableError):
            raise
        except Exception as error:
            if is_redis_loss(error):
                self.metrics.redis_errors.labels("commands").inc()
                log.warn("Redis unreachable while recording the run; handing the job back", err=error)
                return await self.hand_back(job, token, log, CANCEL.LOCK_LOST)
            raise
        finally:
            self.metrics.run_ended(job.name, started, entry.aborted_at, entry.signal.reason)
            await self._release(task_id, entry, log)

    async def _release(self, task_id: str, entry: RunEntry, log: Logger) -> None:
        """The run is over, however it ended: its grace timer, its limit slot and its entry go."""
        if entry.grace is not None:
            entry.grace.cancel()
        if entry.release is not None:
            try:
                await entry.release()
            except Exception as error:  # noqa: BLE001 - its lease ends it
                log.warn("could not give back the run's limit slot; its lease ends it", err=error)
        if self.running.get(task_id) is entry:
            del self.running[task_id]
            self.store.coalesce = len(self.running) > 1

    async def _run_tool(
        self, entry: RunEntry, tool: ToolDefinition, args: Any, ctx: ToolContext, timer: asyncio.TimerHandle | None
    ) -> tuple[bool, Any, BaseException | None]:
        """Runs the handler as an asyncio task of its own (its cancel grace cancels it, §29.1), for a task and a batch
        child alike: (returned, its value, what it raised; a task cancelled after the grace raised the cancel)."""
        entry.run_task = asyncio.ensure_future(tool.run(args, ctx))
        await asyncio.wait({entry.run_task})
        if timer is not None:
            timer.cancel()
        if entry.run_task.cancelled():
            return False, None, TaskCancelledError(entry.signal.reason or CANCEL.WORKER_SHUTDOWN)
        if entry.run_task.exception() is not None:
            return False, None, entry.run_task.exception()
        return True, entry.run_task.result(), None

    async def hand_back(self, job: Any, token: str, log: Logger, reason: str = CANCEL.WORKER_SHUTDOWN) -> Any:
        """Puts the job back at the front of its queue without using an attempt (§5.7), and wakes idle workers."""
        try:
            await move_to_wait(job, token)
        except Exception as error:  # noqa: BLE001
            log.info("job not put back (its lock is gone); it is with, or returns to, the queue", err=error, reason=reason)
            raise DelayedError() from None
        log.info("job put back, at the front of its queue, for another worker", reason=reason)
        try:
            await wake_idle_workers(job.queue.client, job.queue.keys)
        except Exception as error:  # noqa: BLE001
            log.debug("could not wake idle workers", err=error)
        raise DelayedError()

"""How a task's run ends (PROTOCOL.md §21.3, §12, §3.4), as the second half of the Node worker's ``engine/job-run.ts``:
carry out what ``settle`` decides from what the tool did, why its signal aborted and whether it suspended."""

from __future__ import annotations

import time
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..context import Suspension, ToolContext
from ..errors import NonRetryableError, RetryAfterError, SuspendedError, TaskrelayError, serialize_error
from ..log import Logger
from ..output import StoredBytesLimitError
from ..tools import ToolDefinition, to_tool_result
from .end_write import now_ms
from .job_run import RunScope, TaskTimeout

#: What a task whose run went back says until its next run starts (§5.7); the Node worker says the same.
HANDED_BACK_MESSAGE = "Waiting to be resumed: its worker stopped and put its run back in the queue"


class JobEnd:
    """The end of a task's run in ``TaskrelayWorker`` (a part of it)."""

    async def _end_run(
        self,
        run: RunScope,
        tool: ToolDefinition,
        arguments: dict,
        ctx: ToolContext,
        timeout: TaskTimeout,
        ok: bool,
        value: Any,
        error: BaseException | None,
    ) -> Any:
        assert self.store is not None
        job, token, task_id, lock, log = run.job, run.token, run.task_id, run.lock, run.log
        reason = run.entry.signal.reason
        # settle (§21.3): the abort reason first, then the suspension, then the outcome.
        if reason == "LOCK_LOST":
            ctx.close()
            log.warn("run ended after losing the job lock; nothing recorded", returned=ok)
            return await self.hand_back(job, token, log, "LOCK_LOST")
        if reason == "TIMEOUT":
            ctx.close()
            if timeout.write is not None:
                await timeout.write
            raise UnrecoverableError(timeout.message)
        if reason == "CLIENT_CANCELLED":
            ctx.close()
            if ok:
                log.info("tool returned after its task was cancelled; result discarded")
            await self._ensure_cancelled(task_id, lock, log)
            return None
        if reason == "GATEWAY_SHUTDOWN":
            ctx.close()
            log.info("tool stopped: the gateway holding its call shut down", reason=reason)
            return None
        if ctx.suspension is not None:
            await ctx.flush()
            ctx.close()
            if ok or not isinstance(error, SuspendedError):
                log.warn("tool went on after its run suspended; what it returned or raised is discarded")
            return await self._suspend_job(job, token, task_id, ctx.suspension, log)
        if reason == "WORKER_SHUTDOWN" and not ok:
            ctx.close()
            # Until its next run starts (whose start clears it), the task says it waits, not its last progress (§5.7).
            try:
                await self.store.suspend(
                    task_id, lock, now_ms() + run.queue_timeout_ms, status_message=HANDED_BACK_MESSAGE
                )
            except Exception as error:  # noqa: BLE001 - a failed write costs only the message
                log.debug("could not say that the task waits to be resumed", err=error)
            return await self.hand_back(job, token, log, "WORKER_SHUTDOWN")
        if ok:
            try:
                result = await ctx.finish_result(to_tool_result(tool, value))
            except StoredBytesLimitError as bad:
                ok, error = False, NonRetryableError(str(bad))
            except NonRetryableError as bad:
                ok, error = False, bad
            else:
                await ctx.flush()
                ctx.close()
                written, status, lost = await self._write_end(task_id, "completed", {"result": result}, lock, log)
                if written:
                    log.info("task completed")
                elif lost:
                    self._lost_while_writing(log, "result")
                else:
                    log.info("task already terminal; result discarded", status=status or "missing")
                return None
        await ctx.flush()
        ctx.close()
        if isinstance(error, RetryAfterError):
            until = now_ms() + int(error.retry_after * 1000)
            iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(until / 1000)) + f".{until % 1000:03d}Z"
            held, _ = await self.store.suspend(
                task_id, lock, until + run.queue_timeout_ms, status_message=f"Backing off until {iso}: {error}"
            )
            if held == "lock_lost":
                self._lost_while_writing(log, "back-off")
            if held == "gone":
                log.info("task ended meanwhile; no back-off")
                return None
            log.info("upstream asked to retry later; the run ends, holding no slot", retryAfterMs=until - now_ms())
            await self._hold(tool, arguments, run.entry.principal, int(error.retry_after * 1000), log)
            return await self._suspend_job(job, token, task_id, Suspension("time", until), log)
        assert error is not None
        attempts = int(job.opts.get("attempts") or 1)
        non_retryable = isinstance(error, (NonRetryableError, UnrecoverableError, SuspendedError)) or (
            isinstance(error, TaskrelayError) and error.code == "PROTOCOL_ERROR"
        )
        if non_retryable or job.attemptsMade + 1 >= attempts:
            serialized = serialize_error(error)
            await self._fail_task(task_id, lock, serialized["message"], serialized, log, error)
            raise UnrecoverableError(serialized["message"])
        log.warn("tool failed; the job will be retried", err=error, attempts=attempts, attemptsMade=job.attemptsMade + 1)
        raise error if isinstance(error, Exception) else RuntimeError(str(error))

    async def _suspend_job(self, job: Any, token: str, task_id: str, suspension: Suspension, log: Logger) -> Any:
        """The job waits in BullMQ's delayed set, holding no slot, until its answer or time (§12); no attempt used."""
        until = suspension.until + self.config.lock_duration_ms if suspension.kind == "input" else suspension.until
        try:
            await job.moveToDelayed(until, token)
        except Exception as error:  # noqa: BLE001
            log.info("suspended job not delayed (its lock is gone); it is with, or returns to, the queue", err=error)
            raise DelayedError() from None
        if suspension.kind == "input":
            try:
                task = await self.store.get(task_id)  # type: ignore[union-attr]
                # Every question answered (or the task ended) while suspending: nobody else will promote it.
                if task is None or task.status != "input_required":
                    await job.promote()
                    log.info("answered (or ended) while suspending; job promoted", inputRequest=suspension.n)
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the gateway's promote, or the delay, brings it back
                log.warn("could not re-check the task after suspending", err=error)
            log.info("run suspended until the input request is answered", inputRequest=suspension.n, until=until)
        elif suspension.waitpoint is not None:
            try:
                # Called (or ended) while the run was suspending: its promotion was refused, so promote here (§32.3).
                record = await self.store.read_waitpoint(task_id, suspension.waitpoint)  # type: ignore[union-attr]
                if record is None or record.get("state") != "waiting":
                    await job.promote()
                    log.info("waitpoint called (or ended) while suspending; job promoted", waitpoint=suspension.waitpoint)
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the waitpoint's timeout brings the job back
                log.warn("could not re-check the waitpoint after suspending", err=error)
            log.info("run suspended until its waitpoint is called", waitpoint=suspension.waitpoint, until=until)
        else:
            log.info("run suspended", until=until)
        raise DelayedError()

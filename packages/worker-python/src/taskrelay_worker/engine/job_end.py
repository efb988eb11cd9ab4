"""How a task's run ends (PROTOCOL.md §21.3, §12, §3.4), as the second half of the Node worker's ``engine/job-run.ts``:
carries out what the pure ``settle`` (``settle.py``) decides from what the tool did, why its signal aborted and whether
it suspended."""

from __future__ import annotations

import time
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..context import Suspension, ToolContext
from ..errors import NonRetryableError, serialize_error
from ..log import Logger
from ..output import StoredBytesLimitError
from ..protocol import CANCEL
from ..tools import ToolDefinition, to_tool_result
from .end_write import now_ms
from .job_run import RunScope, TaskTimeout
from .settle import SettleAction, SettleInput, fail_or_retry, settle

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
        attempts = int(run.job.opts.get("attempts") or 1)
        action = settle(
            SettleInput(
                ok=ok,
                value=value,
                error=error,
                reason=run.entry.signal.reason,
                suspended=ctx.suspension is not None,
                attempts_made=run.job.attemptsMade,
                attempts=attempts,
            )
        )
        log = run.log
        if action.kind == "complete":
            try:
                result = await ctx.finish_result(to_tool_result(tool, action.value))
            except StoredBytesLimitError as bad:
                action = fail_or_retry(NonRetryableError(str(bad)), run.job.attemptsMade, attempts)
            except NonRetryableError as bad:
                action = fail_or_retry(bad, run.job.attemptsMade, attempts)
            else:
                await ctx.flush()
                ctx.close()
                return await self._complete(run, result)
        if action.kind in ("suspend", "back_off", "fail", "retry"):
            # The run's last output and progress go out before its job moves.
            await ctx.flush()
        ctx.close()
        if action.kind == "hand_back" and action.reason == CANCEL.LOCK_LOST:
            log.warn("run ended after losing the job lock; nothing recorded", returned=ok)
            return await self.hand_back(run.job, run.token, log, CANCEL.LOCK_LOST)
        if action.kind == "hand_back":
            return await self._hand_back_drained(run)
        if action.kind == "timed_out":
            if timeout.write is not None:
                await timeout.write
            raise UnrecoverableError(timeout.message)
        if action.kind == "cancelled":
            if action.discarded:
                log.info("tool returned after its task was cancelled; result discarded")
            await self._ensure_cancelled(run.task_id, run.lock, log)
            # A parent cancelled during its run (releasing, say) has no later run to stop its children: this one does.
            await self._stop_batch(run.task_id, log)
            return None
        if action.kind == "ended_by_gateway":
            log.info("tool stopped: the gateway holding its call shut down", reason=run.entry.signal.reason)
            return None
        if action.kind == "suspend":
            if action.went_on:
                log.warn("tool went on after its run suspended; what it returned or raised is discarded")
            assert ctx.suspension is not None
            return await self._suspend_job(run.job, run.token, run.task_id, ctx.suspension, log)
        if action.kind == "back_off":
            return await self._back_off(run, tool, arguments, action)
        return await self._end_failed(run, action, attempts)

    async def _complete(self, run: RunScope, result: Any) -> None:
        """The result is the task's, unless the task ended meanwhile or another run owns it."""
        log = run.log
        written, status, lost = await self._write_end(run.task_id, "completed", {"result": result}, run.lock, log)
        if written:
            log.info("task completed")
        elif lost:
            self._lost_while_writing(log, "result")
        else:
            log.info("task already terminal; result discarded", status=status or "missing")

    async def _hand_back_drained(self, run: RunScope) -> Any:
        """A run the drain stopped goes back for another worker (§5.7)."""
        assert self.store is not None
        # Until its next run starts (whose start clears it), the task says it waits, not its last progress (§5.7).
        try:
            until = now_ms() + run.queue_timeout_ms
            await self.store.suspend(run.task_id, run.lock, until, status_message=HANDED_BACK_MESSAGE)
        except Exception as error:  # noqa: BLE001 - a failed write costs only the message
            run.log.debug("could not say that the task waits to be resumed", err=error)
        return await self.hand_back(run.job, run.token, run.log, CANCEL.WORKER_SHUTDOWN)

    async def _back_off(self, run: RunScope, tool: ToolDefinition, arguments: dict, action: SettleAction) -> Any:
        """The upstream said to come back later (§3.4): the task says until when, the job waits in the delayed set
        holding no slot, and a shared rate limit is held for every tool that shares it."""
        assert self.store is not None and action.ms is not None
        self.metrics.back_offs.labels(tool.name).inc()
        log = run.log
        until = now_ms() + action.ms
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(until / 1000)) + f".{until % 1000:03d}Z"
        held, _ = await self.store.suspend(
            run.task_id, run.lock, until + run.queue_timeout_ms, status_message=f"Backing off until {iso}: {action.message}"
        )
        if held == "lock_lost":
            self._lost_while_writing(log, "back-off")
        if held == "gone":
            log.info("task ended meanwhile; no back-off")
            return None
        log.info("upstream asked to retry later; the run ends, holding no slot", retryAfterMs=until - now_ms())
        await self._hold(tool, arguments, run.entry.principal, action.ms, log)
        return await self._suspend_job(run.job, run.token, run.task_id, Suspension("time", until), log)

    async def _end_failed(self, run: RunScope, action: SettleAction, attempts: int) -> Any:
        """A failed run: the task fails (and the job ends unrecoverably), or BullMQ retries the job."""
        error = action.error
        assert error is not None
        if action.kind == "fail":
            serialized = serialize_error(error)
            await self._fail_task(run.task_id, run.lock, serialized["message"], serialized, run.log, error)
            raise UnrecoverableError(serialized["message"])
        made = run.job.attemptsMade + 1
        run.log.warn("tool failed; the job will be retried", err=error, attempts=attempts, attemptsMade=made)
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
        elif suspension.batch and self.batches is not None:
            try:
                # Its children may all have finished while it suspended, their promotions refused (it was active).
                if await self.batches.should_wake(task_id):
                    await job.promote()
                    log.info("batch children done while suspending; job promoted")
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the poll brings the job back
                log.warn("could not re-check the batch after suspending; the poll brings the job back", err=error)
            log.debug("run suspended while its batch children run", until=until)
        else:
            log.info("run suspended", until=until)
        raise DelayedError()

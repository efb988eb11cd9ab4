"""A run's terminal write through a Redis outage (PROTOCOL.md §10.10), as the Node worker's ``engine/end-write.ts``: a
write that fails because Redis is unreachable (a cluster's failover, say) is tried again with backoff while the job's
lock may still be this run's. Every try names the lock, so a late one is refused rather than written over another run's
outcome. Also the run's terminal writes themselves (``EndWrites``): a failure, a cancel, the result's write.

Hand-written: the retry is bounded by the lock's lifetime and logs each step with the run's logger, which a generic
retry library would only wrap, not save."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bullmq.custom_errors import DelayedError
from redis import exceptions as redis_errors

from ..log import Logger
from ..protocol import CANCEL, ERROR
from ..store import JobLock


def now_ms() -> int:
    return int(time.time() * 1000)


#: What a cluster raises during a failover (PROTOCOL.md §10.10), beside the connection and timeout errors: the names
#: redis-py defines (looked up, so an older redis-py without one still imports).
_FAILOVER_ERRORS: tuple[type[BaseException], ...] = tuple(
    error
    for name in ("ClusterError", "ClusterDownError", "TryAgainError", "MasterDownError", "ReadOnlyError", "SlotNotCoveredError")
    if isinstance(error := getattr(redis_errors, name, None), type)
)
#: The same answers as a plain ResponseError (from a script or a pipeline): the first word of the reply.
_FAILOVER_REPLIES = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY", "UNBLOCKED", "MOVED", "ASK")


def bull_lock_ms(lock_duration_ms: int) -> int:
    """BullMQ's lock for a worker lock duration L (PROTOCOL.md §10.5): 2L/3, as the worker sets it."""
    return max(100, round(lock_duration_ms * 2 / 3))


def is_redis_loss(error: BaseException) -> bool:
    """Redis could not be reached or could not serve yet (a failover), as opposed to an error it answered with."""
    if isinstance(error, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, *_FAILOVER_ERRORS)):
        return True
    return isinstance(error, redis_errors.ResponseError) and str(error).split(" ", 1)[0] in _FAILOVER_REPLIES


async def write_through_outage(write: Any, window_ms: int, log: Logger, what: str) -> Any:
    """Runs ``write()`` (a coroutine factory), and again after a Redis-lost failure (a cluster's failover) with backoff
    (100 ms doubling to 1 s) until it answers or ``window_ms`` since the first failure passed: as long as the job's lock
    may still be this run's (PROTOCOL.md §10.10). Each try names the lock, so a late one is refused, never written over
    another run's outcome. Then the last error is raised (the job is handed back, or returns when its lock expires)."""
    failed_at: int | None = None
    retries = 0
    delay_ms = 100
    while True:
        try:
            outcome = await write()
        except Exception as error:
            if not is_redis_loss(error):
                raise
            now = now_ms()
            failed_at = now if failed_at is None else failed_at
            if now - failed_at + delay_ms > window_ms:
                log.error(
                    f"{what} lost: Redis unreachable for as long as this run could hold the job lock; "
                    "the job returns to the queue and runs again",
                    err=error, retries=retries, pausedMs=now - failed_at, windowMs=window_ms, reason=ERROR.REDIS_UNAVAILABLE,
                )
                raise
            if retries == 0:
                log.warn(
                    f"{what} write failed: Redis unreachable; retrying while this run may still hold the job lock",
                    err=error, windowMs=window_ms,
                )
            retries += 1
            await asyncio.sleep(delay_ms / 1000)
            delay_ms = min(delay_ms * 2, 1000)
            continue
        if failed_at is not None:
            log.info(f"{what} written after Redis answered again", retries=retries, pausedMs=now_ms() - failed_at)
        return outcome


class EndWrites:
    """The task's terminal writes of a run (a part of ``TaskrelayWorker``): each through an outage, each refused once
    the job's lock is another run's."""

    async def _fail_task(
        self, task_id: str, lock: JobLock, message: str, error: dict, log: Logger, cause: BaseException | None = None
    ) -> None:
        assert self.store is not None
        fields: dict[str, Any] = {"statusMessage": message, "error": error}
        if error.get("code") != ERROR.PROTOCOL_ERROR:
            fields["result"] = {"content": [{"type": "text", "text": message}], "isError": True}
        written, status, lost = await self._write_end(task_id, "failed", fields, lock, log)
        if written:
            log.info("task failed", code=error.get("code"), statusMessage=message, **({"err": cause} if cause else {}))
        elif lost:
            self._lost_while_writing(log, "failure")
        else:
            log.info("task already terminal; failure lost", status=status or "missing", statusMessage=message)

    async def _ensure_cancelled(self, task_id: str, lock: JobLock, log: Logger) -> None:
        assert self.store is not None
        written, status, lost = await self._write_end(
            task_id, "cancelled", {"cancelReason": CANCEL.CLIENT_CANCELLED, "statusMessage": "Cancelled"}, lock, log
        )
        if written:
            log.info("task was not terminal; marked cancelled")
        elif lost:
            self._lost_while_writing(log, "cancel")
        else:
            log.info("tool stopped; task already terminal", status=status or "missing")

    async def _write_end(self, task_id: str, to: str, fields: dict, lock: JobLock, log: Logger) -> Any:
        """A terminal write, through a Redis outage while the job's lock may still be this run's (§10.10)."""
        assert self.store is not None
        store = self.store
        what = {"completed": "result", "failed": "failure", "cancelled": "cancel"}.get(to, to)
        return await write_through_outage(
            lambda: store.transition(task_id, to, fields, lock), bull_lock_ms(self.config.lock_duration_ms), log, what
        )

    def _lost_while_writing(self, log: Logger, what: str) -> None:
        log.warn(f"{what} refused: this worker no longer holds the job; another run owns the task", reason=CANCEL.LOCK_LOST)
        raise DelayedError()

"""The errors a tool raises or meets, with the Node worker's codes (``TaskrelayError`` codes in packages/shared)."""

from __future__ import annotations
from .protocol import ERROR


class TaskrelayError(Exception):
    """An error with one of taskrelay's codes (``CAPABILITY_MISSING``, ``INTERNAL``...); the task's ``error.code``."""

    def __init__(self, code: str, message: str, data: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class NonRetryableError(TaskrelayError):
    """Fails the task at once, whatever attempts are left: no retry can mend it (bad input upstream, a 4xx)."""

    def __init__(self, message: str) -> None:
        super().__init__(ERROR.NON_RETRYABLE, message)


class RetryAfterError(Exception):
    """The upstream said to come back later (PROTOCOL.md §3.4): the run ends holding no slot, the task stays
    ``working`` with "Backing off until ..." as its status message, and the next run starts ``retry_after`` seconds
    later. No attempt is used."""

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        if not isinstance(retry_after, (int, float)) or isinstance(retry_after, bool) or not retry_after >= 0:
            raise ValueError(f"RetryAfterError needs a non-negative number of seconds (got {retry_after!r})")
        super().__init__(message or f"retry after {retry_after} s")
        self.retry_after = float(retry_after)


class TaskCancelledError(Exception):
    """Raised by ``ctx.throw_if_cancelled()`` and ``ctx.sleep()`` once the run's cancellation is set. ``reason`` is the
    cancel reason: ``CLIENT_CANCELLED``, ``TIMEOUT``, ``WORKER_SHUTDOWN``, ``GATEWAY_SHUTDOWN`` or ``LOCK_LOST``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"Task cancelled: {reason}")
        self.reason = reason


class SuspendedError(BaseException):
    """The run suspended (``ctx.elicit``, ``ctx.sample``, ``ctx.suspend``): let it propagate. A ``BaseException``,
    like ``asyncio.CancelledError``, so an ``except Exception`` in a tool does not swallow it."""

    def __init__(self) -> None:
        super().__init__("The run suspended; it resumes from the top when its input arrives or its time comes")


def serialize_error(error: BaseException) -> dict:
    if isinstance(error, TaskrelayError):
        out: dict = {"code": error.code, "message": str(error)}
        if error.data is not None:
            out["data"] = error.data
        return out
    return {"code": ERROR.TOOL_FAILED, "message": str(error) or type(error).__name__}

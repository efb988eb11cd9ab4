"""How a run ends (PROTOCOL.md §21.3), as the Node worker's ``engine/stages/settle.ts``: a pure decision from what the tool did,
why its signal aborted (if it did) and whether it suspended, to what the worker does with the task and the job. No I/O
here; ``job_end.py`` carries it out. Both workers test it from one table, ``test/vectors/settle.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bullmq.custom_errors import UnrecoverableError

from ..errors import RetryAfterError, SuspendedError
from ..protocol import CANCEL, ERROR

Kind = Literal[
    "hand_back", "timed_out", "cancelled", "ended_by_gateway", "suspend", "complete", "back_off", "fail", "retry"
]
#: Codes no retry can mend, from an error of any class (another copy of the package, a tool's own): Node's list.
NON_RETRYABLE_CODES = (ERROR.NON_RETRYABLE, ERROR.PROTOCOL_ERROR, ERROR.MEMORY_LIMIT)


@dataclass(frozen=True)
class SettleInput:
    #: The handler returned (``value``) or raised (``error``).
    ok: bool
    value: Any = None
    error: BaseException | None = None
    #: Why the run's signal aborted; None when it did not.
    reason: str | None = None
    #: The run suspended (``ctx.elicit``, ``ctx.sample``, ``ctx.suspend``): what the handler did after it is discarded.
    suspended: bool = False
    #: Runs of this job that failed before this one (BullMQ's ``attemptsMade``).
    attempts_made: int = 0
    #: Runs the job may use (BullMQ's ``opts.attempts``; 1 when unset).
    attempts: int = 1


@dataclass(frozen=True)
class SettleAction:
    """What the worker does once the handler is done; only the fields of its ``kind`` are set.

    - ``hand_back`` (``reason``): the job goes back without using an attempt; the task stays as it is.
    - ``timed_out`` (``discarded``): the timeout failed the task when it fired; the job ends unrecoverably.
    - ``cancelled`` (``discarded``): the task is made sure cancelled; the job ends done.
    - ``ended_by_gateway``: the gateway holding the plain call ended it; nothing is written.
    - ``suspend`` (``went_on``: the handler ignored its suspension): the job waits in the delayed set (§12).
    - ``complete`` (``value``): the returned value is the task's result.
    - ``back_off`` (``ms``, ``message``): the upstream said to come back later; no attempt used (§3.4).
    - ``fail`` (``error``): the task fails and the job ends unrecoverably.
    - ``retry`` (``error``): the task stays ``working`` and BullMQ retries the job."""

    kind: Kind
    reason: str | None = None
    discarded: bool | None = None
    went_on: bool | None = None
    value: Any = None
    ms: int | None = None
    message: str | None = None
    error: BaseException | None = None


def settle(run: SettleInput) -> SettleAction:
    """The action for a run's end. Order matters: an abort reason wins over a suspension, which wins over the outcome."""
    reason = run.reason
    # Another run may own the task now: nothing more is written.
    if reason == CANCEL.LOCK_LOST:
        return SettleAction("hand_back", reason=reason)
    if reason == CANCEL.TIMEOUT:
        return SettleAction("timed_out", discarded=run.ok)
    if reason == CANCEL.CLIENT_CANCELLED:
        return SettleAction("cancelled", discarded=run.ok)
    if reason == CANCEL.GATEWAY_SHUTDOWN:
        return SettleAction("ended_by_gateway")
    if run.suspended:
        return SettleAction("suspend", went_on=run.ok or not is_suspended_error(run.error))
    # A draining worker keeps a finished result; anything else goes back for another worker.
    if reason == CANCEL.WORKER_SHUTDOWN and not run.ok:
        return SettleAction("hand_back", reason=reason)
    if run.ok:
        return SettleAction("complete", value=run.value)
    back_off_ms = retry_after_ms(run.error)
    if back_off_ms is not None:
        return SettleAction("back_off", ms=back_off_ms, message=str(run.error))
    return fail_or_retry(run.error, run.attempts_made, run.attempts)


def fail_or_retry(error: BaseException | None, attempts_made: int, attempts: int) -> SettleAction:
    """A failed run: fail the task when the error cannot be mended or this was the last attempt, retry otherwise."""
    if is_non_retryable(error) or attempts_made + 1 >= attempts:
        return SettleAction("fail", error=error)
    return SettleAction("retry", error=error)


def is_suspended_error(error: object) -> bool:
    """A ``SuspendedError``, of this package or by its name."""
    return isinstance(error, SuspendedError) or type(error).__name__ == "SuspendedError"


def retry_after_ms(error: object) -> int | None:
    """The wait a ``RetryAfterError`` asks for, in ms; a foreign one's by its name and its ``retry_after_ms``."""
    if isinstance(error, RetryAfterError):
        return int(error.retry_after * 1000)
    wait = getattr(error, "retry_after_ms", None)
    if type(error).__name__ == "RetryAfterError" and isinstance(wait, (int, float)) and wait > 0:
        return int(wait)
    return None


def is_non_retryable(error: object) -> bool:
    """True for an error no retry can mend: by its code (``NonRetryableError``, a protocol error), BullMQ's
    ``UnrecoverableError``, or a stray ``SuspendedError`` (the run did not suspend: its context was misused)."""
    if isinstance(error, (UnrecoverableError, SuspendedError)) or type(error).__name__ in ("UnrecoverableError", "SuspendedError"):
        return True
    return getattr(error, "code", None) in NON_RETRYABLE_CODES

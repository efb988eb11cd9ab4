"""A background loop's stop, kept when Python 3.11 loses it."""

from __future__ import annotations

import asyncio


def stop_if_cancelled() -> None:
    """Raises ``CancelledError`` when the running task was asked to stop. Python 3.11's ``asyncio.wait_for`` returns
    the awaited result, and drops the cancel, when the cancel comes as that result arrives (CPython gh-86296, fixed in
    3.12); redis-py awaits one while it opens a connection. So a worker's close that cancelled its cancel listener
    while it subscribed (a SIGTERM as the worker started) left it listening for ever, and the worker never stopped.
    The request stays counted by ``Task.cancelling()``: a loop that calls this on each turn stops as asked."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError()

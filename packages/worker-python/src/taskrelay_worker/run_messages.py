"""A run's background writes (PROTOCOL.md §8, §15), as the Node worker's ``run-messages.ts``: ``ctx.progress``,
throttled per task, and ``ctx.notify``, each sent under the run's job lock without the handler waiting; ``flush``
before the run's terminal write waits for them all, so the last progress and every log message reach the caller
before the result."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, Awaitable, Callable

from .context_checks import LOG_LEVELS, MAX_LOG_BYTES, MAX_PROGRESS_MESSAGE_BYTES, bounded_text
from .log import Logger
from .store import JobLock, TaskStore


class RunMessages:
    def __init__(
        self,
        *,
        task_id: str,
        store: TaskStore,
        lock: JobLock,
        log: Logger,
        progress_interval_ms: int,
        on_lock_lost: Callable[[], None],
        on_progress: Callable[[str], None],
    ) -> None:
        self.task_id = task_id
        self.log = log
        self._store = store
        self._lock = lock
        self._on_lock_lost = on_lock_lost
        #: Told of each progress value written, or coalesced (replaced before its write): the worker's metrics.
        self._on_progress = on_progress
        self._interval = progress_interval_ms / 1000
        self._last_progress: float | None = None
        self._pending: tuple[float, float | None, str | None] | None = None
        self._last_sent = 0.0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task] = set()
        self._closed = False

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Reports progress to the caller, on its own progress token. Values must increase (a smaller one is
        dropped); they are throttled per task (``TASKRELAY_PROGRESS_INTERVAL_MS``, newest wins) and written in the
        background, so this returns at once."""
        for name, value in (("progress", done), ("total", total)):
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise ValueError(f"{name} must be a finite number (got {value!r})")
        if self._closed:
            return
        if self._last_progress is not None and done <= self._last_progress:
            self.log.debug("progress not greater than the last value dropped", progress=done, last=self._last_progress)
            return
        self._last_progress = done
        text = None if message is None else bounded_text(str(message), MAX_PROGRESS_MESSAGE_BYTES)
        if self._pending is not None:
            self._on_progress("coalesced")
        self._pending = (done, total, text)
        wait = self._last_sent + self._interval - time.monotonic()
        if wait <= 0:
            self._send_pending()
        elif self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(wait, self._send_pending)

    def _send_pending(self) -> None:
        self._flush_handle = None
        if self._pending is None or self._closed:
            return
        done, total, text = self._pending
        self._pending = None
        self._last_sent = time.monotonic()
        self._track(self._write_progress(done, total, text))

    async def _write_progress(self, done: float, total: float | None, text: str | None) -> None:
        try:
            outcome = await self._store.record_progress(self.task_id, done, total, text, self._lock)
        except Exception as error:  # noqa: BLE001 - a failed write is logged, never raised into the tool
            self.log.warn("progress write failed", err=error, progress=done)
            return
        self._on_progress("written")
        if outcome == "lock_lost":
            self.log.warn("progress refused: this worker no longer holds the job", progress=done)
            self._on_lock_lost()

    async def notify(self, level: str, data: Any, logger: str | None = None) -> None:
        """Sends an MCP log message (``notifications/message``) to the task's caller (§15)."""
        if level not in LOG_LEVELS:
            raise ValueError(f"ctx.notify: level must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
        text = json.dumps(data, ensure_ascii=False)
        if len(text.encode()) > MAX_LOG_BYTES:
            raise ValueError(f"ctx.notify: data is over {MAX_LOG_BYTES} bytes as JSON")
        if self._closed:
            return
        self._track(self._write_log(level, data, logger))

    async def _write_log(self, level: str, data: Any, logger: str | None) -> None:
        try:
            outcome = await self._store.record_log(self.task_id, level, data, logger, self._lock)
        except Exception as error:  # noqa: BLE001
            self.log.warn("log message write failed", err=error, level=level)
            return
        if outcome == "lock_lost":
            self._on_lock_lost()

    def _track(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def flush(self) -> None:
        """Writes the pending progress value and waits for every write in flight (before the terminal write)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._send_pending()
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def close(self) -> None:
        self._closed = True
        self._pending = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()

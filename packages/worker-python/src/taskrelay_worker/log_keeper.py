"""Keeps a run's ``ctx.log`` lines with its task (PROTOCOL.md §30.4), as the Node worker's ``TaskLogKeeper`` does.

Each enabled line is also buffered and written at most every 100 ms (or at once past 100 lines) in one script call;
the run flushes what is left when the tool returns. A failed write is said at debug: the line is on stdout anyway.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

from .log import Logger, _error_fields
from .store import MAX_KEPT_LOG_LINE_BYTES, TaskStore

FLUSH_S = 0.1
FLUSH_LINES = 100


def kept_line(level: str, msg: str, fields: dict[str, Any], attempt: int, now: datetime | None = None) -> str:
    """One line as kept: its own fields, then its level, message, time and attempt; cut when over the byte bound."""
    at = (now or datetime.now(timezone.utc)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    base = {"level": level, "msg": msg, "time": at, "attempt": attempt}
    # A field named like one of the line's own keys is kept as `<name>_`, as on stdout (log.py), never dropped.
    own = {
        (f"{k}_" if k in base else k): (_error_fields(v)["message"] if isinstance(v, BaseException) else v)
        for k, v in fields.items()
    }
    try:
        text = json.dumps({**own, **base}, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = json.dumps(base, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) <= MAX_KEPT_LOG_LINE_BYTES:
        return text
    room = max(0, MAX_KEPT_LOG_LINE_BYTES - 300)
    cut = msg.encode()[:room].decode(errors="ignore")
    marker = f"… (cut: the line was over {MAX_KEPT_LOG_LINE_BYTES} bytes)"
    return json.dumps({**base, "msg": cut + marker}, ensure_ascii=False, separators=(",", ":"))


class TaskLogKeeper:
    def __init__(self, store: TaskStore, task_id: str, attempt: int, log: Logger) -> None:
        self._store = store
        self._task_id = task_id
        self._attempt = attempt
        self._log = log
        self._buffer: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def wrap(self, logger: Logger) -> Logger:
        """``logger``, whose enabled lines (and its children's) are also kept with the task."""
        return logger.with_sink(self._keep)

    async def flush(self) -> None:
        """Writes what is buffered now, and waits for every write started before. Never raises."""
        self._start_write()
        while self._writes:
            await asyncio.gather(*self._writes)

    def _keep(self, level: str, msg: str, fields: dict[str, Any]) -> None:
        self._buffer.append(kept_line(level, msg, fields, self._attempt))
        if len(self._buffer) >= FLUSH_LINES:
            self._start_write()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._start_write)

    def _start_write(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        lines, self._buffer = self._buffer, []
        previous = list(self._writes)
        task = asyncio.ensure_future(self._write(lines, previous))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, lines: list[str], previous: list[asyncio.Task[None]]) -> None:
        # In order: after the writes started before this one.
        if previous:
            await asyncio.gather(*previous)
        try:
            await self._store.keep_logs(self._task_id, lines)
        except Exception as error:  # noqa: BLE001 - the lines are on stdout; a failed keep is never raised
            self._log.debug("log lines not kept with the task", err=error, lines=len(lines))

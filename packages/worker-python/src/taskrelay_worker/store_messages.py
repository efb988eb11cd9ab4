"""A run's progress, log messages and kept log lines (PROTOCOL.md §6.2, §15, §30.4): the store's writes behind
``ctx.progress``, ``ctx.notify`` and the log keeper."""

from __future__ import annotations

import json
from typing import Any

from .keys import Keys
from .protocol import RESULT
from .task_codec import JobLock, _json, iso_now, js_number

#: A task keeps its newest this many log lines, each at most this many bytes (MAX_KEPT_LOG_LINES, ..._BYTES).
MAX_KEPT_LOG_LINES = 1_000
MAX_KEPT_LOG_LINE_BYTES = 2_048


class RunMessageWrites:
    """The message writes of ``TaskStore`` (a mixin over its ``StoreRunner``)."""

    keys: Keys

    async def record_progress(
        self, task_id: str, progress: float, total: float | None, message: str | None, lock: JobLock | None
    ) -> str:
        """'accepted', 'stale', 'terminal', 'missing' or 'lock_lost' (§6.2)."""
        code, _ = await self.call(
            "progress",
            {"task": self.keys.task(task_id), "lock": self._lock_key(task_id, lock)},
            {
                "progress": js_number(progress),
                "total": "" if total is None else js_number(total),
                "message": "" if message is None else _json(message),
                "now": iso_now(),
                "channelPrefix": self.keys.for_task(task_id).gateway_channel_prefix,
                "channelSuffix": self.keys.for_task(task_id).gateway_channel_suffix,
                "lockToken": lock.token if lock else "",
                "backlogPrefix": self.keys.for_task(task_id).gateway_backlog_prefix,
                "backlogSuffix": self.keys.for_task(task_id).gateway_backlog_suffix,
                "publish": self.keys.publish_command,
            },
        )
        return {RESULT.OK: "accepted", RESULT.PROGRESS_STALE: "stale", RESULT.TASK_TERMINAL: "terminal", RESULT.LOCK_LOST: "lock_lost"}.get(
            code, "missing"
        )

    async def record_log(self, task_id: str, level: str, data: Any, logger: str | None, lock: JobLock | None) -> str:
        """'published', 'unrouted', 'dropped' (the gateway's backlog is full, §22.4), 'terminal', 'missing' or
        'lock_lost' (§15)."""
        code, _ = await self.call(
            "log",
            {"task": self.keys.task(task_id), "lock": self._lock_key(task_id, lock)},
            {
                "level": level,
                "data": _json(data),
                "logger": "" if logger is None else _json(logger),
                "channelPrefix": self.keys.for_task(task_id).gateway_channel_prefix,
                "channelSuffix": self.keys.for_task(task_id).gateway_channel_suffix,
                "lockToken": lock.token if lock else "",
                "backlogPrefix": self.keys.for_task(task_id).gateway_backlog_prefix,
                "backlogSuffix": self.keys.for_task(task_id).gateway_backlog_suffix,
                "publish": self.keys.publish_command,
            },
        )
        return {
            RESULT.OK: "published",
            RESULT.UNROUTED: "unrouted",
            RESULT.CHANNEL_FULL: "dropped",
            RESULT.TASK_TERMINAL: "terminal",
            RESULT.LOCK_LOST: "lock_lost",
        }.get(code, "missing")

    async def keep_logs(self, task_id: str, lines: list[str]) -> None:
        """Appends a run's log lines (each a JSON object as text) to its task's stream (§30.4); nothing for a gone task."""
        if not lines:
            return
        await self.call(
            "logKeep",
            {"task": self.keys.task(task_id), "logs": self.keys.task_logs(task_id)},
            {"maxLen": MAX_KEPT_LOG_LINES, "lines": json.dumps(lines)},
        )

"""A task that last ran another version of its tool (PROTOCOL.md §12.11), as the Node worker's
``engine/tool-versions.ts``: left to a live worker of that version for a while, then the tool's ``on_version_change``
decides (fail, restart or resume)."""

from __future__ import annotations

import json
from typing import Any

from bullmq.custom_errors import DelayedError, UnrecoverableError

from ..log import Logger
from ..protocol import ERROR
from ..store import JobLock
from ..tools import ToolDefinition
from .end_write import now_ms

#: How long a job left to a worker of its task's tool version waits before any worker may take it again (§12.11).
VERSION_DEFER_MS = 250


class ToolVersions:
    """The version checks of ``TaskrelayWorker`` (a part of it)."""

    async def _version_change(
        self, job: Any, token: str, task_id: str, lock: JobLock, tool: ToolDefinition, recorded: str, log: Logger
    ) -> str:
        """The task last ran another version of the tool (§12.11): left to a live worker of that version for at most
        the lock duration from the first deferral; then the tool's ``on_version_change`` decides."""
        if await self._live_worker_serves(tool.name, recorded) and await self._within_window(task_id):
            try:
                await job.moveToDelayed(now_ms() + VERSION_DEFER_MS, token)
                log.info(
                    "task last ran another tool version, which a live worker serves: left to it",
                    **{"from": recorded, "to": tool.version},
                )
            except Exception as error:  # noqa: BLE001
                log.info("job not deferred (its lock is gone); it is with, or returns to, the queue", err=error)
            raise DelayedError()
        policy = tool.on_version_change
        if policy == "fail":
            message = (
                f"Task {task_id} started on tool {tool.name} version {recorded}; this worker runs version "
                f"{tool.version} (onVersionChange: fail)"
            )
            await self._fail_task(task_id, lock, message, {"code": ERROR.VERSION_CHANGED, "message": message}, log)
            raise UnrecoverableError(message)
        log.warn(
            "task last ran another tool version: restarting it from the top (state, steps and answers cleared)"
            if policy == "restart"
            else "task last ran another tool version: resuming it with its state, steps and answers",
            **{"from": recorded, "to": tool.version, "onVersionChange": policy},
        )
        return policy

    async def _live_worker_serves(self, tool: str, version: str) -> bool:
        assert self._redis is not None
        ids = await self._redis.zrangebyscore(self.keys.workers, now_ms(), "+inf")
        if not ids:
            return False
        for raw in await self._redis.mget([self.keys.worker_catalog(i) for i in ids]):
            try:
                catalog = json.loads(raw) if raw else None
            except ValueError:
                continue
            if not isinstance(catalog, dict):
                continue
            queue_name = catalog.get("queueName") or str(catalog.get("queue", "")).rsplit(".", 1)[0]
            if queue_name != self.config.queue:
                continue
            if any(
                isinstance(t, dict) and t.get("name") == tool and t.get("version") == version
                for t in catalog.get("tools", [])
            ):
                return True
        return False

    async def _within_window(self, task_id: str) -> bool:
        assert self._redis is not None
        key = self.keys.version_wait(task_id)
        now = now_ms()
        window = self.config.lock_duration_ms
        await self._redis.set(key, str(now), px=window * 2, nx=True)
        first = await self._redis.get(key)
        return first is None or now - int(first) < window

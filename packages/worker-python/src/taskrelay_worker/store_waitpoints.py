"""A task's waitpoints in its hash (PROTOCOL.md §32.1): the store's side of ``ctx.waitpoint``, as the Node store's
``waitpoints.ts``."""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis

from .keys import Keys
from .protocol import FIELD_PREFIXES, RESULT
from .task_codec import JobLock


class WaitpointWrites:
    """The waitpoint members of ``TaskStore`` (a mixin over its ``StoreRunner``)."""

    redis: Redis
    keys: Keys

    async def open_waitpoint(
        self, task_id: str, lock: JobLock, name: str, token: str, timeout_ms: int
    ) -> tuple[str, dict[str, Any] | None]:
        """('ok', record), ('gone', None) or ('lock_lost', None): the waitpoint an earlier run stored, else a new one
        with ``token`` (§32.1); ended as ``timedOut`` here once past its time."""
        code, values = await self.call(
            "waitpointOpen",
            {"task": self.keys.task(task_id), "lock": self.keys.bull_job_lock(lock.queue, task_id)},
            {"lockToken": lock.token, "field": f"{FIELD_PREFIXES['waitpoint']}{name}", "token": token, "timeoutMs": timeout_ms},
        )
        if code == RESULT.LOCK_LOST:
            return "lock_lost", None
        if code != RESULT.OK:
            return "gone", None
        return "ok", json.loads(values[0])

    async def read_waitpoint(self, task_id: str, name: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(self.keys.task(task_id), f"{FIELD_PREFIXES['waitpoint']}{name}")
        return None if raw is None else json.loads(raw)

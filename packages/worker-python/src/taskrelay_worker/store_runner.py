"""The one script runner under the worker's store aggregates (PROTOCOL.md §29.2), as the Node store's
``store-runner.ts``: one connection, the manifest's scripts registered once, each called by name with named keys and
arguments, and a first run's start ordered before every other script naming its task (§21.2.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from .keys import Keys
from .protocol import CODE_NAMES, SCRIPTS, ScriptSpec
from .task_codec import JobLock

class ScriptReplyError(Exception):
    """A script answered a code it does not declare: the script and this worker disagree (another generation)."""



class StoreRunner:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._scripts = {name: redis.register_script(spec.source) for name, spec in SCRIPTS.items()}
        #: First runs' starts not answered yet, by task id (§21.2.1): every other script naming the task waits for it.
        self._starting: dict[str, asyncio.Future] = {}

    async def _after_start(self, keys: dict[str, str]) -> None:
        for task_id, started in list(self._starting.items()):
            if any(task_id in key for key in keys.values()):
                await asyncio.wait([started])

    async def call(self, name: str, keys: dict[str, str], args: dict[str, Any]) -> tuple[str, list[Any]]:
        """Runs script ``name`` with named keys and arguments; answers its code's name and the values after it."""
        spec: ScriptSpec = SCRIPTS[name]
        if self._starting and name != "startRun":
            await self._after_start(keys)
        positional_keys = [keys.get(k, "") for k in spec.keys]
        # A list is spread in place, one ARGV entry per item (a script's last argument: transition's fields, §20).
        positional_args: list[Any] = []
        for a in spec.args:
            value = args.get(a, "")
            if isinstance(value, list):
                positional_args.extend(value)
            else:
                positional_args.append(value)
        raw = await self._scripts[name](keys=positional_keys, args=positional_args)
        code = raw[0] if isinstance(raw, list) and raw else None
        code_name = CODE_NAMES.get(code) if isinstance(code, int) else None
        if code_name is None or code_name not in spec.codes:
            raise ScriptReplyError(f"Lua script {name} answered {code!r}, not one of its codes ({', '.join(spec.codes)})")
        return code_name, list(raw[1:])

    def _lock_key(self, task_id: str, lock: JobLock | None) -> str:
        return self.keys.bull_job_lock(lock.queue, task_id) if lock else self.keys.task(task_id)

    async def known_generations(self) -> dict[str, int]:
        """The scripts generations gateways announced (§29.2): generation -> last announced (ms)."""
        seen = await self.redis.hgetall(self.keys.protocol)
        return {str(k): int(v) for k, v in seen.items() if str(v).isdigit()}

"""The one script runner under the worker's store aggregates (PROTOCOL.md §29.2), as the Node store's
``store-runner.ts``: one connection, the manifest's scripts registered once, each called by name with named keys and
arguments, and a first run's start ordered before every other script naming its task (§21.2.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

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
        #: While several runs are in flight (the envelope sets it, §21.2.2), the script calls made in one turn of the
        #: event loop go to Redis as one pipeline: one write and one read instead of one per call. Not on a cluster,
        #: whose pipeline refuses EVALSHA across slots.
        self.coalesce = False
        self._coalescable = isinstance(redis, Redis)
        self._batch: list[tuple[Any, list[Any], list[Any], asyncio.Future]] = []
        self._sending: set[asyncio.Task] = set()

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
        if self.coalesce and self._coalescable:
            raw = await self._queued(self._scripts[name], positional_keys, positional_args)
        else:
            raw = await self._scripts[name](keys=positional_keys, args=positional_args)
        code = raw[0] if isinstance(raw, list) and raw else None
        code_name = CODE_NAMES.get(code) if isinstance(code, int) else None
        if code_name is None or code_name not in spec.codes:
            raise ScriptReplyError(f"Lua script {name} answered {code!r}, not one of its codes ({', '.join(spec.codes)})")
        return code_name, list(raw[1:])

    def _queued(self, script: Any, keys: list[Any], args: list[Any]) -> asyncio.Future:
        """Queues one script call for the end of this turn (``_flush``); answers its reply or raises its error."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future = loop.create_future()
        self._batch.append((script, keys, args, reply))
        if len(self._batch) == 1:
            loop.call_soon(self._flush)
        return reply

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        sending = asyncio.ensure_future(self._send(batch))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Any, list[Any], list[Any], asyncio.Future]]) -> None:
        """Sends a turn's script calls as one pipeline, in the order they were made, and answers each. A script Redis
        does not hold yet (``NOSCRIPT``: a new or flushed server) is sent again alone, through ``register_script``'s
        load; a lone call goes as it would have without the batch."""
        if len(batch) == 1:
            script, keys, args, reply = batch[0]
            try:
                result = await script(keys=keys, args=args)
            except BaseException as error:  # noqa: BLE001 - handed to the caller, whatever it is
                result = error
            if not reply.done():  # its caller may have been cancelled meanwhile
                if isinstance(result, BaseException):
                    reply.set_exception(result)
                else:
                    reply.set_result(result)
            return
        pipe = self.redis.pipeline(transaction=False)
        for script, keys, args, _ in batch:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        try:
            results = await pipe.execute(raise_on_error=False)
        except BaseException as error:  # noqa: BLE001 - the connection failed: every call of the batch fails with it
            for *_, reply in batch:
                if not reply.done():
                    reply.set_exception(error)
            return
        for (script, keys, args, reply), result in zip(batch, results):
            if isinstance(result, NoScriptError):
                try:
                    result = await script(keys=keys, args=args)
                except BaseException as error:  # noqa: BLE001
                    result = error
            if reply.done():
                continue
            if isinstance(result, BaseException):
                reply.set_exception(result)
            else:
                reply.set_result(result)

    def _lock_key(self, task_id: str, lock: JobLock | None) -> str:
        return self.keys.bull_job_lock(lock.queue, task_id) if lock else self.keys.task(task_id)

    async def known_generations(self) -> dict[str, int]:
        """The scripts generations gateways announced (§29.2): generation -> last announced (ms)."""
        seen = await self.redis.hgetall(self.keys.protocol)
        return {str(k): int(v) for k, v in seen.items() if str(v).isdigit()}

"""A store's script calls of one event-loop turn go to Redis as one pipeline while several runs are in flight (PROTOCOL.md
§21.2.2), on a Redis of its own (redis-server on a free port): each call answers as it does alone, a refusal and a
script Redis does not hold yet included, in the order they were made; a store not coalescing sends each at once."""

import asyncio
import shutil

import pytest
from redis.asyncio import Redis

from taskrelay_worker.keys import Keys
from taskrelay_worker.store import JobLock, TaskStore

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")


class Counting(Redis):
    """Counts the pipelines and the single commands the store sends."""

    pipelines = 0
    singles = 0

    def pipeline(self, *args, **kwargs):
        Counting.pipelines += 1
        return super().pipeline(*args, **kwargs)

    async def evalsha(self, *args, **kwargs):
        Counting.singles += 1
        return await super().evalsha(*args, **kwargs)


async def _tasks(redis: Redis, prefix: str, n: int, first: int = 0) -> list[str]:
    """n tasks in `working`, as a gateway's create leaves them (the fields the end reads)."""
    ids = [f"{prefix}{i:030d}" for i in range(first, first + n)]
    for task_id in ids:
        await redis.hset(
            f"{prefix}:task:{task_id}",
            mapping={"taskId": task_id, "status": "working", "tool": "x", "principal": "p", "mode": "call"},
        )
    return ids


def test_a_turns_calls_leave_as_one_pipeline_in_order_and_each_answers_as_alone(redis_url: str):
    async def main() -> None:
        redis = Counting.from_url(redis_url, decode_responses=True)
        await redis.script_flush()  # the first batch meets NOSCRIPT: each call is sent again alone, loaded
        keys = Keys("co1")
        ids = await _tasks(redis, "co1", 3)
        store = TaskStore(redis, keys)
        store.coalesce = True
        Counting.pipelines = Counting.singles = 0
        ends = await asyncio.gather(
            *(store.transition(task_id, "completed", {"result": {"content": []}}, None) for task_id in ids)
        )
        assert Counting.pipelines == 1
        assert ends == [(True, "completed", False)] * 3
        # Loaded now: one pipeline, nothing sent alone. Two ends of one task in one turn keep their order: the first
        # made wins, the second finds the task ended.
        more = await _tasks(redis, "co1", 1, first=3)
        Counting.pipelines = Counting.singles = 0
        first, second = await asyncio.gather(
            store.transition(more[0], "completed", {"result": {"content": []}}, None),
            store.transition(more[0], "failed", {"error": {"code": "X", "message": "late"}}, None),
        )
        assert (Counting.pipelines, Counting.singles) == (1, 0)
        assert first == (True, "completed", False)
        assert second[0] is False and second[1] == "completed"
        assert await redis.hget(keys.task(more[0]), "status") == "completed"
        await redis.aclose()

    asyncio.run(main())


def test_a_refusal_in_a_batch_reaches_only_its_caller(redis_url: str):
    async def main() -> None:
        redis = Redis.from_url(redis_url, decode_responses=True)
        keys = Keys("co2")
        ids = await _tasks(redis, "co2", 2)
        store = TaskStore(redis, keys)
        store.coalesce = True
        lock = JobLock("default~x", "no-such-token")
        # A transition under a lock nobody holds is refused (LOCK_LOST); the other task's, without a lock, is written.
        lost, written = await asyncio.gather(
            store.transition(ids[0], "completed", {"result": {"content": []}}, lock),
            store.transition(ids[1], "completed", {"result": {"content": []}}, None),
            return_exceptions=True,
        )
        assert written == (True, "completed", False)
        assert lost != written
        assert await redis.hget(keys.task(ids[1]), "status") == "completed"
        assert await redis.hget(keys.task(ids[0]), "status") == "working"
        await redis.aclose()

    asyncio.run(main())


def test_a_store_not_coalescing_sends_each_call_at_once(redis_url: str):
    async def main() -> None:
        redis = Counting.from_url(redis_url, decode_responses=True)
        ids = await _tasks(redis, "co3", 2)
        store = TaskStore(redis, Keys("co3"))
        Counting.pipelines = Counting.singles = 0
        await asyncio.gather(
            *(store.transition(task_id, "completed", {"result": {"content": []}}, None) for task_id in ids)
        )
        assert (Counting.pipelines, Counting.singles) == (0, 2)
        await redis.aclose()

    asyncio.run(main())

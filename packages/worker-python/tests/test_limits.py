"""The run's side of a plain rate limit (PROTOCOL.md §3.3), as the Node worker's ``engine/tool-limits.ts``: the start
log counts every start exactly; a start that fills the window holds the queue's takes until the oldest leaves it, and
a start it refuses says it waits at the front of its queue (``paced``). Against a Redis of its own."""

from __future__ import annotations

import asyncio
import shutil
from types import SimpleNamespace

import pytest
from redis.asyncio import Redis

from taskrelay_worker import define_tool
from taskrelay_worker.keys import Keys
from taskrelay_worker.limits import ToolLimits
from taskrelay_worker.log import Logger
from taskrelay_worker.store import TaskStore

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")


async def _run(args, ctx):
    return "ok"


def test_a_plain_rate_limit_counts_starts_exactly_holds_the_queue_when_full_and_refuses_at_the_front(redis_url: str):
    async def main() -> None:
        redis = Redis.from_url(redis_url, decode_responses=True)
        keys = Keys("limits-test")
        limits = ToolLimits(TaskStore(redis, keys), keys, 30_000, Logger("error"))
        tool = define_tool(name="paced", description="d", run=_run, rate_limit={"max": 2, "per_ms": 1_000})
        held: list[int] = []

        async def hold_takes(ms: int) -> None:
            held.append(ms)

        async def admit(job_id: str):
            job, entry = SimpleNamespace(id=job_id), SimpleNamespace(principal="alice")
            return await limits.admit(tool, {}, job, entry, lambda *_: asyncio.sleep(0, "gone"), hold_takes)

        # Room after the first start; the second fills the window: the queue is held until the first leaves it.
        assert await admit("j1") is None and held == []
        assert await admit("j2") is None
        assert len(held) == 1 and 900 < held[0] <= 1_000
        # A third within the window is refused, to wait at the front of its queue for as long.
        wait = await admit("j3")
        assert wait is not None and wait.limit == "rate" and wait.paced
        assert 900 < wait.wait_ms <= 1_000
        assert wait.message == "Waiting for rate limit paced: at most 2 starts per 1000 ms"
        # One budget for every principal: bob's start counts in the same log.
        bob = await limits.admit(tool, {}, SimpleNamespace(id="j4"), SimpleNamespace(principal="bob"), None, hold_takes)
        assert bob is not None and bob.paced
        await redis.aclose()

    asyncio.run(main())

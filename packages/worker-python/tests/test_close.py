"""A worker's close (SIGTERM, PROTOCOL.md §21.1) stops it whenever it comes: a worker closed as soon as it started
stops, its catalog left. Before, its close cancelled the cancel listener while redis-py opened its connection, Python
3.11's ``asyncio.wait_for`` dropped the cancel (CPython gh-86296), and the listener, and so the worker, never ended.
They run against a Redis of their own (redis-server on a free port)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import pytest

from taskrelay_worker.stop import stop_if_cancelled

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")


#: Starts a worker and closes it at once, five times; prints "stopped" each time its close returned.
CLOSE_AT_ONCE = """
import asyncio, sys
from redis.asyncio import Redis
from taskrelay_worker import tool
from taskrelay_worker.config import load_config
from taskrelay_worker.engine import TaskrelayWorker
from taskrelay_worker.keys import Keys
from taskrelay_worker.log import Logger

@tool(name="close_echo", description="Echoes.", input_schema={"type": "object", "properties": {}})
async def close_echo(args, ctx):
    return {"ok": True}

async def main():
    env = {"REDIS_URL": sys.argv[1], "TASKRELAY_PREFIX": "close-test", "TASKRELAY_QUEUE": "closing"}
    config = load_config({**env, "TASKRELAY_TOOLS": "unused"})  # the tools are passed below
    client = Redis.from_url(sys.argv[1], decode_responses=True)
    for _ in range(5):
        worker = TaskrelayWorker(config, [close_echo], Logger("error", {"name": "worker"}))
        await worker.start()
        await worker.close()
        left = await client.zscore(Keys(config.prefix, config.key_layout).workers, worker.worker_id) is None
        print("stopped" if left else "still listed", flush=True)
    await client.aclose()

asyncio.run(main())
"""


def test_a_worker_closed_as_soon_as_it_started_stops_and_leaves_the_catalog(redis_url: str):
    # In a process of its own, so that a close that never returns fails the test (killed at the bound) instead of
    # stalling the run: five closes take well under a second each.
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLOSE_AT_ONCE, redis_url], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"a close never returned; the worker printed: {error.stdout!r}")
    assert done.stdout.split() == ["stopped"] * 5, done.stderr


def test_stop_if_cancelled_raises_once_a_cancel_was_asked_even_if_it_was_dropped():
    async def main() -> None:
        turns = 0

        async def loop() -> None:
            nonlocal turns
            while True:
                stop_if_cancelled()
                turns += 1
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    pass  # what Python 3.11's wait_for can do to a cancel that meets a result

        task = asyncio.ensure_future(loop())
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2)
        assert done and task.cancelled()
        assert turns > 0

    asyncio.run(main())

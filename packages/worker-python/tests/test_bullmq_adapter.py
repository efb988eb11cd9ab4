"""One test per bullmq-Python behaviour the worker relies on (engine/bullmq_adapter.py), each named for it: a bullmq
upgrade that changes one fails here by name, not somewhere in an end-to-end suite. They run bullmq against a Redis of
their own (redis-server on a free port)."""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

import bullmq
import pytest
from bullmq.custom_errors import DelayedError
from redis.asyncio import Redis

from taskrelay_worker.engine.bullmq_adapter import (
    MOVE_TO_WAIT_KEYS,
    UNREADABLE_JOB_DATA,
    GatedWorker,
    bull_connection,
    bullmq_command,
    bullmq_mismatch,
    hold_takes,
    move_to_wait,
    promote,
    wake_idle_workers,
)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
PREFIX = "adapter-test"


def _opts(url: str, **extra: Any) -> dict:
    return {"connection": bull_connection(url), "prefix": PREFIX, **extra}


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def _gated(url: str, queue: str, processor: Any, gate: asyncio.Semaphore, current_token: Any = None) -> GatedWorker:
    options = _opts(url, concurrency=2, autorun=False, lockDuration=1_000, lockRenewTime=300)
    return GatedWorker(queue, processor, options, gate, current_token)


async def _run_until(
    url: str, queue: Any, names: list[str], processor: Any, slots: int, done: Any, timeout_s: float
) -> None:
    """Adds a job of each name (with a priority, as every taskrelay job has), runs a gated Worker of ``queue`` with
    ``slots`` slots until ``done()``, then closes it."""
    for name in names:
        await queue.add(name, {}, {"priority": 3})
    worker = _gated(url, queue.name, processor, asyncio.Semaphore(slots))
    runner = asyncio.ensure_future(worker.run())
    await _until(lambda: asyncio.sleep(0, done()), timeout_s=timeout_s)
    await worker.close(force=True)
    runner.cancel()


def test_bullmq_the_installed_bullmq_is_the_one_the_scripts_pair_with():
    assert bullmq_mismatch() is None


def test_bullmq_move_job_from_active_to_wait_9_takes_nine_keys_and_ships_with_the_package():
    source = bullmq_command("moveJobFromActiveToWait-9.lua")
    assert len(MOVE_TO_WAIT_KEYS) == 9
    # The keys it reads, in its order: a renamed or reordered key would move another list.
    assert "KEYS[9]" in source and "KEYS[10]" not in source


def test_bullmq_move_job_from_active_to_wait_puts_the_job_back_unspent_and_refuses_another_token(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("move-to-wait", _opts(redis_url))
        seen: dict[str, Any] = {}

        async def processor(job: Any, token: str) -> None:
            with pytest.raises(RuntimeError, match="answered -"):
                await move_to_wait(job, "not-the-lock-holder")
            await move_to_wait(job, token)
            seen["state"] = await queue.getJobState(job.id)
            raise DelayedError()

        worker = _gated(redis_url, "move-to-wait", processor, asyncio.Semaphore(1))
        runner = asyncio.ensure_future(worker.run())
        job = await queue.add("t", {"a": 1}, {"priority": 5, "attempts": 1})
        await _until(lambda: asyncio.sleep(0, "state" in seen))
        await worker.close(force=True)
        runner.cancel()
        assert seen["state"] in ("waiting", "prioritized")
        fresh = await queue.getJob(job.id)
        assert fresh is not None and fresh.attemptsMade == 0
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_a_held_limiter_stops_every_take_until_its_ttl_ends_and_move_to_wait_puts_a_job_back_first(
    redis_url: str,
):
    """A plain rate limit's refused run (PROTOCOL.md §3.3 step 3): the limiter held (what bullmq's ``Queue.rateLimit``
    writes) with the marker due at the hold's end, the job back at the front of its priority. bullmq-Python's Worker
    keeps no timer of a rate limit: without the marker it sleeps until its block timeout (5 s)."""

    async def main() -> None:
        queue = bullmq.Queue("held", _opts(redis_url))
        await queue.setGlobalRateLimit(100, 1_000)
        starts: list[tuple[str, float]] = []
        held: dict[str, float] = {}

        async def processor(job: Any, token: str) -> None:
            starts.append((job.name, time.monotonic()))
            if job.name == "first" and len(starts) == 1:
                held["at"] = time.monotonic()
                await hold_takes(job, 400)
                await move_to_wait(job, token)
                raise DelayedError()

        await _run_until(redis_url, queue, ["first", "second"], processor, 1, lambda: len(starts) == 3, 3.0)
        assert [name for name, _ in starts] == ["first", "first", "second"]
        assert starts[1][1] - held["at"] >= 0.35
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_a_rate_limited_take_waits_for_the_limit_to_end_not_the_drain_delay(redis_url: str):
    """bullmq's take answers a rate-limited queue with the limit's TTL. Node's Worker sleeps that long and takes again;
    bullmq-Python keeps the value unused and blocks on the marker for its drain delay (5 s). The GatedWorker blocks
    until the limit ends instead (PROTOCOL.md §3.3: BullMQ's limiter paces a rate-limited tool's takes)."""

    async def main() -> None:
        queue = bullmq.Queue("paced", _opts(redis_url))
        await queue.setGlobalRateLimit(1, 700)
        starts: list[float] = []

        async def processor(job: Any, token: str) -> None:
            starts.append(time.monotonic())

        await _run_until(redis_url, queue, ["a", "b"], processor, 2, lambda: len(starts) == 2, 4.0)
        assert 0.6 <= starts[1] - starts[0] < 2.0
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_move_to_active_is_where_a_job_is_taken_so_a_full_process_takes_none(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("gate", _opts(redis_url))
        gate = asyncio.Semaphore(1)
        await gate.acquire()  # the process's one slot is busy
        done = asyncio.Event()

        async def processor(job: Any, token: str) -> str:
            done.set()
            return "ok"

        worker = _gated(redis_url, "gate", processor, gate)
        runner = asyncio.ensure_future(worker.run())
        job = await queue.add("t", {}, {})
        await asyncio.sleep(0.5)
        assert await queue.getJobState(job.id) in ("waiting", "prioritized")
        gate.release()
        await asyncio.wait_for(done.wait(), 5)
        await worker.close()
        runner.cancel()
        assert not gate.locked()  # processJob gave the slot back
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_next_job_from_job_data_parses_the_stored_data_so_unreadable_data_reaches_the_processor(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("unreadable", _opts(redis_url))
        job = await queue.add("t", {"ok": True}, {})
        client = Redis.from_url(redis_url, decode_responses=True)
        await client.hset(f"{PREFIX}:unreadable:{job.id}", "data", "{not json")
        received: asyncio.Future = asyncio.get_running_loop().create_future()

        async def processor(job: Any, token: str) -> None:
            received.set_result(job.data)

        worker = _gated(redis_url, "unreadable", processor, asyncio.Semaphore(1))
        runner = asyncio.ensure_future(worker.run())
        data = await asyncio.wait_for(received, 5)
        await worker.close()
        runner.cancel()
        assert "not valid JSON" in data[UNREADABLE_JOB_DATA]
        await client.aclose()
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_a_jobs_lock_is_renewed_while_the_fetch_loop_is_closed(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("draining", _opts(redis_url))
        client = Redis.from_url(redis_url, decode_responses=True)
        started, finish = asyncio.Event(), asyncio.Event()
        tokens: dict[str, str] = {}

        async def processor(job: Any, token: str) -> str:
            tokens[job.id] = token
            started.set()
            await finish.wait()
            return "ok"

        # A free slot beside the running job: the fetch loop waits for another job, and close() cancels that wait.
        worker = _gated(redis_url, "draining", processor, asyncio.Semaphore(2))
        runner = asyncio.ensure_future(worker.run())
        job = await queue.add("t", {}, {})
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(worker.close())
        try:
            # Past two lock durations (1 s) with the fetch loop closed: the lock is still the run's.
            await asyncio.sleep(2.2)
            holder = await client.get(f"{PREFIX}:draining:{job.id}:lock")
        finally:
            finish.set()  # a failed check must not leave close() waiting on the job for ever
        await asyncio.wait_for(closing, 10)
        assert holder == tokens[job.id]
        runner.cancel()
        assert await queue.getJobState(job.id) == "completed"
        await client.aclose()
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_process_job_untracks_the_lock_of_a_job_id_so_a_run_taken_again_is_tracked_again(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("retrack", _opts(redis_url))
        done = asyncio.Event()

        async def processor(job: Any, token: str) -> str:
            return "ok"

        # The process says another run of this job id holds it now (a hand-back taken again at once).
        worker = _gated(redis_url, "retrack", processor, asyncio.Semaphore(1), current_token=lambda job_id: "next-run")
        worker.on("completed", lambda *_: done.set())
        runner = asyncio.ensure_future(worker.run())
        job = await queue.add("t", {}, {})
        await asyncio.wait_for(done.wait(), 5)
        await _until(lambda: asyncio.sleep(0, job.id in worker.lockManager.tracked_jobs))
        assert worker.lockManager.tracked_jobs[job.id]["token"] == "next-run"
        worker.lockManager.untrack_job(job.id)
        await worker.close()
        runner.cancel()
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_the_lock_manager_renews_every_tracked_lock_until_process_job_ends_so_move_to_wait_untracks_first(
    redis_url: str,
):
    """A hand-back (a drain's, a refused start's): bullmq renews on its own timer from the jobs it tracks, and tracks a
    job until its processJob ends. A renewal after the move found no lock and the Worker said "could not renew lock for
    job …" of a job back in its queue as meant. Here the renewal comes right after the move, every time."""

    async def main() -> None:
        queue = bullmq.Queue("untrack", _opts(redis_url))
        errors: list[str] = []
        runs: list[tuple[str, int]] = []

        async def processor(job: Any, token: str) -> str:
            runs.append((job.id, job.attemptsMade))
            if len(runs) > 1:
                return "ok"
            await move_to_wait(job, token)
            locks = worker.lockManager
            await locks._extend_locks(list(locks.tracked_jobs))
            raise DelayedError()

        worker = _gated(redis_url, "untrack", processor, asyncio.Semaphore(1))
        worker.on("error", lambda error, *_: errors.append(str(error)))
        runner = asyncio.ensure_future(worker.run())
        job = await queue.add("t", {}, {"priority": 3})
        await _until(lambda: asyncio.sleep(0, len(runs) == 2))
        await worker.close(force=True)
        runner.cancel()
        assert errors == []
        # Moved as meant: taken again, no attempt spent.
        assert runs == [(job.id, 0), (job.id, 0)]
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_the_queue_backend_promotes_a_delayed_job_to_its_wait_list(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("promote", _opts(redis_url))
        job = await queue.add("t", {}, {"delay": 60_000})
        assert await queue.getJobState(job.id) == "delayed"
        await promote(queue, job.id)
        assert await queue.getJobState(job.id) in ("waiting", "prioritized")
        await queue.obliterate(force=True)
        await queue.close()

    asyncio.run(main())


def test_bullmq_the_queue_marker_key_is_what_an_idle_worker_blocks_on(redis_url: str):
    async def main() -> None:
        queue = bullmq.Queue("idle", _opts(redis_url))
        client = Redis.from_url(redis_url, decode_responses=True)
        await wake_idle_workers(client, queue.keys)
        # The Node worker names the same key by its layout (task-worker.ts): both must stay bullmq's.
        assert queue.keys["marker"] == f"{PREFIX}:idle:marker"
        assert await client.zscore(queue.keys["marker"], "0") == 0
        await client.aclose()
        await queue.close()

    asyncio.run(main())

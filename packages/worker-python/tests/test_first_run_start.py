"""A first run's start is pipelined (PROTOCOL.md §21.2.1): sent before the tool and not awaited, every other write of
the run held until it is answered (redis-py's pool keeps no order between coroutines), and the members that read the
record or write durably wait for its answer. The start answers without the task's hash (issue 46): only a member that
reads the record reads it, once."""

import asyncio

import pytest

from taskrelay_worker.context import RunSignal, ToolContext
from taskrelay_worker.errors import TaskCancelledError
from taskrelay_worker.keys import Keys
from taskrelay_worker.log import Logger
from taskrelay_worker.protocol import CODES, SCRIPTS
from taskrelay_worker.store import JobLock, TaskRecord, TaskStore

LOCK = JobLock("default~x", "tok")


class FakeRedis:
    """Scripts by name, in the order they reach 'Redis'; the start's answer waits for ``answer_start``."""

    def __init__(self):
        self.sent: list[str] = []
        self.answer_start = asyncio.Event()

    def register_script(self, source):
        name = next(n for n, spec in SCRIPTS.items() if spec.source == source)

        async def run(keys, args):
            self.sent.append(name)
            if name == "startRun":
                await self.answer_start.wait()
                # A brief start (its last argument) of a task that starts answers without the hash.
                if args[-1] == "1":
                    return [CODES["OK"]]
                return [CODES["OK"], ["status", "working", "taskId", "t1", "principal", "p", "tool", "x"]]
            return [CODES["OK"]]

        return run


def test_every_other_script_of_the_task_waits_for_the_start_answer():
    async def main():
        redis = FakeRedis()
        store = TaskStore(redis, Keys("tr"))
        started = store.start_pipelined("t1", LOCK, 1, 0, "p", "")
        end = asyncio.ensure_future(store.transition("t1", "completed", {"result": {"content": []}}, LOCK))
        other = asyncio.ensure_future(store.transition("t2", "completed", {"result": {"content": []}}, LOCK))
        await asyncio.sleep(0.05)
        # The start is in Redis; the run's end is held behind its answer, another task's write is not.
        assert redis.sent == ["startRun", "transition"]
        assert not end.done()
        redis.answer_start.set()
        assert await started == (False, None, True)
        assert await end == (True, "completed", False)
        await other
        assert redis.sent == ["startRun", "transition", "transition"]

    asyncio.run(main())


def make(start, stored=None, fail_reads=0):
    record = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={})
    signal = RunSignal()

    class Store:
        reads = 0

        async def set_state(self, task_id, lock, field, value):
            return "written"

        async def get(self, task_id):
            Store.reads += 1
            await asyncio.sleep(0.01)  # a round trip: other members run meanwhile
            if Store.reads <= fail_reads:
                raise ConnectionError("redis down")
            return stored

    ctx = ToolContext(
        task_id="t1",
        tool="x",
        attempt=1,
        signal=signal,
        store=Store(),
        lock=LOCK,
        log=Logger("silent"),
        record=record,
        progress_interval_ms=0,
        input_timeout_ms=60_000,
        queue_timeout_ms=60_000,
        on_lock_lost=lambda: None,
        start=start,
    )
    ctx.reads = lambda: Store.reads
    return ctx, signal


def test_a_step_waits_for_the_start_and_finds_a_redrives_stored_result():
    async def main():
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        stored = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={}, steps={"a": 1})
        ctx, _ = make(answer, stored)
        ran = []
        step = asyncio.ensure_future(ctx.step("a", lambda: ran.append(1) or 2))
        await asyncio.sleep(0.02)
        assert not step.done() and ran == [] and ctx.reads() == 0
        answer.set_result(True)
        assert await step == 1
        assert ran == []
        assert ctx.reads() == 1

    asyncio.run(main())


def test_a_step_does_not_run_when_the_start_finds_the_task_ended():
    async def main():
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        ctx, signal = make(answer)
        ran = []
        step = asyncio.ensure_future(ctx.step("a", lambda: ran.append(1)))
        await asyncio.sleep(0.02)
        # What the engine does with such an answer (engine/first_run_start.py, `_read_start`): abort, then answer None.
        signal.abort("CLIENT_CANCELLED")
        answer.set_result(None)
        with pytest.raises(TaskCancelledError):
            await step
        assert ran == []

    asyncio.run(main())


def test_a_member_that_reads_nothing_of_the_record_costs_no_read():
    async def main():
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        stored = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={}, steps={"b": 5})
        ctx, _ = make(answer, stored)
        answer.set_result(True)
        await ctx.state.set({"n": 1})
        assert ctx.reads() == 0
        # The first member that reads the record reads it once; later ones find it.
        assert await asyncio.gather(ctx.step("b", lambda: 0), ctx.step("b", lambda: 0)) == [5, 5]
        assert await ctx.step("b", lambda: 0) == 5
        assert ctx.reads() == 1

    asyncio.run(main())


def test_a_record_read_redis_did_not_answer_is_read_again():
    async def main():
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        stored = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={}, steps={"c": 7})
        ctx, _ = make(answer, stored, fail_reads=1)
        answer.set_result(True)
        with pytest.raises(ConnectionError):
            await ctx.step("c", lambda: 0)
        assert await ctx.step("c", lambda: 0) == 7
        assert ctx.reads() == 2

    asyncio.run(main())

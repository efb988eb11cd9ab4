"""A first run's start is pipelined (PROTOCOL.md §21.2.1): sent before the tool and not awaited, every other write of
the run held until it is answered (redis-py's pool keeps no order between coroutines), and the members that read the
record or write durably wait for its answer."""

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
        assert (await started)[1].status == "working"
        assert await end == (True, "completed", False)
        await other
        assert redis.sent == ["startRun", "transition", "transition"]

    asyncio.run(main())


def make(start):
    record = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={})
    signal = RunSignal()

    class Store:
        async def set_state(self, task_id, lock, field, value):
            return "written"

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
    return ctx, signal


def test_a_step_waits_for_the_start_and_finds_a_redrives_stored_result():
    async def main():
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        ctx, _ = make(answer)
        ran = []
        step = asyncio.ensure_future(ctx.step("a", lambda: ran.append(1) or 2))
        await asyncio.sleep(0.02)
        assert not step.done() and ran == []
        stored = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={}, steps={"a": 1})
        answer.set_result(stored)
        assert await step == 1
        assert ran == []

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

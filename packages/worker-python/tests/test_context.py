import asyncio

import pytest

from taskrelay_worker.context import RunSignal, ToolContext, bounded_text, question_identity
from taskrelay_worker.errors import SuspendedError, TaskCancelledError, TaskrelayError
from taskrelay_worker.log import Logger
from taskrelay_worker.store import JobLock, TaskRecord


class FakeStore:
    def __init__(self, answers=None):
        self.progress = []
        self.suspends = []
        self.answers = answers or {}

    async def record_progress(self, task_id, done, total, message, lock):
        self.progress.append((done, total, message))
        return "accepted"

    async def suspend(self, task_id, lock, deadline_at, requests=None, status_message=None):
        self.suspends.append(requests)
        return "suspended", {k: v for k, v in self.answers.items() if any(str(r["n"]) == k for r in requests or [])}

    async def set_state(self, task_id, lock, field, value):
        return "written"


def make(store, record=None, interval_ms=0, caps=None):
    record = record or TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={})
    record.client_capabilities = caps
    signal = RunSignal()
    ctx = ToolContext(
        task_id="t1",
        tool="x",
        attempt=1,
        signal=signal,
        store=store,
        lock=JobLock("q~x", "tok"),
        log=Logger("silent"),
        record=record,
        progress_interval_ms=interval_ms,
        input_timeout_ms=60_000,
        queue_timeout_ms=60_000,
        on_lock_lost=lambda: None,
    )
    return ctx, signal


def test_progress_drops_values_that_do_not_grow_and_coalesces_within_the_interval():
    async def main():
        store = FakeStore()
        ctx, _ = make(store, interval_ms=200)
        await ctx.progress(1, 10)
        await ctx.progress(1, 10)
        await ctx.progress(2, 10)
        await ctx.progress(3, 10, "three")
        await ctx.flush()
        return store.progress

    assert asyncio.run(main()) == [(1, 10, None), (3, 10, "three")]


def test_progress_refuses_values_that_are_not_finite():
    async def main():
        ctx, _ = make(FakeStore())
        with pytest.raises(ValueError):
            await ctx.progress(float("nan"))

    asyncio.run(main())


def test_sleep_raises_on_cancel_with_its_reason():
    async def main():
        ctx, signal = make(FakeStore())
        asyncio.get_running_loop().call_later(0.05, signal.abort, "CLIENT_CANCELLED")
        with pytest.raises(TaskCancelledError) as raised:
            await ctx.sleep(5)
        assert raised.value.reason == "CLIENT_CANCELLED"
        assert ctx.cancelled

    asyncio.run(main())


def test_questions_asked_together_go_out_in_one_suspend_and_the_run_suspends():
    async def main():
        store = FakeStore()
        ctx, _ = make(store)
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        results = await asyncio.gather(ctx.elicit("a?", schema), ctx.elicit("b?", schema, key="b"), return_exceptions=True)
        assert all(isinstance(r, SuspendedError) for r in results)
        assert [[r["n"] for r in batch] for batch in store.suspends] == [[1, 2]]
        assert ctx.suspension is not None and ctx.suspension.kind == "input"

    asyncio.run(main())


def test_a_stored_answer_goes_only_to_the_same_question():
    schema_v1 = {"type": "object", "properties": {"amount": {"type": "number"}}}
    schema_v2 = {"type": "object", "properties": {"confirm": {"type": "boolean"}}}
    record = TaskRecord(
        task_id="t1",
        status="working",
        principal="p",
        tool="x",
        fields={},
        input_requests={"1": {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": schema_v1}, "position": 1}},
        input_responses={"1": {"action": "accept", "content": {"amount": 100}}},
    )

    async def main():
        store = FakeStore()
        ctx, _ = make(store, record)
        # The same question: its stored answer, no suspend.
        assert (await ctx.elicit("?", schema_v1)) == {"action": "accept", "content": {"amount": 100}}
        ctx2, _ = make(store, record)
        # A deploy changed the first question: asked anew (number 2), never handed the old answer.
        with pytest.raises(SuspendedError):
            await ctx2.elicit("?", schema_v2)
        assert store.suspends[-1][0]["n"] == 2

    asyncio.run(main())


def test_a_client_without_the_capability_is_not_asked():
    async def main():
        ctx, _ = make(FakeStore(), caps=["roots"])
        with pytest.raises(TaskrelayError) as raised:
            await ctx.elicit("?", {"type": "object", "properties": {}})
        assert raised.value.code == "CAPABILITY_MISSING"

    asyncio.run(main())


def test_identity_ignores_key_order_and_texts_are_bounded():
    a = question_identity("elicitation/create", {"requestedSchema": {"type": "object", "properties": {}}}, None)
    b = question_identity("elicitation/create", {"requestedSchema": {"properties": {}, "type": "object"}}, None)
    assert a == b
    cut = bounded_text("é" * 5000, 4096)
    assert len(cut.encode()) <= 4096 and cut.endswith("[truncated]")

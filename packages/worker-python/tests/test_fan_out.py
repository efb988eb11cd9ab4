"""ctx.fan_out, ctx.batch_outcomes and ctx.list_roots where they are pure (PROTOCOL.md §26, §29.4): the argument
checks, the result's shape and the suspension; the cross-process flow is test/python-batch.e2e.test.ts."""

import asyncio

import pytest

from taskrelay_worker.context import RunSignal, ToolContext
from taskrelay_worker.errors import SuspendedError, TaskCancelledError, TaskrelayError
from taskrelay_worker.batch_child_jobs import job_options
from taskrelay_worker.batch_parent import BATCH_POLL_MS, fan_out_result
from taskrelay_worker.batch_store import parse_batch_child_id
from taskrelay_worker.context_checks import batch_message, check_fan_out_args
from taskrelay_worker.fair_share import priority_base
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
        self.suspends.append((deadline_at, requests))
        return "suspended", {k: v for k, v in self.answers.items() if any(str(r["n"]) == k for r in requests or [])}


class FakeHost:
    def __init__(self, step):
        self.step = step
        self.runs = []

    async def fan_out(self, run, args):
        self.runs.append((run, args))
        if isinstance(self.step, BaseException):
            raise self.step
        return self.step

    async def outcomes(self, task_id, start, count):
        return [{"index": start + i, "status": "completed"} for i in range(count)]


def make(store, host=None, caps=None, ttl="60000"):
    record = TaskRecord(task_id="t1", status="working", principal="alice", tool="x", fields={"ttl": ttl})
    record.client_capabilities = caps
    lost = []
    ctx = ToolContext(
        task_id="t1",
        tool="x",
        attempt=1,
        signal=RunSignal(),
        store=store,
        lock=JobLock("q~x", "tok"),
        log=Logger("silent"),
        record=record,
        progress_interval_ms=0,
        input_timeout_ms=60_000,
        queue_timeout_ms=60_000,
        on_lock_lost=lambda: lost.append(True),
        batch=host,
    )
    return ctx, lost


@pytest.mark.parametrize(
    ("items", "options", "message"),
    [
        ([], {"tool": "t"}, "items must not be empty"),
        ("ab", {"tool": "t"}, "items must be a list of argument objects"),
        ([{"n": 1}, 2], {"tool": "t"}, "items must be a list of argument objects"),
        ([{}] * 100_001, {"tool": "t"}, "at most 100000 items"),
        ([{}], {"tool": ""}, "tool must be a non-empty string"),
        ([{}], {"tool": "t", "concurrency": 0}, "concurrency must be a whole number from 1 to 1000"),
        ([{}], {"tool": "t", "concurrency": 1001}, "concurrency must be a whole number from 1 to 1000"),
        ([{}], {"tool": "t", "concurrency": True}, "concurrency must be a whole number from 1 to 1000"),
        ([{}], {"tool": "t", "fail_fast": 1}, "fail_fast must be True or False"),
    ],
)
def test_fan_out_refuses_bad_arguments_before_anything_is_written(items, options, message):
    async def main():
        host = FakeHost(("wait", BATCH_POLL_MS))
        ctx, _ = make(FakeStore(), host)
        with pytest.raises(TypeError, match=message):
            await ctx.fan_out(items, **options)
        assert host.runs == []

    asyncio.run(main())


def test_fan_out_without_a_batch_engine_is_an_internal_error():
    async def main():
        ctx, _ = make(FakeStore())
        with pytest.raises(TaskrelayError, match="ctx.fan_out is not available"):
            await ctx.fan_out([{"n": 1}], tool="t")

    asyncio.run(main())


def test_a_waiting_batch_suspends_the_run_for_the_poll_holding_no_slot():
    async def main():
        store = FakeStore()
        host = FakeHost(("wait", BATCH_POLL_MS))
        ctx, _ = make(store, host)
        with pytest.raises(SuspendedError):
            await ctx.fan_out([{"n": 1}, {"n": 2}], tool="child", concurrency=5, fail_fast=True)
        run, args = host.runs[0]
        assert (run.principal, run.ttl_ms, args.tool, args.concurrency, args.fail_fast) == ("alice", 60_000, "child", 5, True)
        assert ctx.suspension is not None and ctx.suspension.batch and ctx.suspension.kind == "time"
        # The deadline: the poll and the queue timeout after now.
        assert len(store.suspends) == 1 and store.suspends[0][1] is None
        assert ctx.suspension.until + 60_000 == store.suspends[0][0]
        # Anything after the suspension suspends too.
        with pytest.raises(SuspendedError):
            await ctx.fan_out([{"n": 1}], tool="child")

    asyncio.run(main())


def test_a_done_batch_returns_its_result_and_reports_the_parents_progress():
    async def main():
        store = FakeStore()
        result = fan_out_result({"size": 3, "completed": 2, "failed": 1}, [{"status": "completed"}] * 2 + [None])
        ctx, _ = make(store, FakeHost(("done", result)))
        assert await ctx.fan_out([{}, {}, {}], tool="child") is result
        await ctx.flush()
        assert store.progress == [(3, 3, "3 of 3 children done (1 failed)")]

    asyncio.run(main())


def test_a_lost_lock_or_redis_mid_fan_out_ends_the_run_as_lock_lost():
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def main():
        for error in (TaskCancelledError("LOCK_LOST"), RedisConnectionError("gone")):
            ctx, lost = make(FakeStore(), FakeHost(error))
            with pytest.raises(TaskCancelledError) as raised:
                await ctx.fan_out([{}], tool="child")
            assert raised.value.reason == "LOCK_LOST" and lost == [True]

    asyncio.run(main())


def test_batch_outcomes_pages_the_rest_and_checks_its_range():
    async def main():
        ctx, _ = make(FakeStore(), FakeHost(("wait", 1)))
        assert await ctx.batch_outcomes(1000, 2) == [
            {"index": 1000, "status": "completed"},
            {"index": 1001, "status": "completed"},
        ]
        for start, count in ((-1, 1), (0, 10_001), (0, 1.5)):
            with pytest.raises(ValueError):
                await ctx.batch_outcomes(start, count)

    asyncio.run(main())


def test_the_result_lists_each_child_in_item_order_and_counts_the_unfinished_as_cancelled():
    listed = [
        {"status": "completed", "result": {"content": []}},
        {"status": "failed", "error": {"code": "NON_RETRYABLE", "message": "no", "data": 1}},
        None,
        {"status": "completed", "resultOmitted": True},
    ]
    result = fan_out_result({"size": 6, "completed": 2, "failed": 1}, listed)
    assert result == {
        "total": 6,
        "completed": 2,
        "failed": 1,
        "cancelled": 3,
        "outcomes": [
            {"index": 0, "status": "completed", "result": {"content": []}},
            {"index": 1, "status": "failed", "error": {"code": "NON_RETRYABLE", "message": "no"}},
            {"index": 2, "status": "cancelled"},
            {"index": 3, "status": "completed", "resultOmitted": True},
        ],
        "truncated": True,
        "outcomesOmitted": 2,
    }
    assert batch_message(2, 1, 6) == "3 of 6 children done (1 failed)"


def test_children_are_named_placed_and_optioned_as_the_node_worker_does():
    assert parse_batch_child_id("abc.12") == ("abc", 12)
    assert parse_batch_child_id("a.b.3") == ("a.b", 3)
    for other in ("abc", "abc.", "abc.01", ".3", "abc.-1"):
        assert parse_batch_child_id(other) is None
    # Level 1 adds nothing; the default level is 3; levels are clamped to 1..5.
    assert [priority_base(v) for v in (1, None, 3, 9, 0)] == [0, 2 * 262_144, 2 * 262_144, 4 * 262_144, 2 * 262_144]
    assert job_options("p.1", 7, {"attempts": 3, "backoff": {"type": "fixed", "delayMs": 50}}) == {
        "jobId": "p.1",
        "priority": 7,
        "attempts": 3,
        "backoff": {"type": "fixed", "delay": 50, "jitter": 0},
        "removeOnComplete": True,
        "removeOnFail": {"age": 3600, "count": 1000},
    }
    assert check_fan_out_args([{"a": 1}], "t", 64, False).items == [{"a": 1}]


def test_list_roots_asks_roots_list_and_checks_the_answer():
    async def main():
        store = FakeStore()
        ctx, _ = make(store, caps=["roots"])
        with pytest.raises(SuspendedError):
            await ctx.list_roots(key="client_roots")
        requests = store.suspends[0][1]
        assert [(r["method"], r["params"], r.get("key")) for r in requests] == [("roots/list", {}, "client_roots")]
        n = str(requests[0]["n"])
        answered = FakeStore({n: {"roots": [{"uri": "file:///a", "name": "a"}]}})
        ctx, _ = make(answered, caps=["roots"])
        assert await ctx.list_roots(key="client_roots") == {"roots": [{"uri": "file:///a", "name": "a"}]}
        bad = FakeStore({n: {"roots": [{"name": "no uri"}]}})
        ctx, _ = make(bad, caps=["roots"])
        with pytest.raises(TaskrelayError, match="roots/list is malformed"):
            await ctx.list_roots(key="client_roots")
        ctx, _ = make(FakeStore(), caps=["elicitation"])
        with pytest.raises(TaskrelayError, match="did not declare the roots capability"):
            await ctx.list_roots()

    asyncio.run(main())


class NoBatchRedis:
    """A Redis holding no batch: ``shape`` finds none, so ``fan_out`` goes on to create one."""

    def __init__(self):
        self.written = []

    async def hmget(self, key, names):
        return [None] * len(names)

    def __getattr__(self, name):
        self.written.append(name)
        raise AssertionError(f"fan_out went on to Redis ({name})")


class NoBatchStore:
    def __init__(self):
        self.redis = NoBatchRedis()

    async def call(self, name, keys, args):
        raise AssertionError(f"fan_out ran {name}")


def batch_parent(layout):
    from taskrelay_worker.batch_parent import BatchParent, FanOutRun
    from taskrelay_worker.context_checks import FanOutArgs
    from taskrelay_worker.keys import Keys

    parent = BatchParent(NoBatchStore(), Keys("taskrelay", layout), "q", {}, lambda pool: None)
    run = FanOutRun(task_id="ab12-t1", lock=JobLock("q~x", "tok"), principal="alice", ttl_ms=60_000, log=Logger("silent"))
    return parent, run, FanOutArgs(items=({"n": 1},), tool="child", concurrency=4, fail_fast=False)


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_a_parent_goes_on_to_create_the_batch_in_either_layout(layout):
    parent, run, args = batch_parent(layout)
    # Nothing refuses (the sharded layout too, §26.10): it reads the live workers' catalogs to find the child tool's pool.
    with pytest.raises(AssertionError, match="zrangebyscore"):
        asyncio.run(parent.fan_out(run, args, None, 0))


def test_the_batch_keys_are_the_manifests():
    from taskrelay_worker.batch_parent import BatchParent
    from taskrelay_worker.keys import Keys

    for layout in ("single", "sharded"):
        keys = Keys("taskrelay", layout)
        parent = BatchParent(NoBatchStore(), keys, "q", {}, lambda pool: None)
        k = parent._k("ab12-t1")
        assert set(k) == {"hash", "items", "outcomes", "open", "running"}
        assert all(k[member] == keys.batch("ab12-t1", member) for member in k)
    assert BatchParent(NoBatchStore(), Keys("taskrelay", "single"), "q", {}, None)._k("t1")["items"] == "taskrelay:batch:t1:items"

"""Isolated runs (PROTOCOL.md §31, §29.5) against a stand-in for the run's real context: the child process, the ctx
calls it makes, and its ends (done, memory, crash, abort, suspended). The worker-level flow is
test/python-isolate.e2e.test.ts."""

import asyncio
import os
from pathlib import Path

import pytest

from taskrelay_worker.__main__ import load_tools
from taskrelay_worker.context import RunSignal
from taskrelay_worker.errors import SuspendedError, TaskCancelledError, TaskrelayError
from taskrelay_worker.isolate import MemoryLimitError, check_isolated_tools
from taskrelay_worker.log import Logger
from taskrelay_worker.tools import define_tool

TOOLS = {t.name: t for t in load_tools(str(Path(__file__).with_name("_isolated_tools.py")))}


class State:
    def __init__(self):
        self.value = None

    def get(self):
        return self.value

    async def set(self, value):
        self.value = value


class FakeCtx:
    """The members of ToolContext an isolated run reaches."""

    def __init__(self):
        self.task_id = "t1"
        self.attempt = 1
        self.log = Logger("silent")
        self._signal = RunSignal()
        self.state = State()
        self.answers = {}
        self.suspension = None
        self.progressed = []

    @property
    def cancel_reason(self):
        return self._signal.reason

    async def progress(self, done, total=None, message=None):
        self.progressed.append((done, total, message))

    async def elicit(self, message, schema, key=None):
        self.suspension = "input"
        raise SuspendedError()


def run(name, ctx=None, abort_after=None):
    ctx = ctx or FakeCtx()

    async def main():
        if abort_after is not None:
            asyncio.get_running_loop().call_later(abort_after, ctx._signal.abort, "CLIENT_CANCELLED")
        return await TOOLS[name].run({}, ctx)

    return asyncio.run(main()), ctx


def test_a_run_happens_in_a_child_and_its_ctx_calls_reach_the_real_context():
    value, ctx = run("iso_echo")
    assert value["pid"] != os.getpid() and value["task"] == "t1"
    assert value["state"] == {"seen": True} and ctx.state.value == {"seen": True}
    assert ctx.progressed == [(1, 2, "half")]


def test_a_run_past_max_memory_mb_fails_with_memory_limit_not_retried():
    with pytest.raises(MemoryLimitError) as raised:
        run("iso_hog")
    assert str(raised.value) == "Tool iso_hog ran out of memory: its run used more than maxMemoryMb 96 MB and was stopped"
    assert raised.value.code == "MEMORY_LIMIT"


def test_a_child_that_exits_without_a_result_is_tool_failed():
    with pytest.raises(TaskrelayError) as raised:
        run("iso_crash")
    assert raised.value.code == "TOOL_FAILED"
    assert str(raised.value) == "Tool iso_crash's isolated run ended without a result (exit code 3)"


def test_an_abort_reaches_a_child_that_never_yields_by_killing_it_after_its_grace():
    class Aborting(FakeCtx):
        async def progress(self, done, total=None, message=None):
            await super().progress(done, total, message)
            # The child reported from inside its loop: abort now (it never reads the abort message).
            asyncio.get_running_loop().call_later(0.2, self._signal.abort, "CLIENT_CANCELLED")

    ctx = Aborting()
    with pytest.raises(TaskCancelledError) as raised:
        run("iso_spin", ctx)
    assert raised.value.reason == "CLIENT_CANCELLED"
    pid = int(ctx.progressed[0][2])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_question_suspends_the_run_through_the_child():
    with pytest.raises(SuspendedError):
        run("iso_ask")


def test_isolation_options_are_checked_as_node_checks_them():
    async def handler(args, ctx):
        return None

    with pytest.raises(TypeError, match="max_memory_mb needs isolate=True"):
        define_tool(name="x", description="x", run=handler, max_memory_mb=128)
    with pytest.raises(ValueError, match="max_memory_mb must be a whole number 64"):
        define_tool(name="x", description="x", run=handler, isolate=True, max_memory_mb=32)
    with pytest.raises(ValueError, match="isolate='thread' is Node's"):
        define_tool(name="x", description="x", run=handler, isolate="thread")
    stray = define_tool(name="stray", description="x", run=handler, isolate=True, module=str(Path(__file__).with_name("_isolated_tools.py")))
    with pytest.raises(ValueError, match="defines no tool of that name"):
        check_isolated_tools([stray], load_tools)

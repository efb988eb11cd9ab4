"""Python's ``ToolContext`` against the ctx surface the Node worker declares once (packages/worker/src/context-surface.ts,
PROTOCOL.md §31.5), as the build emits it into ``_generated/manifest.json`` (its ``context`` key).

Every member must be here, snake_case (``throwIfCancelled`` is ``throw_if_cancelled``; ``state.set`` is
``ctx.state.set``), with a compatible signature: each declared argument is a positional parameter, except an object,
whose properties are parameters of their own (``ctx.waitpoint(name, {timeoutMs})`` is
``ctx.waitpoint(name, *, timeout_ms=None)``); an optional argument has a default; a rest argument is ``*args``; no
parameter is required that the declaration does not know; and a member that returns a promise in Node is a coroutine
here. A member Python lacks or shapes otherwise today is an expected failure bound to its reason.
"""

from __future__ import annotations

import inspect
import json
import re
from importlib import resources
from typing import Any

import pytest

from taskrelay_worker.context import RunSignal, ToolContext, ToolState
from taskrelay_worker.log import Logger
from taskrelay_worker.output import TaskOutput
from taskrelay_worker.store import JobLock, TaskRecord
from taskrelay_worker.waitpoints import Waitpoint

SURFACE: dict[str, dict[str, Any]] = json.loads(
    (resources.files("taskrelay_worker") / "_generated" / "manifest.json").read_text(encoding="utf-8")
)["context"]

#: Where a nested member lives: ``state.set`` on the context's ``ToolState``, ``waitpoint.wait`` on what
#: ``ctx.waitpoint`` returns.
NESTED: dict[str, type] = {"state": ToolState, "output": TaskOutput, "waitpoint": Waitpoint}

#: Members Python shapes otherwise, by design, each with its reason (strict: a change of either side shows here).
#: Python lacks no member today: ``list_roots``, ``fan_out`` and ``batch_outcomes`` came with PROTOCOL §29.4.
EXPECTED: dict[str, tuple[str, bool]] = {
    "signal": ("Python's run signal is ctx.cancelled / ctx.cancel_reason: asyncio has no AbortSignal", True),
    "suspend": ("Python's suspend takes seconds (ctx.suspend(seconds)), not an object with forMs", True),
}

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _Store:
    pass


def _context() -> ToolContext:
    record = TaskRecord(task_id="t1", status="working", principal="p", tool="x", fields={})
    return ToolContext(
        task_id="t1",
        tool="x",
        attempt=1,
        signal=RunSignal(),
        store=_Store(),  # type: ignore[arg-type]
        lock=JobLock("q~x", "tok"),
        log=Logger("silent"),
        record=record,
        progress_interval_ms=0,
        input_timeout_ms=60_000,
        queue_timeout_ms=60_000,
        on_lock_lost=lambda: None,
    )


def _member(path: str) -> Any:
    """The member at ``path``: an attribute of a context (a field), or a class's function (a method, self first)."""
    head, _, rest = path.partition(".")
    if rest:
        return getattr(NESTED[head], snake(rest), None)
    found = inspect.getattr_static(_context(), snake(head), None)
    return found.fget if isinstance(found, property) else found


def signature_problems(fn: Any, args: dict[str, Any]) -> list[str]:
    """What keeps ``fn`` (a function whose first parameter is self) from taking the declared ``args`` (JSON Schema)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    positional = [p for p in params if p.kind in POSITIONAL]
    by_name = {p.name: p for p in params if p.kind in KEYWORD}
    var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    problems: list[str] = []
    bound: set[str] = set()
    items = args.get("prefixItems")
    if items is None:
        if not var_args:
            problems.append("takes no *args for its rest argument")
        items = []
    required_count = args.get("minItems", len(items))
    taken = 0
    for index, item in enumerate(items):
        required = index < required_count
        if item.get("type") == "object" and item.get("properties"):
            for prop in item["properties"]:
                name = snake(prop)
                param = by_name.get(name)
                if param is None:
                    if not var_kwargs or (required and prop in item.get("required", [])):
                        problems.append(f"has no parameter {name} (argument {index + 1}'s {prop})")
                    continue
                bound.add(name)
                if not (required and prop in item.get("required", [])) and param.default is inspect.Parameter.empty:
                    problems.append(f"requires {name}, which is optional")
            continue
        if taken >= len(positional):
            if not var_args:
                problems.append(f"has no positional parameter for argument {index + 1}")
            continue
        param = positional[taken]
        taken += 1
        bound.add(param.name)
        if not required and param.default is inspect.Parameter.empty:
            problems.append(f"requires {param.name}, which is optional (argument {index + 1})")
    for param in params:
        if param.name in bound or param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            problems.append(f"requires {param.name}, which the declaration does not have")
    return problems


def _case(name: str) -> Any:
    if name in EXPECTED:
        reason, strict = EXPECTED[name]
        return pytest.param(name, marks=pytest.mark.xfail(reason=reason, strict=strict), id=name)
    return pytest.param(name, id=name)


def test_the_manifest_carries_the_declared_surface_and_every_expected_failure_names_a_member_of_it():
    assert {"taskId", "progress", "elicit", "state.set", "waitpoint.wait"} <= set(SURFACE)
    assert set(EXPECTED) <= set(SURFACE)
    for name, member in SURFACE.items():
        assert member["kind"] in ("field", "fire-and-forget", "answers", "suspends"), name
        assert member["isolate"] in ("call", "message", "local"), name


@pytest.mark.parametrize("name", [_case(name) for name in SURFACE])
def test_the_python_context_has_the_member_with_a_compatible_signature(name: str):
    declared = SURFACE[name]
    member = _member(name)
    assert member is not None, f"ToolContext has no {name} (Python: {snake(name)})"
    if declared["kind"] == "field":
        return
    assert callable(member), f"{name} is not callable"
    problems = signature_problems(member, declared["args"])
    assert problems == [], f"{snake(name)}{inspect.signature(member)} {'; '.join(problems)}"
    # A member that returns a promise in Node is awaited here too; a fire-and-forget one may be either.
    if not declared["sync"] and declared["kind"] != "fire-and-forget":
        assert inspect.iscoroutinefunction(member), f"{name} returns a promise in Node: it is async here"


def test_the_signature_check_tells_a_missing_option_and_an_unknown_required_parameter():
    object_arg = {"prefixItems": [{"type": "string"}, {"type": "object", "properties": {"timeoutMs": {}}}]}

    async def flattened(self, name, *, timeout_ms=None): ...

    async def no_option(self, name): ...

    async def extra(self, name, other, *, timeout_ms=None): ...

    assert signature_problems(flattened, {**object_arg, "minItems": 1}) == []
    assert signature_problems(no_option, {**object_arg, "minItems": 1}) == [
        "has no parameter timeout_ms (argument 2's timeoutMs)"
    ]
    assert signature_problems(extra, {**object_arg, "minItems": 1}) == [
        "requires other, which the declaration does not have"
    ]

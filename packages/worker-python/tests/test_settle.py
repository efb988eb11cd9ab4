"""The Python worker's pure ``settle()`` from the table the Node worker's is tested by (test/vectors/settle.json, read
by packages/worker/test/settle.test.ts too): one test per case. The tests run from the repository, as CI runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from taskrelay_worker.engine.settle import SettleAction, SettleInput, fail_or_retry, settle
from taskrelay_worker.errors import NonRetryableError, RetryAfterError, SuspendedError, TaskrelayError


def _table() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "test" / "vectors" / "settle.json"
        if candidate.is_file():
            return candidate
    return None


TABLE = _table()
CASES: list[dict] = json.loads(TABLE.read_text(encoding="utf-8"))["cases"] if TABLE else []


class _Foreign(Exception):
    """An error of another copy of the package: only its name and its fields count."""


def error_of(spec: dict) -> BaseException:
    message = spec.get("message", "")
    kind = spec["type"]
    if kind == "RetryAfterError":
        return RetryAfterError(spec["retryAfterMs"] / 1000, message)
    if kind == "SuspendedError":
        return SuspendedError()
    if kind == "NonRetryableError":
        return NonRetryableError(message)
    if kind == "Error":
        return RuntimeError(message)
    if kind == "foreign":
        foreign = type(spec["name"], (_Foreign,), {})(message)
        if "retryAfterMs" in spec:
            foreign.retry_after_ms = spec["retryAfterMs"]  # type: ignore[attr-defined]
        return foreign
    if kind == "plain":
        plain = _Foreign(message)
        plain.code = spec["code"]  # type: ignore[attr-defined]
        return plain
    raise ValueError(f"unknown error type {kind!r} in settle.json")


def as_json(action: SettleAction, error: BaseException | None) -> dict[str, Any]:
    """The action in the table's words: camelCase, its kind's fields only, the input's own error as ``$error``."""
    names = {"went_on": "wentOn"}
    out: dict[str, Any] = {"kind": action.kind}
    for field in ("reason", "discarded", "went_on", "value", "ms", "message", "error"):
        value = getattr(action, field)
        if value is not None:
            out[names.get(field, field)] = "$error" if field == "error" and value is error else value
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_settle_decides_as_the_shared_table_says(case: dict) -> None:
    given = case["input"]
    outcome = given["outcome"]
    error = None if outcome["ok"] else error_of(outcome["error"])
    action = settle(
        SettleInput(
            ok=outcome["ok"],
            value=outcome.get("value"),
            error=error,
            reason=given.get("reason"),
            suspended=given.get("suspended", False),
            attempts_made=given.get("attemptsMade", 0),
            attempts=given.get("attempts", 1),
        )
    )
    assert as_json(action, error) == case["expect"]


def test_the_table_is_found_from_the_repository():
    # A moved table would leave no case to run, silently.
    assert TABLE is not None and len(CASES) >= 20


def test_a_stray_suspension_fails_in_python_only():
    # The Python worker fails a SuspendedError raised without a suspension (its context was misused); Node retries it.
    error = SuspendedError()
    assert fail_or_retry(error, 0, 5).kind == "fail"
    assert fail_or_retry(TaskrelayError("INTERNAL", "flaky"), 0, 5).kind == "retry"

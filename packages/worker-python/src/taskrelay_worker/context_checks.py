"""What ``ctx`` checks before it does anything, in the worker's process and in an isolated run's child alike: the
Python counterpart of the Node worker's ``context-checks.ts`` and ``well-formed.ts``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: The rules of a tag (PROTOCOL.md §30.2), as the Node worker's ``TAG_PATTERN`` and ``MAX_TAGS``.
_TAG = re.compile(r"[A-Za-z0-9_.:/=@+-]{1,64}")
MAX_TAGS = 10

#: Progress and log message text above this many UTF-8 bytes is cut, with a marker (PROTOCOL.md §22.4).
MAX_PROGRESS_MESSAGE_BYTES = 4_096
MAX_LOG_BYTES = 65_536
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_TRUNCATED = "… [truncated]"


def bounded_text(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    room = max_bytes - len(_TRUNCATED.encode())
    return data[:room].decode("utf-8", "ignore") + _TRUNCATED


def question_identity(method: str, params: dict[str, Any], key: str | None) -> str:
    """A question's identity (``questionIdentity`` in task-model.ts): its method, key and, for a form, its schema."""
    schema = params.get("requestedSchema") if method == "elicitation/create" else None
    return json.dumps([method, key, schema], sort_keys=True, separators=(",", ":"), ensure_ascii=False)

#: The limits ``ctx.fan_out`` checks (FanOutItemsSchema, FanOutOptionsSchema).
MAX_ITEMS = 100_000
MAX_CONCURRENCY = 1_000
DEFAULT_CONCURRENCY = 64
MAX_PAGE = 10_000


def batch_message(completed: int, failed: int, total: int) -> str:
    """The parent's progress message (``batchMessage``): the same text on every worker."""
    return f"{completed + failed} of {total} children done ({failed} failed)"


@dataclass(frozen=True)
class FanOutArgs:
    items: list[dict[str, Any]]
    tool: str
    concurrency: int
    fail_fast: bool


def check_fan_out_args(items: Any, tool: Any, concurrency: Any, fail_fast: Any) -> FanOutArgs:
    """``ctx.fan_out``'s argument checks, as Node's schemas make them: a TypeError naming what is wrong."""
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, dict) for item in items):
        raise TypeError("ctx.fan_out: items must be a list of argument objects (dicts)")
    if not items:
        raise TypeError("ctx.fan_out: items must not be empty")
    if len(items) > MAX_ITEMS:
        raise TypeError(f"ctx.fan_out: at most {MAX_ITEMS} items")
    if not isinstance(tool, str) or not tool:
        raise TypeError("ctx.fan_out: tool must be a non-empty string")
    if (
        not isinstance(concurrency, int)
        or isinstance(concurrency, bool)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise TypeError(f"ctx.fan_out: concurrency must be a whole number from 1 to {MAX_CONCURRENCY}")
    if not isinstance(fail_fast, bool):
        raise TypeError("ctx.fan_out: fail_fast must be True or False")
    for item in items:
        # JSON text never holds a raw newline: batchCreate splits the items on it.
        json.dumps(item, allow_nan=False)
    return FanOutArgs(list(items), tool, concurrency, fail_fast)

"""What ``ctx`` checks before it does anything, in the worker's process and in an isolated run's child alike: the
Python counterpart of the Node worker's ``context-checks.ts`` and ``well-formed.ts``."""

from __future__ import annotations

import json
import re
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

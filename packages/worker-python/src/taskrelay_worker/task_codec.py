"""How a task's hash reads and how a worker writes its values (PROTOCOL.md §5), as the Node store's
``task-codec.ts``: the record, the job lock every write names, JavaScript's number and time text."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .protocol import FIELDS, FIELD_PREFIXES

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class JobLock:
    """The queue (ours, without ``q-``) and token of the job a run holds: every write names it (§10.4)."""

    queue: str
    token: str
    #: The sharded layout: the shard of the job's queue when its id names another (a batch child's, whose id names its
    #: parent's shard, PROTOCOL.md §26.10): its lock key is on this shard.
    shard: str | None = None


@dataclass
class TaskRecord:
    task_id: str
    status: str
    principal: str
    tool: str
    fields: dict[str, str]
    state: Any = None
    steps: dict[str, Any] = field(default_factory=dict)
    input_requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_responses: dict[str, Any] = field(default_factory=dict)
    client_capabilities: list[str] | None = None
    cancel_reason: str | None = None
    tool_version: str | None = None
    #: Input request numbers up to this one were cleared by a restart (§12.11): new ones number above it.
    input_floor: int = 0


def iso_now() -> str:
    """``new Date().toISOString()``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def js_number(value: float) -> str:
    """A number as JavaScript's ``String(n)`` writes it, so both workers store the same text."""
    if isinstance(value, bool):
        raise TypeError("a number, not a bool")
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def _json(value: Any) -> str:
    """JSON text as the Node worker's ``JSON.stringify`` writes it: NaN and the infinities become ``null``. Python's
    ``json.dumps`` writes them as ``NaN`` and ``Infinity``, which no JSON parser reads: a result holding one was stored
    as text the gateway could not parse, and the task completed without its result."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as error:
        if "Out of range float" not in str(error):
            raise
        return json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None`` (in dicts, lists and tuples)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _parse_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_record(h: dict[str, str]) -> TaskRecord | None:
    status = h.get(FIELDS["status"])
    task_id = h.get(FIELDS["taskId"])
    if not status or not task_id:
        return None
    record = TaskRecord(
        task_id=task_id,
        status=status,
        principal=h.get(FIELDS["principal"], ""),
        tool=h.get(FIELDS["tool"], ""),
        fields=h,
        state=_parse_json(h.get(FIELDS["state"])),
        steps=_parse_json(h.get(FIELDS["steps"])) or {},
        cancel_reason=h.get(FIELDS["cancelReason"]),
        tool_version=h.get(FIELDS["toolVersion"]),
        input_floor=int(h.get(FIELDS["inputFloor"], "0") or 0),
    )
    caps = h.get(FIELDS["clientCaps"])
    if caps is not None:
        record.client_capabilities = [c for c in caps.split(",") if c]
    for name, value in h.items():
        if name.startswith(FIELD_PREFIXES["input"]):
            request = _parse_json(value)
            if isinstance(request, dict):
                record.input_requests[name[len(FIELD_PREFIXES["input"]) :]] = request
        elif name.startswith(FIELD_PREFIXES["answer"]):
            record.input_responses[name[len(FIELD_PREFIXES["answer"]) :]] = _parse_json(value)
    return record


def _from_flat(values: Any) -> dict[str, str]:
    flat = list(values) if isinstance(values, (list, tuple)) else []
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}

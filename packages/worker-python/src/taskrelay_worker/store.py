"""The task store as a worker uses it (PROTOCOL.md §5, §6, §10, §12): every write is one of the shared Lua scripts,
lock-checked with the job's token, exactly as the Node worker's ``RedisTaskStore`` calls them."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from redis.asyncio import Redis

from .keys import Keys, batch_child_id
from .protocol import CODES, CODE_NAMES, FIELDS, FIELD_PREFIXES, RESULT, SCRIPTS, ScriptSpec

#: The largest ``ctx.state`` / step value, as JSON (the Node worker's MAX_STATE_BYTES).
MAX_STATE_BYTES = 65_536
#: A task keeps its newest this many log lines, each at most this many bytes (MAX_KEPT_LOG_LINES, ..._BYTES).
MAX_KEPT_LOG_LINES = 1_000
MAX_KEPT_LOG_LINE_BYTES = 2_048
#: A child's stored outcome keeps its result up to this many characters of JSON (MAX_STORED_CHILD_RESULT_CHARS).
MAX_STORED_CHILD_RESULT_CHARS = 16_384
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class ScriptReplyError(Exception):
    """A script answered a code it does not declare: the script and this worker disagree (another generation)."""


@dataclass(frozen=True)
class JobLock:
    """The queue (ours, without ``q-``) and token of the job a run holds: every write names it (§10.4)."""

    queue: str
    token: str


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
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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


class TaskStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._scripts = {name: redis.register_script(spec.source) for name, spec in SCRIPTS.items()}
        #: First runs' starts not answered yet, by task id (§21.2.1): every other script naming the task waits for it.
        self._starting: dict[str, asyncio.Future] = {}

    def start_pipelined(
        self, task_id: str, lock: JobLock, attempt: int, deadline_at: int, share_principal: str, tool_version: str
    ) -> asyncio.Future:
        """A first run's start (PROTOCOL.md §21.2.1), sent now and not awaited: the future of ``start_run``'s answer.
        Until it is answered, every script this store runs for the task waits for it, so Redis runs the start before
        any other write of the run (redis-py's pool keeps no order between two coroutines' commands)."""
        started = asyncio.ensure_future(
            self.start_brief(task_id, lock, attempt, deadline_at, share_principal, tool_version)
        )
        self._starting[task_id] = started

        def answered(_: asyncio.Future) -> None:
            if self._starting.get(task_id) is started:
                del self._starting[task_id]

        started.add_done_callback(answered)
        return started

    async def _after_start(self, keys: dict[str, str]) -> None:
        for task_id, started in list(self._starting.items()):
            if any(task_id in key for key in keys.values()):
                await asyncio.wait([started])

    async def call(self, name: str, keys: dict[str, str], args: dict[str, Any]) -> tuple[str, list[Any]]:
        """Runs script ``name`` with named keys and arguments; answers its code's name and the values after it."""
        spec: ScriptSpec = SCRIPTS[name]
        if self._starting and name != "startRun":
            await self._after_start(keys)
        positional_keys = [keys.get(k, "") for k in spec.keys]
        positional_args = [args.get(a, "") for a in spec.args]
        raw = await self._scripts[name](keys=positional_keys, args=positional_args)
        code = raw[0] if isinstance(raw, list) and raw else None
        code_name = CODE_NAMES.get(code) if isinstance(code, int) else None
        if code_name is None or code_name not in spec.codes:
            raise ScriptReplyError(f"Lua script {name} answered {code!r}, not one of its codes ({', '.join(spec.codes)})")
        return code_name, list(raw[1:])

    def _lock_key(self, task_id: str, lock: JobLock | None) -> str:
        return self.keys.bull_job_lock(lock.queue, task_id) if lock else self.keys.task(task_id)

    async def get(self, task_id: str) -> TaskRecord | None:
        return parse_record(await self.redis.hgetall(self.keys.task(task_id)))

    async def _start_call(
        self,
        task_id: str,
        lock: JobLock,
        attempt: int,
        deadline_at: int,
        share_principal: str | None,
        tool_version: str,
        defer_if_other: bool,
        reset: bool,
        brief: bool,
    ) -> tuple[str, list[Any]]:
        """The ``startRun`` script (§10.2): its code and values."""
        task_key = self.keys.task(task_id)
        return await self.call(
            "startRun",
            {
                "task": task_key,
                "lock": self.keys.bull_job_lock(lock.queue, task_id),
                "share": task_key if share_principal is None else self.keys.for_task(task_id).fair_share(lock.queue, share_principal),
            },
            {
                "lockToken": lock.token,
                "deadlineAt": str(deadline_at),
                "now": iso_now(),
                "attempt": str(attempt),
                "jobId": task_id,
                "toolVersion": tool_version,
                "deferIfOther": "1" if defer_if_other else "0",
                "reset": "1" if reset else "0",
                "brief": "1" if brief else "0",
            },
        )

    async def start_run(
        self,
        task_id: str,
        lock: JobLock,
        attempt: int,
        deadline_at: int,
        share_principal: str | None,
        tool_version: str = "",
        defer_if_other: bool = False,
        reset: bool = False,
    ) -> tuple[bool, TaskRecord | None, str | None]:
        """(lock lost, the task as the run starts, the other tool version it records) — §10.2, §12.11; the job leaves
        its principal's fair share (§25)."""
        code, values = await self._start_call(
            task_id, lock, attempt, deadline_at, share_principal, tool_version, defer_if_other, reset, False
        )
        if code == RESULT.LOCK_LOST:
            return True, None, None
        if code == RESULT.TASK_MISSING:
            return False, None, None
        if code == RESULT.VERSION_OTHER:
            return False, None, str(values[0]) if values else ""
        return False, parse_record(_from_flat(values[0] if values else [])), None

    async def start_brief(
        self, task_id: str, lock: JobLock, attempt: int, deadline_at: int, share_principal: str, tool_version: str
    ) -> tuple[bool, TaskRecord | None, bool]:
        """A first run's start (§21.2.1 item 2, issue 46): (lock lost, the task when it is already ended, started). A
        task that starts is answered without its hash: the context reads it when a member needs it."""
        code, values = await self._start_call(
            task_id, lock, attempt, deadline_at, share_principal, tool_version, False, False, True
        )
        if code == RESULT.LOCK_LOST:
            return True, None, False
        if code == RESULT.TASK_MISSING:
            return False, None, False
        if not values:
            return False, None, True
        return False, parse_record(_from_flat(values[0])), False

    async def transition(
        self, task_id: str, to: str, fields: dict[str, Any], lock: JobLock | None
    ) -> tuple[bool, str | None, bool]:
        """(written, the status that won, lock lost) — §2, §5.3."""
        extra: dict[str, str] = {}
        if fields.get("statusMessage") is not None:
            extra[FIELDS["statusMessage"]] = fields["statusMessage"]
        if fields.get("result") is not None:
            extra[FIELDS["result"]] = _json(fields["result"])
        if fields.get("error") is not None:
            extra[FIELDS["error"]] = _json(fields["error"])
        if fields.get("cancelReason") is not None:
            extra[FIELDS["cancelReason"]] = fields["cancelReason"]
        outcome_chars = len(extra.get(FIELDS["result"], "")) + len(extra.get(FIELDS["error"], ""))
        task_key = self.keys.task(task_id)
        code, values = await self.call(
            "transition",
            {
                "task": task_key,
                "live": self.keys.for_task(task_id).live,
                "lock": self._lock_key(task_id, lock),
                "webhookDue": self.keys.for_task(task_id).webhook_due,
                "webhookPending": self.keys.for_task(task_id).webhook_pending,
                "webhookDead": self.keys.for_task(task_id).webhook_dead,
                "retention": self.keys.for_task(task_id).retention,
            },
            {
                "to": to,
                "now": iso_now(),
                "fields": _json(extra),
                "lockToken": lock.token if lock else "",
                "channelPrefix": self.keys.gateway_channel_prefix,
                "channelSuffix": self.keys.gateway_channel_suffix,
                "ackTo": "",
                "deadlineAt": "",
                "dropIdempotency": "0",
                # §6.7: a small outcome rides on the terminal event (MAX_EVENT_OUTCOME_CHARS, 64 Ki characters).
                "eventOutcome": "1" if to in TERMINAL and outcome_chars <= 65_536 else "0",
                "webhookPrefix": self.keys.for_task(task_id).webhook_event_prefix,
            },
        )
        status = values[0] if values and isinstance(values[0], str) else None
        if code == RESULT.OK:
            return True, to, False
        return False, status, code == RESULT.LOCK_LOST

    async def record_progress(
        self, task_id: str, progress: float, total: float | None, message: str | None, lock: JobLock | None
    ) -> str:
        """'accepted', 'stale', 'terminal', 'missing' or 'lock_lost' (§6.2)."""
        code, _ = await self.call(
            "progress",
            {"task": self.keys.task(task_id), "lock": self._lock_key(task_id, lock)},
            {
                "progress": js_number(progress),
                "total": "" if total is None else js_number(total),
                "message": "" if message is None else _json(message),
                "now": iso_now(),
                "channelPrefix": self.keys.gateway_channel_prefix,
                "channelSuffix": self.keys.gateway_channel_suffix,
                "lockToken": lock.token if lock else "",
                "backlogPrefix": self.keys.gateway_backlog_prefix,
                "backlogSuffix": self.keys.gateway_backlog_suffix,
            },
        )
        return {RESULT.OK: "accepted", RESULT.PROGRESS_STALE: "stale", RESULT.TASK_TERMINAL: "terminal", RESULT.LOCK_LOST: "lock_lost"}.get(
            code, "missing"
        )

    async def record_log(self, task_id: str, level: str, data: Any, logger: str | None, lock: JobLock | None) -> str:
        """'published', 'unrouted', 'dropped' (the gateway's backlog is full, §22.4), 'terminal', 'missing' or
        'lock_lost' (§15)."""
        code, _ = await self.call(
            "log",
            {"task": self.keys.task(task_id), "lock": self._lock_key(task_id, lock)},
            {
                "level": level,
                "data": _json(data),
                "logger": "" if logger is None else _json(logger),
                "channelPrefix": self.keys.gateway_channel_prefix,
                "channelSuffix": self.keys.gateway_channel_suffix,
                "lockToken": lock.token if lock else "",
                "backlogPrefix": self.keys.gateway_backlog_prefix,
                "backlogSuffix": self.keys.gateway_backlog_suffix,
            },
        )
        return {
            RESULT.OK: "published",
            RESULT.UNROUTED: "unrouted",
            RESULT.CHANNEL_FULL: "dropped",
            RESULT.TASK_TERMINAL: "terminal",
            RESULT.LOCK_LOST: "lock_lost",
        }.get(code, "missing")

    async def open_waitpoint(
        self, task_id: str, lock: JobLock, name: str, token: str, timeout_ms: int
    ) -> tuple[str, dict[str, Any] | None]:
        """('ok', record), ('gone', None) or ('lock_lost', None): the waitpoint an earlier run stored, else a new one
        with ``token`` (§32.1); ended as ``timedOut`` here once past its time."""
        code, values = await self.call(
            "waitpointOpen",
            {"task": self.keys.task(task_id), "lock": self.keys.bull_job_lock(lock.queue, task_id)},
            {"lockToken": lock.token, "field": f"{FIELD_PREFIXES['waitpoint']}{name}", "token": token, "timeoutMs": timeout_ms},
        )
        if code == RESULT.LOCK_LOST:
            return "lock_lost", None
        if code != RESULT.OK:
            return "gone", None
        return "ok", json.loads(values[0])

    async def read_waitpoint(self, task_id: str, name: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(self.keys.task(task_id), f"{FIELD_PREFIXES['waitpoint']}{name}")
        return None if raw is None else json.loads(raw)

    async def keep_logs(self, task_id: str, lines: list[str]) -> None:
        """Appends a run's log lines (each a JSON object as text) to its task's stream (§30.4); nothing for a gone task."""
        if not lines:
            return
        await self.call(
            "logKeep",
            {"task": self.keys.task(task_id), "logs": self.keys.task_logs(task_id)},
            {"maxLen": MAX_KEPT_LOG_LINES, "lines": json.dumps(lines)},
        )

    async def suspend(
        self,
        task_id: str,
        lock: JobLock,
        deadline_at: int,
        requests: list[dict[str, Any]] | None = None,
        status_message: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """('suspended', answers already stored), ('lock_lost', {}) or ('gone', {}) — §12.2, §3.4."""
        encoded = ""
        if requests:
            encoded = _json([[r["n"], _json({k: v for k, v in r.items() if k != "n"})] for r in requests])
        code, values = await self.call(
            "suspend",
            {
                "task": self.keys.task(task_id),
                "lock": self.keys.bull_job_lock(lock.queue, task_id),
                "webhookDue": self.keys.for_task(task_id).webhook_due,
                "webhookPending": self.keys.for_task(task_id).webhook_pending,
                "webhookDead": self.keys.for_task(task_id).webhook_dead,
            },
            {
                "lockToken": lock.token,
                "requests": encoded,
                "now": iso_now(),
                "deadlineAt": str(deadline_at),
                "channelPrefix": self.keys.gateway_channel_prefix,
                "channelSuffix": self.keys.gateway_channel_suffix,
                "webhookPrefix": self.keys.for_task(task_id).webhook_event_prefix,
                "statusMessage": status_message or "",
            },
        )
        if code == RESULT.OK:
            flat = values[0] if values and isinstance(values[0], list) else []
            return "suspended", {str(flat[i]): _parse_json(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
        return ("lock_lost", {}) if code == RESULT.LOCK_LOST else ("gone", {})

    async def set_state(self, task_id: str, lock: JobLock, field_name: str, value: Any) -> str:
        """'written', 'gone' or 'lock_lost' (§12.1); ``field_name`` is 'state' or 'steps'."""
        text = _json(value)
        if len(text.encode()) > MAX_STATE_BYTES:
            what = "ctx.state" if field_name == "state" else "ctx.step"
            raise ValueError(f"{what} value is over {MAX_STATE_BYTES} bytes as JSON")
        code, _ = await self.call(
            "setState",
            {"task": self.keys.task(task_id), "lock": self.keys.bull_job_lock(lock.queue, task_id)},
            {"lockToken": lock.token, "field": FIELDS[field_name], "json": text},
        )
        if code == RESULT.OK:
            return "written"
        return "lock_lost" if code == RESULT.LOCK_LOST else "gone"

    async def add_tags(self, task_id: str, lock: JobLock, tags: list[str]) -> str:
        """'written', 'full' (more than 10 together: nothing written), 'gone' or 'lock_lost' (§30.2)."""
        code, _ = await self.call(
            "tag",
            {"task": self.keys.task(task_id), "lock": self.keys.bull_job_lock(lock.queue, task_id)},
            {"lockToken": lock.token, "tags": ",".join(tags), "max": 10},
        )
        if code == RESULT.OK:
            return "written"
        if code == RESULT.LIMIT_FULL:
            return "full"
        return "lock_lost" if code == RESULT.LOCK_LOST else "gone"

    async def start_child(self, parent_id: str, index: int, lock: JobLock) -> tuple[str, str, str]:
        """A batch child's run starts (§26.3): ('run', owner, parent pool), 'parent_ended', 'recorded',
        'lock_lost' or 'missing'."""
        code, values = await self.call(
            "batchStart",
            {
                "task": self.keys.task(parent_id),
                "batch": self.keys.batch(parent_id),
                "outcomes": self.keys.batch(parent_id, "outcomes"),
                "running": self.keys.batch(parent_id, "running"),
                "lock": self.keys.bull_job_lock(lock.queue, batch_child_id(parent_id, index)),
            },
            {"lockToken": lock.token, "index": str(index)},
        )
        if code == RESULT.OK:
            owner = values[0] if values and isinstance(values[0], str) else ""
            pool = values[1] if len(values) > 1 and isinstance(values[1], str) else ""
            return "run", owner, pool
        outcome = {RESULT.TASK_TERMINAL: "parent_ended", RESULT.OUTCOME_RECORDED: "recorded", RESULT.LOCK_LOST: "lock_lost"}
        return outcome.get(code, "missing"), "", ""

    async def record_child(self, parent_id: str, index: int, owner: str, lock: JobLock, outcome: dict[str, Any]) -> dict[str, Any]:
        """Records a child's outcome exactly once, under its job lock (§26.3)."""
        child_id = batch_child_id(parent_id, index)
        text = _json(outcome)
        if len(text) > MAX_STORED_CHILD_RESULT_CHARS and "result" in outcome:
            text = _json({**{k: v for k, v in outcome.items() if k != "result"}, "resultOmitted": True})
        code, values = await self.call(
            "batchRecord",
            {
                "batch": self.keys.batch(parent_id),
                "outcomes": self.keys.batch(parent_id, "outcomes"),
                "open": self.keys.batch(parent_id, "open"),
                "running": self.keys.batch(parent_id, "running"),
                "lock": self.keys.bull_job_lock(lock.queue, child_id),
                "principalOpen": self.keys.for_task(parent_id).principal_open_tasks(owner),
            },
            {
                "lockToken": lock.token,
                "index": str(index),
                "childId": child_id,
                "failed": "0" if outcome.get("status") == "completed" else "1",
                "outcome": text,
            },
        )
        if code == RESULT.OK:
            done, size, failed, wake, below = (values + [0, 0, 0, "0", "0"])[:5]
            return {
                "outcome": "recorded",
                "done": int(done),
                "size": int(size),
                "failed": int(failed),
                "wake": str(wake) == "1",
                # The parent should run now (§26.4's condition), whether this record crossed it or an earlier one did.
                "below": str(below) == "1",
            }
        return {"outcome": {RESULT.OUTCOME_RECORDED: "duplicate", RESULT.LOCK_LOST: "lock_lost"}.get(code, "missing")}

    async def known_generations(self) -> dict[str, int]:
        """The scripts generations gateways announced (§29.2): generation -> last announced (ms)."""
        seen = await self.redis.hgetall(self.keys.protocol)
        return {str(k): int(v) for k, v in seen.items() if str(v).isdigit()}


__all__ = ["CODES", "JobLock", "TaskRecord", "TaskStore", "iso_now", "js_number", "parse_record"]

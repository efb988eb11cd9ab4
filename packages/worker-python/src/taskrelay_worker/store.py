"""The task store as a worker uses it (PROTOCOL.md §5, §6, §10, §12): every write is one of the shared Lua scripts,
lock-checked with the job's token, exactly as the Node worker's ``RedisTaskStore`` calls them."""

from __future__ import annotations

import asyncio
from typing import Any

from .protocol import CODES, FIELDS, RESULT
from .store_children import MAX_STORED_CHILD_RESULT_CHARS, BatchChildWrites
from .store_messages import MAX_KEPT_LOG_LINE_BYTES, MAX_KEPT_LOG_LINES, RunMessageWrites
from .store_runner import ScriptReplyError, StoreRunner
from .store_waitpoints import WaitpointWrites
from .task_codec import TERMINAL, JobLock, TaskRecord, _from_flat, _json, _parse_json, iso_now, js_number, parse_record

#: The largest ``ctx.state`` / step value, as JSON (the Node worker's MAX_STATE_BYTES).
MAX_STATE_BYTES = 65_536


class TaskStore(StoreRunner, RunMessageWrites, WaitpointWrites, BatchChildWrites):
    """The worker's task store: a run's writes here, its other aggregates as the mixins (messages, waitpoints, batch
    children), all over one ``StoreRunner``."""

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
        flat = [item for pair in extra.items() for item in pair]
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
                "fieldCount": str(len(flat)),
                "lockToken": lock.token if lock else "",
                "channelPrefix": self.keys.for_task(task_id).gateway_channel_prefix,
                "channelSuffix": self.keys.for_task(task_id).gateway_channel_suffix,
                "ackTo": "",
                "deadlineAt": "",
                "dropIdempotency": "0",
                # §6.7: a small outcome rides on the terminal event (MAX_EVENT_OUTCOME_CHARS, 64 Ki characters).
                "eventOutcome": "1" if to in TERMINAL and outcome_chars <= 65_536 else "0",
                "webhookPrefix": self.keys.for_task(task_id).webhook_event_prefix,
                "publish": self.keys.publish_command,
                "fields": flat,
            },
        )
        status = values[0] if values and isinstance(values[0], str) else None
        if code == RESULT.OK:
            return True, to, False
        return False, status, code == RESULT.LOCK_LOST

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
                "channelPrefix": self.keys.for_task(task_id).gateway_channel_prefix,
                "channelSuffix": self.keys.for_task(task_id).gateway_channel_suffix,
                "webhookPrefix": self.keys.for_task(task_id).webhook_event_prefix,
                "statusMessage": status_message or "",
                "publish": self.keys.publish_command,
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


__all__ = [
    "CODES",
    "MAX_KEPT_LOG_LINES",
    "MAX_KEPT_LOG_LINE_BYTES",
    "MAX_STATE_BYTES",
    "MAX_STORED_CHILD_RESULT_CHARS",
    "TERMINAL",
    "JobLock",
    "ScriptReplyError",
    "TaskRecord",
    "TaskStore",
    "iso_now",
    "js_number",
    "parse_record",
]

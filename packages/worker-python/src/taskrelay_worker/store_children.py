"""A batch child's run in the store (PROTOCOL.md §26.3): its start against the parent's batch and its outcome, recorded
exactly once under the child's job lock."""

from __future__ import annotations

from typing import Any

from .keys import Keys, batch_child_id
from .protocol import RESULT
from .task_codec import JobLock, _json

#: A child's stored outcome keeps its result up to this many characters of JSON (MAX_STORED_CHILD_RESULT_CHARS).
MAX_STORED_CHILD_RESULT_CHARS = 16_384


class BatchChildWrites:
    """The batch-child members of ``TaskStore`` (a mixin over its ``StoreRunner``)."""

    keys: Keys

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

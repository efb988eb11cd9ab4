"""A batch child's run in the store (PROTOCOL.md §26.3): its start against the parent's batch and its outcome, recorded
exactly once under the child's job lock."""

from __future__ import annotations

import json
from typing import Any

from .keys import Keys, batch_child_id
from .protocol import RESULT
from .task_codec import JobLock, _json

#: A child's stored outcome keeps its result up to this many characters of JSON (MAX_STORED_CHILD_RESULT_CHARS).
MAX_STORED_CHILD_RESULT_CHARS = 16_384
#: How long a child's claimed outcome lives on its shard at most (§26.10): the batch's keys' ttl (BATCH_CLAIM_TTL_MS).
BATCH_CLAIM_TTL_MS = 7 * 86_400_000


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value if isinstance(value, str) else None


class BatchChildWrites:
    """The batch-child members of ``TaskStore`` (a mixin over its ``StoreRunner``)."""

    keys: Keys

    async def start_child(self, parent_id: str, index: int, lock: JobLock) -> tuple[str, str, str]:
        """A batch child's run starts (§26.3): ('run', owner, parent pool), 'parent_ended', 'recorded',
        'lock_lost' or 'missing'.

        In the sharded layout (``lock.shard``, §26.10) the child's lock is on its own shard: it is read there first,
        and the script on the parent's shard runs with no lock token."""
        child_id = batch_child_id(parent_id, index)
        if lock.shard is not None:
            held = await self.redis.get(self.keys.for_shard(lock.shard).bull_job_lock_here(lock.queue, child_id))  # type: ignore[attr-defined]
            if _text(held) != lock.token:
                return "lock_lost", "", ""
        code, values = await self.call(
            "batchStart",
            {
                "task": self.keys.task(parent_id),
                "batch": self.keys.batch(parent_id),
                "outcomes": self.keys.batch(parent_id, "outcomes"),
                "running": self.keys.batch(parent_id, "running"),
                "lock": self.keys.bull_job_lock(lock.queue, child_id),
            },
            {"lockToken": lock.token if lock.shard is None else "", "index": str(index)},
        )
        if code == RESULT.OK:
            owner = values[0] if values and isinstance(values[0], str) else ""
            pool = values[1] if len(values) > 1 and isinstance(values[1], str) else ""
            return "run", owner, pool
        outcome = {RESULT.TASK_TERMINAL: "parent_ended", RESULT.OUTCOME_RECORDED: "recorded", RESULT.LOCK_LOST: "lock_lost"}
        return outcome.get(code, "missing"), "", ""

    async def claimed_child(self, parent_id: str, index: int, lock: JobLock) -> dict[str, Any] | None:
        """The sharded layout (§26.10): the outcome a run of this child claimed on its shard before its worker died, not
        counted yet (the tool is not run again: the record counts it), or None."""
        if lock.shard is None:
            return None
        text = _text(await self.redis.get(self.keys.for_shard(lock.shard).batch_claim(batch_child_id(parent_id, index))))  # type: ignore[attr-defined]
        return json.loads(text) if text else None

    async def record_child(self, parent_id: str, index: int, owner: str, lock: JobLock, outcome: dict[str, Any]) -> dict[str, Any]:
        """Records a child's outcome exactly once, under its job lock (§26.3)."""
        child_id = batch_child_id(parent_id, index)
        text = _json(outcome)
        if len(text) > MAX_STORED_CHILD_RESULT_CHARS and "result" in outcome:
            text = _json({**{k: v for k, v in outcome.items() if k != "result"}, "resultOmitted": True})
        failed = "0" if outcome.get("status") == "completed" else "1"
        # The sharded layout (§26.10), in two steps: (1) on the child's shard, under its lock, its one outcome is
        # claimed; (2) on the parent's shard the claimed outcome is counted with no lock token, idempotently.
        claim_keys = None if lock.shard is None else self.keys.for_shard(lock.shard)
        if claim_keys is not None:
            claim_code, claimed = await self.call(
                "batchClaim",
                {"lock": claim_keys.bull_job_lock_here(lock.queue, child_id), "claim": claim_keys.batch_claim(child_id)},
                {"lockToken": lock.token, "outcome": text, "ttlMs": str(BATCH_CLAIM_TTL_MS)},
            )
            if claim_code == RESULT.LOCK_LOST:
                return {"outcome": "lock_lost"}
            text = (_text(claimed[0]) if claimed else None) or text
            failed = "0" if json.loads(text).get("status") == "completed" else "1"
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
                "lockToken": lock.token if claim_keys is None else "",
                "index": str(index),
                "childId": child_id,
                "failed": failed,
                "outcome": text,
            },
        )
        if claim_keys is not None and code != RESULT.LOCK_LOST:
            # Counted (now or before): the claim has done its work.
            await self.redis.delete(claim_keys.batch_claim(child_id))  # type: ignore[attr-defined]
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

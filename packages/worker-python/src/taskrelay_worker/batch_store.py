"""A batch's records in Redis (PROTOCOL.md §26.2), as ``batch-store.ts``: its hash, items, outcomes and open set, read
and written with the manifest's scripts (``batchCreate``, ``batchPeek``, ``batchRelease``) by name."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from .fair_share import FAIR_SHARE_TTL_MS, MAX_FAIR_PRIORITY
from .keys import Keys
from .protocol import BATCH_FIELDS, RESULT
from .store import TERMINAL, JobLock, TaskStore

#: How long a batch's keys live before its parent ends (BATCH_TTL_MS).
BATCH_TTL_MS = 7 * 86_400_000


def batch_child_id(parent_id: str, index: int) -> str:
    return f"{parent_id}.{index}"


def parse_batch_child_id(job_id: str) -> tuple[str, int] | None:
    """(parent, index) of a batch child's job id, or None for any other id (``parseBatchChildId``)."""
    dot = job_id.rfind(".")
    if dot <= 0:
        return None
    tail = job_id[dot + 1 :]
    if not tail.isdigit() or str(int(tail)) != tail:
        return None
    return job_id[:dot], int(tail)


def child_shard(codes: list[str] | None, index: int) -> str | None:
    """The shard child ``index`` queues on in the sharded layout (``childShard``, §26.10): ``codes[index mod N]``, a
    function of its index alone, so every releaser, re-adder and stopper finds it there; None without codes (the
    single layout)."""
    return codes[index % len(codes)] if codes else None


def by_shard(codes: list[str] | None, indices: list[int]) -> dict[str | None, list[int]]:
    """The positions in ``indices`` grouped by their child's shard (first seen first): one script, ``addBulk`` or
    pipeline per shard, as the Node parent's (a call on a Cluster stays in one slot)."""
    groups: dict[str | None, list[int]] = {}
    for at, index in enumerate(indices):
        groups.setdefault(child_shard(codes, index), []).append(at)
    return groups


class BatchStore:
    """Reads and writes one batch's keys; ``BatchParent`` runs the flow over it."""

    def __init__(self, store: TaskStore, keys: Keys) -> None:
        self.store = store
        self.redis = store.redis
        self.keys = keys

    def _k(self, task_id: str) -> dict[str, str]:
        return {member: self.keys.batch(task_id, member) for member in ("hash", "items", "outcomes", "open", "running")}

    async def shape(self, task_id: str) -> dict[str, Any] | None:
        fields = ("childTool", "childPool", "parentPool", "concurrency", "failFast", "owner", "childCodes")
        read = await self.redis.hmget(self._k(task_id)["hash"], [BATCH_FIELDS[n] for n in fields])
        child_tool, child_pool, parent_pool, concurrency, fail_fast, owner, codes = read
        if not child_tool or not child_pool or not parent_pool:
            return None
        return {
            # The sharded layout (§26.10): the child tool's placed codes, whichever parent wrote them (Node or Python).
            "childCodes": codes.split(",") if codes else None,
            "childTool": child_tool,
            "childPool": child_pool,
            "parentPool": parent_pool,
            "concurrency": int(concurrency or 1),
            "failFast": fail_fast == "1",
            "owner": owner or "",
        }

    async def peek(self, task_id: str) -> dict[str, Any] | None:
        k = self._k(task_id)
        code, values = await self.store.call("batchPeek", {"batch": k["hash"], "open": k["open"]}, {})
        if code != RESULT.OK:
            return None
        size, completed, failed, released, open_, window, stopped, wake = ([int(v) for v in values] + [0] * 8)[:8]
        return {
            "size": size,
            "completed": completed,
            "failed": failed,
            "released": released,
            "open": open_,
            "window": window or 1,
            "stopped": stopped == 1,
            "wake": wake == 1,
        }

    async def outcomes(self, task_id: str, start: int, count: int) -> list[dict[str, Any] | None]:
        if count <= 0:
            return []
        values = await self.redis.hmget(self._k(task_id)["outcomes"], [str(start + i) for i in range(count)])
        return [None if v is None else json.loads(v) for v in values]

    async def _create(self, task_id: str, lock: JobLock, shape: dict[str, Any], items: list[str]) -> str:
        k = self._k(task_id)
        fields = {
            "childTool": shape["childTool"],
            "childPool": shape["childPool"],
            "parentPool": shape["parentPool"],
            "size": str(len(items)),
            "released": "0",
            "completed": "0",
            "failed": "0",
            "failFast": "1" if shape["failFast"] else "0",
            "concurrency": str(shape["concurrency"]),
            "window": str(shape["concurrency"]),
            "owner": shape["owner"],
            "createdAtMs": str(int(time.time() * 1000)),
        }
        if shape.get("childCodes"):
            fields["childCodes"] = ",".join(shape["childCodes"])
        code, _ = await self.store.call(
            "batchCreate",
            {
                "batch": k["hash"],
                "items": k["items"],
                "lock": self.keys.bull_job_lock(lock.queue, task_id),
                "task": self.keys.task(task_id),
            },
            {
                "lockToken": lock.token,
                "fields": json.dumps({BATCH_FIELDS[n]: v for n, v in fields.items()}),
                "items": "\n".join(items),
                "ttlMs": str(BATCH_TTL_MS),
            },
        )
        return {RESULT.OK: "created", RESULT.BATCH_EXISTS: "exists", RESULT.LOCK_LOST: "lock_lost"}.get(code, "gone")

    async def _release(
        self, task_id: str, shape: dict[str, Any], base: int, concurrency: int, cap: int
    ) -> tuple[int, int, list[int]]:
        """Releases the next children (``BatchStore.release``): the window, its first index and each child's priority.
        In the sharded layout the script on the parent's shard only opens them; each target shard then enters its
        children in its fair share, as a re-add does (§26.10)."""
        values = await self._release_script(task_id, shape, base, True, [], concurrency, cap, BATCH_TTL_MS)
        window, start, placeholders = (values + [1, 0])[0], (values + [1, 0])[1], values[2:]
        if not shape.get("childCodes"):
            return window, start, placeholders
        return window, start, await self._reenter(task_id, shape, base, [start + i for i in range(len(placeholders))])

    async def _reenter(self, task_id: str, shape: dict[str, Any], base: int, indices: list[int]) -> list[int]:
        """Re-adds open children (§26.3 step 2): each one's priority, 0 when its job exists. In the sharded layout one
        script per target shard, on that shard (its share, its jobs)."""
        if not indices:
            return []
        codes = shape.get("childCodes")
        if not codes:
            return (await self._release_script(task_id, shape, base, False, indices, 0, 0, 0))[2:]
        priorities = [0] * len(indices)

        async def on(code: str | None, at: list[int]) -> None:
            values = await self._release_script(task_id, shape, base, False, [indices[i] for i in at], 0, 0, 0, code)
            for n, i in enumerate(at):
                priorities[i] = values[n + 2] if n + 2 < len(values) else 0

        await asyncio.gather(*(on(code, at) for code, at in by_shard(codes, indices).items()))
        return priorities

    async def _release_script(
        self,
        task_id: str,
        shape: dict[str, Any],
        base: int,
        release: bool,
        indices: list[int],
        concurrency: int,
        cap: int,
        ttl_ms: int,
        code: str | None = None,
    ) -> list[int]:
        """``code``: a re-add on that child shard (§26.10), its batch keys named there only to keep the call in one
        slot (a re-add touches none of them); without it the script runs on the parent's shard, where in the sharded
        layout (``childCodes``) it opens the children and enters none."""
        on = self.keys.for_task(task_id) if code is None else self.keys.for_shard(code)
        here = code is not None
        _, values = await self.store.call(
            "batchRelease",
            {
                "batch": on.batch(task_id, "hash", here=here),
                "open": on.batch(task_id, "open", here=here),
                "share": on.fair_share(shape["childPool"], shape["owner"]),
                "principalOpen": on.principal_open_tasks(shape["owner"]),
            },
            {
                "parentId": task_id,
                "indices": ",".join(str(i) for i in indices),
                "release": "1" if release else "0",
                "concurrency": str(concurrency),
                "cap": str(cap),
                "nowMs": str(int(time.time() * 1000)),
                "openWorkTtlMs": str(ttl_ms),
                "shareTtlMs": str(FAIR_SHARE_TTL_MS),
                "maxPriority": str(MAX_FAIR_PRIORITY),
                "queueKey": on.bull_queue_key(shape["childPool"]),
                "priorityBase": str(base),
                "enter": "0" if code is None and shape.get("childCodes") else "1",
            },
        )
        return [int(v) for v in values]

    async def _open_indices(self, task_id: str) -> list[int]:
        return sorted(int(i) for i in await self.redis.smembers(self._k(task_id)["open"]))

    async def _expire(self, task_id: str, ttl_ms: int) -> None:
        k = self._k(task_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(k["items"])
        pipe.pexpire(k["hash"], ttl_ms)
        pipe.pexpire(k["outcomes"], ttl_ms)
        pipe.delete(k["open"])
        pipe.delete(k["running"])
        await pipe.execute()

    async def _ended_work(self, ids: list[str]) -> list[bool]:
        """``BatchStore.endedWork``: a task gone or terminal; a child recorded or whose parent ended."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            child = parse_batch_child_id(job_id)
            if child is not None:
                pipe.hget(self.keys.task(child[0]), "status")
                pipe.hexists(self._k(child[0])["outcomes"], str(child[1]))
            else:
                pipe.hget(self.keys.task(job_id), "status")
        replies = list(await pipe.execute())
        ended, r = [], 0
        for job_id in ids:
            status = replies[r]
            r += 1
            gone = not isinstance(status, str) or status in TERMINAL
            if parse_batch_child_id(job_id) is not None:
                ended.append(gone or bool(replies[r]))
                r += 1
            else:
                ended.append(gone)
        return ended

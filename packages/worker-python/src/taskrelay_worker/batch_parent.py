"""The parent's side of a batch (PROTOCOL.md §26, §29.4): ``ctx.fan_out`` stores the batch once, releases children a
window at a time as BullMQ jobs in the child tool's pool (with the parent's principal's fair-share priority, §25), and
answers ``wait`` (the run suspends) until every child is recorded or fail-fast trips. Every run of the parent is a
replay: it reads the batch from Redis and goes on from there, on whichever worker it runs, Node or Python.

It follows ``packages/worker/src/engine/batch-parent.ts`` step for step, with the same scripts (``batchCreate``,
``batchPeek``, ``batchRelease``) by name from the manifest, the same job ids, data and options, so a Node worker can
take over a Python parent's batch and the other way round."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from .batch_child_jobs import ChildJobs
from .batch_store import BatchStore
from .context_checks import FanOutArgs
from .errors import TaskCancelledError, TaskrelayError
from .fair_share import priority_base
from .keys import Keys
from .log import Logger
from .protocol import CANCEL, ERROR, FIELDS
from .store import TERMINAL, JobLock, TaskStore

#: Outcomes listed inline in the result; the rest are read with ``ctx.batch_outcomes`` (MAX_FANOUT_OUTCOMES).
MAX_FANOUT_OUTCOMES = 1_000
#: The safety net of a waiting parent: it runs again after this even if no child promotes it (BATCH_POLL_MS).
BATCH_POLL_MS = 30_000
#: The open-work cap of a batch whose job carries none (DEFAULT_BATCH_OPEN_CAP, §26.6).
DEFAULT_BATCH_OPEN_CAP = 1_000


def child_outcome(index: int, outcome: dict[str, Any] | None) -> dict[str, Any]:
    """One child's entry of the result (``childOutcome``): ``cancelled`` when it never finished."""
    if outcome is None:
        return {"index": index, "status": "cancelled"}
    entry: dict[str, Any] = {"index": index, "status": outcome.get("status")}
    if "result" in outcome:
        entry["result"] = outcome["result"]
    error = outcome.get("error")
    if isinstance(error, dict):
        entry["error"] = {"code": error.get("code"), "message": error.get("message")}
    if outcome.get("resultOmitted"):
        entry["resultOmitted"] = True
    return entry


def fan_out_result(counts: dict[str, Any], listed: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The result a finished (or fail-fast stopped) batch gives its parent (``fanOutResult``), Node's JSON keys."""
    outcomes = [child_outcome(index, outcome) for index, outcome in enumerate(listed)]
    size, completed, failed = counts["size"], counts["completed"], counts["failed"]
    return {
        "total": size,
        "completed": completed,
        "failed": failed,
        "cancelled": max(0, size - completed - failed),
        "outcomes": outcomes,
        "truncated": size > len(outcomes),
        "outcomesOmitted": max(0, size - len(outcomes)),
    }


#: The host ``ToolContext`` calls: ``fan_out(run, args) -> ("done", result) | ("wait", poll_ms)``, and ``outcomes``.
@dataclass(frozen=True)
class FanOutRun:
    task_id: str
    lock: JobLock
    principal: str
    #: The parent task's ttl (ms): the batch's keys live that long (and a minute) once it ends.
    ttl_ms: int
    log: Logger


class FanOutHost:
    """One parent run's view of the batch engine: its principal's open-work cap and its priority level (§26.6)."""

    def __init__(self, parent: "BatchParent", max_open: int | None, level: Any) -> None:
        self._parent = parent
        self._max_open = max_open
        self._base = priority_base(level)

    async def fan_out(self, run: FanOutRun, args: FanOutArgs) -> tuple[str, Any]:
        return await self._parent.fan_out(run, args, self._max_open, self._base)

    async def outcomes(self, task_id: str, start: int, count: int) -> list[dict[str, Any]]:
        listed = await self._parent.outcomes(task_id, start, count)
        return [child_outcome(start + i, outcome) for i, outcome in enumerate(listed)]


class BatchParent(BatchStore, ChildJobs):
    """The batch engine of a Python worker (BatchParent in batch-parent.ts), over the batch's records (batch_store.py)
    and its children's jobs (batch_child_jobs.py)."""

    def __init__(
        self,
        store: TaskStore,
        keys: Keys,
        own_queue_name: str,
        tools: dict[str, Any],
        queue_of: Callable[..., Any],
        placement: Any = None,
    ) -> None:
        super().__init__(store, keys)
        self.own_queue_name = own_queue_name
        self.tools = tools
        #: The bullmq ``Queue`` of a pool on a shard (the worker's ``_queue_of``, closed with it).
        self.queue_of = queue_of
        #: The placement registry in the sharded layout (placement.py): where the child tool's shards are (§26.10).
        self.placement = placement

    def for_run(self, max_open: Any, level: Any) -> FanOutHost:
        cap = max_open if isinstance(max_open, int) and not isinstance(max_open, bool) and max_open > 0 else None
        return FanOutHost(self, cap, level)

    # The flow (§26.3) ---------------------------------------------------------------------------------------------

    async def fan_out(self, run: FanOutRun, args: FanOutArgs, max_open: int | None, base: int) -> tuple[str, Any]:
        task_id, lock, log = run.task_id, run.lock, run.log
        shape = await self.shape(task_id)
        if shape is None:
            pool, tool = await self._child_tool(args.tool)
            created = await self._create(
                task_id,
                lock,
                {
                    "childTool": args.tool,
                    "childPool": pool,
                    "parentPool": lock.queue,
                    "concurrency": args.concurrency,
                    "failFast": args.fail_fast,
                    "owner": run.principal,
                    # The sharded layout (§26.10): the child tool's placed shards, kept in the batch so every releaser
                    # and stopper, Node or Python, puts child i on the same one.
                    "childCodes": await self._child_codes(pool, tool.get("shards")),
                },
                [json.dumps(item, ensure_ascii=False, separators=(",", ":")) for item in args.items],
            )
            if created == "lock_lost":
                raise TaskCancelledError(CANCEL.LOCK_LOST)
            if created == "gone":
                raise TaskCancelledError(CANCEL.CLIENT_CANCELLED)
            if created == "created":
                log.info("batch created", children=len(args.items), childTool=args.tool)
            shape = await self.shape(task_id)
            if shape is None:
                raise TaskCancelledError(CANCEL.CLIENT_CANCELLED)
        counts = await self.peek(task_id)
        if shape["childTool"] != args.tool or counts is None or counts["size"] != len(args.items):
            if counts is None:
                raise TaskCancelledError(CANCEL.CLIENT_CANCELLED)
            raise TaskrelayError(
                ERROR.INTERNAL,
                f"ctx.fan_out: this task's batch has other children ({shape['childTool']}); call fan_out once per task, "
                "with the same items on every run",
            )
        done = counts["completed"] + counts["failed"]
        ttl_ms = run.ttl_ms + 60_000
        if done >= counts["size"] or (shape["failFast"] and counts["failed"] > 0):
            if done < counts["size"]:
                log.info("batch failed fast; stopping the rest", failed=counts["failed"], done=done, size=counts["size"])
                await self.stop_children(task_id)
            final = await self.peek(task_id) or counts
            listed = await self.outcomes(task_id, 0, min(final["size"], MAX_FANOUT_OUTCOMES))
            await self._expire(task_id, ttl_ms)
            log.info("batch done", completed=final["completed"], failed=final["failed"], size=final["size"])
            return "done", fan_out_result(final, listed)
        await self._release_next(task_id, shape, counts["open"], max_open, base, log)
        return "wait", BATCH_POLL_MS

    async def _release_next(
        self, task_id: str, shape: dict[str, Any], open_: int, max_open: int | None, base: int, log: Logger
    ) -> int:
        """Releases the batch's next window (§26.3 step 2), after re-adding the open children that have no job."""
        if open_ > 0:
            indices = await self._open_indices(task_id)
            priorities = await self._reenter(task_id, shape, base, indices)
            added = await self._add_children(task_id, shape, indices, priorities, max_open)
            if added > 0:
                log.info("batch re-added open children that had no job", open=len(indices), added=added)
        cap = max_open if max_open is not None else DEFAULT_BATCH_OPEN_CAP
        # The children's open-work entries are on the parent's shard in either layout (§26.10), where the script counts.
        await self._prune_open_work(self.keys.for_task(task_id).principal_open_tasks(shape["owner"]), open_, cap)
        window, start, priorities = await self._release(task_id, shape, base, shape["concurrency"], cap)
        if priorities:
            await self._add_children(task_id, shape, [start + i for i in range(len(priorities))], priorities, max_open)
            log.debug("batch children released", **{"from": start, "count": len(priorities), "window": window})
        return len(priorities)

    async def release_from_child(self, task_id: str, max_open: int | None, level: int, log: Logger) -> int:
        """A child was recorded while its parent should run (§26.4's condition) and the child did not promote it: the
        parent is queued, its run is live, or its run is lost with its worker until a takeover. The child releases the
        next window itself, so the batch moves on whatever the parent's run does (§26.3 step 4, ``releaseFromChild``);
        a parent still delayed is promoted as well. Nothing for a batch that is stopped, done, failed fast or whose
        parent ended. Answers how many children it released."""
        shape, counts, status = await self.shape(task_id), await self.peek(task_id), await self.redis.hget(self.keys.task(task_id), FIELDS["status"])
        if shape is None or counts is None or counts["stopped"] or status is None or status in TERMINAL:
            return 0
        if counts["released"] >= counts["size"] or (shape["failFast"] and counts["failed"] > 0):
            return 0
        queue = self.queue_of(shape["parentPool"], task_id)
        state = await queue.getJobState(task_id)
        if state in ("completed", "failed", "unknown"):
            return 0
        if state == "delayed":
            try:
                await queue.backend.promote(task_id)
            except Exception:  # noqa: BLE001 - promoted meanwhile: its run goes on from Redis
                pass
        cap = max_open if isinstance(max_open, int) and not isinstance(max_open, bool) and max_open > 0 else None
        released = await self._release_next(task_id, shape, counts["open"], cap, priority_base(level), log)
        if released > 0:
            log.info("this child released the batch's next window", released=released, parent=state)
        return released

    async def _prune_open_work(self, key: str, own_open: int, cap: int) -> None:
        """Prunes the principal's open work of ended ids when its raw count says the cap might bind (§26.6)."""
        if await self.redis.zcard(key) - own_open < cap:
            return
        ids = await self.redis.zrange(key, 0, -1)
        ended = await self._ended_work(ids)
        gone = [i for i, e in zip(ids, ended) if e]
        if gone:
            await self.redis.zrem(key, *gone)

    async def _child_codes(self, pool: str, shards: Any) -> list[str] | None:
        """The child tool's placed shard codes in the sharded layout (placing them if no worker did yet), else None."""
        if self.keys.layout != "sharded":
            return None
        if self.placement is None:
            raise TaskrelayError(ERROR.INTERNAL, "ctx.fan_out: no shard placement here")
        return await self.placement.codes(pool, shards if isinstance(shards, int) and shards > 0 else 1)

    async def should_wake(self, task_id: str) -> bool:
        """After the parent's job is delayed: are the children done already (§26.3 step 3)? Then it promotes itself."""
        counts = await self.peek(task_id)
        return counts is not None and counts["wake"]

    # Where children go (§3.2) -------------------------------------------------------------------------------------

def redis_unavailable(error: BaseException) -> bool:
    """Redis could not be reached mid-fan-out: the run ends as one that lost its lock, not as the tool's failure."""
    from redis import exceptions as redis_errors

    return isinstance(error, (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError))


__all__ = [
    "BATCH_POLL_MS",
    "BatchParent",
    "FanOutHost",
    "FanOutRun",
    "MAX_FANOUT_OUTCOMES",
    "child_outcome",
    "fan_out_result",
    "redis_unavailable",
]

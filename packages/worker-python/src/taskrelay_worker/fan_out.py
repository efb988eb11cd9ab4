"""The parent's side of a batch (PROTOCOL.md §26, §29.4): ``ctx.fan_out`` stores the batch once, releases children a
window at a time as BullMQ jobs in the child tool's pool (with the parent's principal's fair-share priority, §25), and
answers ``wait`` (the run suspends) until every child is recorded or fail-fast trips. Every run of the parent is a
replay: it reads the batch from Redis and goes on from there, on whichever worker it runs, Node or Python.

It follows ``packages/worker/src/engine/batch-parent.ts`` step for step, with the same scripts (``batchCreate``,
``batchPeek``, ``batchRelease``) by name from the manifest, the same job ids, data and options, so a Node worker can
take over a Python parent's batch and the other way round."""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import TaskCancelledError, TaskrelayError
from .keys import Keys, tool_queue
from .log import Logger
from .protocol import BATCH_FIELDS, CANCEL, ERROR, FIELDS, RESULT
from .store import TERMINAL, JobLock, TaskStore

#: Outcomes listed inline in the result; the rest are read with ``ctx.batch_outcomes`` (MAX_FANOUT_OUTCOMES).
MAX_FANOUT_OUTCOMES = 1_000
#: The safety net of a waiting parent: it runs again after this even if no child promotes it (BATCH_POLL_MS).
BATCH_POLL_MS = 30_000
#: How long a batch's keys live before its parent ends (BATCH_TTL_MS).
BATCH_TTL_MS = 7 * 86_400_000
#: A fair-share entry of a child outlives its possible wait by this much (FAIR_SHARE_TTL_MS).
FAIR_SHARE_TTL_MS = 3_600_000 + 60_000
#: The open-work cap of a batch whose job carries none (DEFAULT_BATCH_OPEN_CAP, §26.6).
DEFAULT_BATCH_OPEN_CAP = 1_000
#: fair-share.ts: a priority level's band, the levels, the default level.
PRIORITY_BAND = 262_144
MAX_FAIR_PRIORITY = PRIORITY_BAND - 1
PRIORITY_LEVELS = 5
DEFAULT_PRIORITY = 3
#: The limits ``ctx.fan_out`` checks (FanOutItemsSchema, FanOutOptionsSchema).
MAX_ITEMS = 100_000
MAX_CONCURRENCY = 1_000
DEFAULT_CONCURRENCY = 64
MAX_PAGE = 10_000

_POOL_DIGEST = re.compile(r"\.[0-9a-f]{12}$")


def priority_base(level: Any) -> int:
    """What a priority level adds to a fair-share rank (``priorityBase``): 0 for level 1."""
    try:
        whole = int(level) if isinstance(level, (int, float)) and not isinstance(level, bool) else 0
    except (OverflowError, ValueError):
        whole = 0
    clamped = min(PRIORITY_LEVELS, max(1, whole or DEFAULT_PRIORITY))
    return (clamped - 1) * PRIORITY_BAND


def priority_level_of(bull_priority: Any) -> int:
    """The priority level of a BullMQ priority (``priorityLevelOf``): 0, BullMQ's "none", is the default level."""
    value = int(bull_priority) if isinstance(bull_priority, (int, float)) and not isinstance(bull_priority, bool) else 0
    return (value - 1) // PRIORITY_BAND + 1 if value > 0 else DEFAULT_PRIORITY


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


def catalog_queue_name(catalog: dict[str, Any]) -> str:
    """A catalog's ``TASKRELAY_QUEUE`` (``catalogQueueName``)."""
    name = catalog.get("queueName")
    return name if isinstance(name, str) else _POOL_DIGEST.sub("", str(catalog.get("queue", "")))


def job_options(job_id: str, priority: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A child job's BullMQ options (``jobOptions`` in bullmq-layout.ts)."""
    opts: dict[str, Any] = {
        "jobId": job_id,
        "priority": priority,
        "attempts": tool.get("attempts") or 1,
        "removeOnComplete": True,
        "removeOnFail": {"age": 3600, "count": 1_000},
    }
    backoff = tool.get("backoff")
    if isinstance(backoff, dict):
        opts["backoff"] = {"type": backoff.get("type"), "delay": backoff.get("delayMs"), "jitter": backoff.get("jitter", 0)}
    return opts


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


class BatchParent:
    """The batch engine of a Python worker (BatchParent in batch-parent.ts)."""

    def __init__(
        self,
        store: TaskStore,
        keys: Keys,
        own_queue_name: str,
        tools: dict[str, Any],
        queue_of: Callable[[str, str], Any],
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.keys = keys
        self.own_queue_name = own_queue_name
        self.tools = tools
        #: The bullmq ``Queue`` of a pool and the shard of a job id (the worker's ``_queue_of``, closed with it).
        self.queue_of = queue_of

    def for_run(self, max_open: Any, level: Any) -> FanOutHost:
        cap = max_open if isinstance(max_open, int) and not isinstance(max_open, bool) and max_open > 0 else None
        return FanOutHost(self, cap, level)

    # Keys and scripts ---------------------------------------------------------------------------------------------

    def _k(self, task_id: str) -> dict[str, str]:
        return {member: self.keys.batch(task_id, member) for member in ("hash", "items", "outcomes", "open", "running")}

    async def shape(self, task_id: str) -> dict[str, Any] | None:
        names = [BATCH_FIELDS[n] for n in ("childTool", "childPool", "parentPool", "concurrency", "failFast", "owner")]
        child_tool, child_pool, parent_pool, concurrency, fail_fast, owner = await self.redis.hmget(self._k(task_id)["hash"], names)
        if not child_tool or not child_pool or not parent_pool:
            return None
        return {
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

    async def _release_script(
        self, task_id: str, shape: dict[str, Any], base: int, release: bool, indices: list[int], concurrency: int, cap: int, ttl_ms: int
    ) -> list[int]:
        k = self._k(task_id)
        _, values = await self.store.call(
            "batchRelease",
            {
                "batch": k["hash"],
                "open": k["open"],
                "share": self.keys.fair_share(shape["childPool"], shape["owner"]),
                "principalOpen": self.keys.principal_open_tasks(shape["owner"]),
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
                "queueKey": self.keys.bull_queue_key(shape["childPool"]),
                "priorityBase": str(base),
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

    # The flow (§26.3) ---------------------------------------------------------------------------------------------

    async def fan_out(self, run: FanOutRun, args: FanOutArgs, max_open: int | None, base: int) -> tuple[str, Any]:
        task_id, lock, log = run.task_id, run.lock, run.log
        shape = await self.shape(task_id)
        if shape is None:
            # As the Node parent (batch-parent.ts): a batch's children queue on the parent's shard, where the child
            # tool's workers do not consume, so no batch in the sharded layout yet (PROTOCOL.md §1.1, docs/SCALING.md).
            if self.keys.layout == "sharded":
                raise TaskrelayError(
                    ERROR.INVALID_ARGUMENTS,
                    "ctx.fan_out: batches are not available in the sharded key layout yet (docs/SCALING.md)",
                )
            pool, _ = await self._child_tool(args.tool)
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
            priorities = await self._release_script(task_id, shape, base, False, indices, 0, 0, 0)
            added = await self._add_children(task_id, shape, indices, priorities[2:], max_open)
            if added > 0:
                log.info("batch re-added open children that had no job", open=len(indices), added=added)
        cap = max_open if max_open is not None else DEFAULT_BATCH_OPEN_CAP
        await self._prune_open_work(self.keys.principal_open_tasks(shape["owner"]), open_, cap)
        values = await self._release_script(task_id, shape, base, True, [], shape["concurrency"], cap, BATCH_TTL_MS)
        window, start, priorities = (values + [1, 0])[0], (values + [1, 0])[1], values[2:]
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

    async def _add_children(
        self, task_id: str, shape: dict[str, Any], indices: list[int], priorities: list[int], max_open: int | None
    ) -> int:
        """Adds the jobs of the children whose priority is above 0 (0: its job is in the pool already)."""
        adding = [(index, priority) for index, priority in zip(indices, priorities) if priority > 0]
        if not adding:
            return 0
        first, last = adding[0][0], adding[-1][0]
        texts = await self.redis.lrange(self._k(task_id)["items"], first, last)
        tool = await self._child_tool_in_pool(shape["childTool"], shape["childPool"])
        jobs = []
        for index, priority in adding:
            data: dict[str, Any] = {
                "taskId": task_id,
                "child": index,
                "tool": shape["childTool"],
                "arguments": json.loads(texts[index - first]) if index - first < len(texts) else {},
                "principal": shape["owner"],
            }
            if isinstance(tool.get("timeoutMs"), int):
                data["timeoutMs"] = tool["timeoutMs"]
            if max_open is not None:
                data["maxOpen"] = max_open
            jobs.append({"name": shape["childTool"], "data": data, "opts": job_options(batch_child_id(task_id, index), priority, tool)})
        await self.queue_of(shape["childPool"], task_id).addBulk(jobs)
        return len(jobs)

    async def stop_children(self, task_id: str) -> None:
        """Stops a batch (fail-fast, or its parent cancelled, §26.5, §26.7): no child starts any more, queued children
        are removed, running ones are aborted through the cancel channel (each child's job id)."""
        shape = await self.shape(task_id)
        if shape is None:
            return
        await self.redis.hset(self._k(task_id)["hash"], BATCH_FIELDS["stopped"], "1")
        indices = await self._open_indices(task_id)
        queue = self.queue_of(shape["childPool"], task_id)
        pipe = self.redis.pipeline(transaction=False)
        for index in indices:
            job_id = batch_child_id(task_id, index)
            try:
                await queue.remove(job_id)
            except Exception:  # noqa: BLE001 - running (locked) or gone: the cancel below reaches a running one
                pass
            pipe.zrem(self.keys.fair_share(shape["childPool"], shape["owner"]), job_id)
            pipe.zrem(self.keys.principal_open_tasks(shape["owner"]), job_id)
            pipe.publish(self.keys.cancel_channel, json.dumps({"taskId": job_id, "reason": CANCEL.CLIENT_CANCELLED}))
        await pipe.execute()

    async def should_wake(self, task_id: str) -> bool:
        """After the parent's job is delayed: are the children done already (§26.3 step 3)? Then it promotes itself."""
        counts = await self.peek(task_id)
        return counts is not None and counts["wake"]

    # Where children go (§3.2) -------------------------------------------------------------------------------------

    async def _child_tool(self, name: str) -> tuple[str, dict[str, Any]]:
        """The pool a new batch's children go to: the child tool's queue under this worker's ``TASKRELAY_QUEUE`` when
        it serves the tool, else under a live worker's that does (from the catalogs)."""
        local = self.tools.get(name)
        if local is not None:
            return tool_queue(self.own_queue_name, name), local.descriptor()
        serving = [c for c in await self._catalogs() if any(t.get("name") == name for t in c.get("tools", []))]
        if not serving:
            raise TaskrelayError(ERROR.TOOL_NOT_FOUND, f"ctx.fan_out: no live worker serves tool {name}")
        pick = random.choice(serving)
        tool = next(t for t in pick["tools"] if t.get("name") == name)
        return tool_queue(catalog_queue_name(pick), name), tool

    async def _child_tool_in_pool(self, name: str, pool: str) -> dict[str, Any]:
        """The child tool's attempts, backoff and timeout as its pool serves it."""
        local = self.tools.get(name)
        if local is not None and pool == tool_queue(self.own_queue_name, name):
            return local.descriptor()
        for catalog in await self._catalogs():
            if tool_queue(catalog_queue_name(catalog), name) == pool:
                found = next((t for t in catalog.get("tools", []) if t.get("name") == name), None)
                if found is not None:
                    return found
        return {"name": name}

    async def _catalogs(self) -> list[dict[str, Any]]:
        ids = await self.redis.zrangebyscore(self.keys.workers, int(time.time() * 1000), "+inf")
        if not ids:
            return []
        out = []
        for text in await self.redis.mget([self.keys.worker_catalog(i) for i in ids]):
            try:
                catalog = json.loads(text) if text else None
            except ValueError:
                catalog = None
            if isinstance(catalog, dict) and isinstance(catalog.get("tools"), list):
                out.append(catalog)
        return out


def redis_unavailable(error: BaseException) -> bool:
    """Redis could not be reached mid-fan-out: the run ends as one that lost its lock, not as the tool's failure."""
    from redis import exceptions as redis_errors

    return isinstance(error, (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError))


__all__ = [
    "BATCH_POLL_MS",
    "BatchParent",
    "FanOutArgs",
    "FanOutHost",
    "FanOutRun",
    "MAX_FANOUT_OUTCOMES",
    "batch_message",
    "check_fan_out_args",
    "fan_out_result",
    "priority_base",
]

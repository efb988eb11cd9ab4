"""Where a batch's children go and how their jobs are added and stopped (PROTOCOL.md §3.2, §26.3, §26.5): the child
tool's pool from this worker's tools or the live workers' catalogs, one BullMQ job per released child."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from typing import Any, Callable

from .batch_store import batch_child_id, by_shard, child_shard
from .errors import TaskrelayError
from .keys import Keys, tool_queue
from .protocol import BATCH_FIELDS, CANCEL, ERROR

_POOL_DIGEST = re.compile(r"\.[0-9a-f]{12}$")


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


class ChildJobs:
    """The child-job members of ``BatchParent`` (a mixin over its store, keys, tools and queues)."""

    keys: Keys
    own_queue_name: str
    tools: dict[str, Any]
    #: The bullmq ``Queue`` of a pool: on the shard a job id names, or on the shard of the keys given (a child's).
    queue_of: Callable[..., Any]

    def _child_keys(self, task_id: str, code: str | None) -> Keys:
        """The keys of child shard ``code`` (the sharded layout, §26.10), or the parent's (``code`` None: single)."""
        return self.keys.for_task(task_id) if code is None else self.keys.for_shard(code)

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
        # Single layout: one addBulk on the one prefix. Sharded: child i on its shard C(i) (§26.10), each added by
        # itself (idempotent by job id): bullmq's addBulk pipelines EVALSHA, which redis-py's Cluster pipeline refuses.
        groups = by_shard(shape.get("childCodes"), [index for index, _ in adding])
        adds = []
        for code, at in groups.items():
            queue = self.queue_of(shape["childPool"], task_id, self._child_keys(task_id, code))
            if code is None:
                adds.append(queue.addBulk([jobs[i] for i in at]))
            else:
                adds.extend(queue.add(jobs[i]["name"], jobs[i]["data"], jobs[i]["opts"]) for i in at)
        await asyncio.gather(*adds)
        return len(jobs)

    async def stop_children(self, task_id: str) -> None:
        """Stops a batch (fail-fast, or its parent cancelled, §26.5, §26.7): no child starts any more, queued children
        are removed, running ones are aborted through the cancel channel (each child's job id)."""
        shape = await self.shape(task_id)
        if shape is None:
            return
        await self.redis.hset(self._k(task_id)["hash"], BATCH_FIELDS["stopped"], "1")
        indices = await self._open_indices(task_id)
        pool, owner, codes = shape["childPool"], shape["owner"], shape.get("childCodes")
        # Each child's job, share entry and cancel channel are on its own shard C(i) in the sharded layout (§26.10),
        # named from its index, never from its id (which names the parent's shard); its open-work entry is the
        # parent's. One pipeline per shard, as the Node parent's.
        parent = self.keys.for_task(task_id)
        pipes: dict[str | None, Any] = {}

        def on(keys: Keys) -> Any:
            if keys.code not in pipes:
                pipes[keys.code] = self.redis.pipeline(transaction=False)
            return pipes[keys.code]

        for index in indices:
            job_id = batch_child_id(task_id, index)
            child = self._child_keys(task_id, child_shard(codes, index))
            try:
                await self.queue_of(pool, task_id, child).remove(job_id)
            except Exception:  # noqa: BLE001 - running (locked) or gone: the cancel below reaches a running one
                pass
            on(child).zrem(child.fair_share(pool, owner), job_id)
            on(parent).zrem(parent.principal_open_tasks(owner), job_id)
            cancel = json.dumps({"taskId": job_id, "reason": CANCEL.CLIENT_CANCELLED})
            # The child's own shard's channel in the sharded layout (PROTOCOL.md §1.2), where its tool's workers listen.
            if self.keys.layout == "sharded":
                on(child).spublish(child.cancel_channel, cancel)
            else:
                on(parent).publish(self.keys.cancel_channel, cancel)
        await asyncio.gather(*(pipe.execute() for pipe in pipes.values()))

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

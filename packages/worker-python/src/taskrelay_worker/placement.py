"""Where each tool shard lives in the sharded key layout (PROTOCOL.md §1.1), as ``packages/shared/src/placement.ts``.

The registry ``P:{home}:placement`` maps ``<queue>~<tool>#<i>`` to a 4-hex shard code, written once with HSETNX and
never changed, so what was read is cached for good. A worker that finds a shard not placed yet places it by Node's
rule, step for step: the short lease ``P:{home}:placement:lease`` (SET NX PX 2 s, retried every 25 ms), the registry
read again under it, a random unused code in the slots of the master holding the fewest placed shards (ties: the
first master in slot order; on one server any unused code), HSETNX, and the home retention policy copied to the new
shard. A process that loses the HSETNX race uses the winner's code.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from .keys import Keys, is_shard_code, placement_field

LEASE_MS = 2_000
LEASE_RETRY_S = 0.025
MAX_DRAWS = 10_000

#: Master id -> its slot ranges, masters in order of their first slot (``clusterMasters`` in placement.ts).
MasterSlots = dict[str, list[tuple[int, int]]]


def slot_of_code(code: str) -> int:
    """The slot of a shard code's keys: Redis hashes only what is between the braces (CRC16, as ioredis)."""
    return key_slot(code.encode())


def master_of_slot(masters: MasterSlots, slot: int) -> str | None:
    for master, ranges in masters.items():
        if any(low <= slot <= high for low, high in ranges):
            return master
    return None


def choose_code(placed: list[str], masters: MasterSlots | None, draw: Any = None) -> str:
    """A new code, as ``chooseCode`` in placement.ts: unused, in the slots of the master holding the fewest codes."""
    draw = draw or (lambda: f"{secrets.randbelow(0x10000):04x}")
    used = set(placed)
    target: str | None = None
    if masters:
        counts = {master: 0 for master in masters}
        for code in placed:
            master = master_of_slot(masters, slot_of_code(code))
            if master is not None:
                counts[master] += 1
        target = min(counts, key=lambda m: counts[m])  # the first of the fewest, in the masters' order
    for _ in range(MAX_DRAWS):
        code = draw()
        if code in used:
            continue
        if target is None or masters is None or master_of_slot(masters, slot_of_code(code)) == target:
            return code
    raise RuntimeError("no shard code found for the chosen master")


async def cluster_masters(redis: Any) -> MasterSlots | None:
    """The masters' slot ranges (``CLUSTER SLOTS``), or None for one server."""
    from redis.asyncio.cluster import RedisCluster

    if not isinstance(redis, RedisCluster):
        return None
    reply = await redis.cluster_slots()
    masters: MasterSlots = {}
    for (low, high), nodes in reply.items():
        primary = nodes.get("primary") if isinstance(nodes, dict) else None
        master = f"{primary[0]}:{primary[1]}" if primary else "?"
        masters.setdefault(master, []).append((int(low), int(high)))
    for ranges in masters.values():
        ranges.sort()
    return dict(sorted(masters.items(), key=lambda item: item[1][0][0]))


class ShardPlacement:
    """The placement registry as this process sees it; only used in the sharded layout."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._known: dict[str, str] = {}

    async def codes(self, queue: str, shards: int = 1) -> list[str]:
        """The codes of a tool queue's ``shards`` shards, placing those not placed yet."""
        fields = [placement_field(queue, i) for i in range(shards)]
        if any(f not in self._known for f in fields):
            await self._place(fields)
        return [self._known[f] for f in fields]

    async def _place(self, fields: list[str]) -> None:
        read = await self._redis.hmget(self._keys.placement, fields)
        for field, code in zip(fields, read):
            if code:
                self._known[field] = code
        if all(f in self._known for f in fields):
            return
        token = secrets.token_hex(8)
        while not await self._redis.set(self._keys.placement_lease, token, px=LEASE_MS, nx=True):
            await asyncio.sleep(LEASE_RETRY_S)
        try:
            masters = await cluster_masters(self._redis)
            for field in fields:
                if field in self._known:
                    continue
                registry = await self._redis.hgetall(self._keys.placement)
                existing = registry.get(field)
                code = existing or choose_code([c for c in registry.values() if is_shard_code(c)], masters)
                if existing is None and await self._redis.hsetnx(self._keys.placement, field, code):
                    await self._seed(code)
                self._known[field] = (await self._redis.hget(self._keys.placement, field)) or code
        finally:
            # Released only if still ours (a lease that expired may be another process's now).
            if await self._redis.get(self._keys.placement_lease) == token:
                await self._redis.delete(self._keys.placement_lease)

    async def _seed(self, code: str) -> None:
        """A new shard starts with the deployment's retention policy (§30.1), copied from home."""
        policy = await self._redis.hgetall(self._keys.retention)
        if policy:
            await self._redis.hset(self._keys.for_shard(code).retention, mapping=policy)


@dataclass(frozen=True)
class ToolShard:
    """One BullMQ queue a worker consumes: a tool queue, or one shard of it, with the keys it lives under."""

    tool: str
    queue: str
    keys: Keys
    #: How many shards the tool queue has (its BullMQ limits are split over them, ⌈limit / N⌉ each).
    shards: int

    def split(self, limit: int) -> int:
        return math.ceil(limit / self.shards)


async def tool_shards(placement: ShardPlacement | None, keys: Keys, queues: dict[str, tuple[str, int]]) -> list[ToolShard]:
    """The queues a worker consumes, tool by tool (``toolShards`` in task-worker.ts): one per tool queue in the single
    layout; one per shard of each in the sharded layout, under the shard's BullMQ prefix."""
    out: list[ToolShard] = []
    for tool, (queue, shards) in queues.items():
        if placement is None:
            out.append(ToolShard(tool, queue, keys, 1))
            continue
        codes = await placement.codes(queue, shards)
        out.extend(ToolShard(tool, queue, keys.for_shard(code), len(codes)) for code in codes)
    return out

"""The limits a worker admits runs by itself (PROTOCOL.md §3.5), as the Node worker's ``engine/tool-limits.ts``: a
concurrency limit per key of the arguments (a semaphore of leases) and a rate limit per key or shared by name (an
exact log of starts, and a hold a back-off sets), each step one of the task store's Lua scripts. A refused run ends
holding no worker slot and waits in BullMQ's delayed set; the run that frees a slot promotes the next. A plain rate
limit is counted here too, exactly (BullMQ's fixed windows let up to twice ``max`` start within one ``per_ms``,
§3.3): BullMQ's limiter only paces its takes, and its refused run waits at the front of its queue."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from .keys import Keys, queue_of_bull_name
from .log import Logger
from .protocol import RESULT
from .stop import stop_if_cancelled


def limit_key_digest(value: str) -> str:
    """A limit's key value, hashed as the Node side does: 22 characters of base64url SHA-256."""
    return base64.urlsafe_b64encode(hashlib.sha256(value.encode()).digest()).decode().rstrip("=")[:22]


def key_function(names: list[str] | None) -> Callable[[dict[str, Any]], str]:
    """Argument names give the JSON of their values, as ``JSON.stringify`` writes it (absent ones ``null``)."""
    if not names:
        return lambda _args: ""
    return lambda args: json.dumps([args.get(n) for n in names], separators=(",", ":"), ensure_ascii=False)


def principal_scoped_key(principal: str, value: str) -> str:
    """The key value of a limit counted per principal (§3.5), as the Node side's ``principalScopedKey``: the principal
    and the value, NUL between."""
    return f"{principal}\u0000{value}"


def scoped_key(limit: "SlotLimit | RateLimit", args: dict[str, Any], principal: str) -> str:
    """A limit's key value for ``args``: per principal unless the tool shares it across principals."""
    value = key_function(limit.key)(args)
    return value if limit.across_principals else principal_scoped_key(principal, value)


#: How many times a release skips waiters that cannot be woken before it leaves the rest to their delays.
WAKE_ROUNDS = 3


@dataclass(frozen=True)
class SlotLimit:
    limit: int
    key: list[str]
    #: One limit per key value for every principal (else per principal and key value).
    across_principals: bool = False


@dataclass(frozen=True)
class RateLimit:
    max: int
    per_ms: int
    scope: str
    key: list[str] | None
    #: One budget per key value for every principal; always so for a named limit without a key.
    across_principals: bool = False
    #: The tool's plain ``rate_limit`` (no key, no name): BullMQ's limiter of its queue paces the takes, and a refused
    #: run holds that limiter and goes back to the front of the queue (§3.3).
    paced: bool = False


@dataclass
class LimitWait:
    limit: str
    wait_ms: int
    message: str
    #: A plain rate limit's wait (§3.3): its queue's BullMQ limiter is held, and the job goes back to the front.
    paced: bool = False


class ToolLimits:
    def __init__(self, store: Any, keys: Keys, lease_ms: int, log: Logger) -> None:
        self.store = store
        self.keys = keys
        self.lease_ms = lease_ms
        self.log = log

    async def admit(
        self, tool: Any, args: dict[str, Any], job: Any, entry: Any, promote: Callable, hold_takes: Callable
    ) -> LimitWait | None:
        """None when the run may start (its slot, if any, held until ``entry.release``); else why and how long it
        waits. ``hold_takes(ms)`` holds the takes of the job's queue (a paced limit's full window, §3.3)."""
        job_id = str(job.id)
        principal = str(getattr(entry, "principal", "") or "")
        rate: RateLimit | None = tool.admitted_rate
        if rate is not None:
            starts, hold = self.keys.tool_limit("rate", rate.scope, limit_key_digest(scoped_key(rate, args, principal)))
            code, values = await self.store.call(
                "rateTake",
                {"starts": starts, "hold": hold},
                {"start": f"{job_id}:{secrets.token_hex(8)}", "max": rate.max, "perMs": rate.per_ms},
            )
            if code != RESULT.OK:
                scope = rate.scope[5:] if rate.scope.startswith("name:") else tool.name
                per = f" per {', '.join(rate.key)}" if rate.key else ""
                return LimitWait(
                    "rate",
                    int(values[0]),
                    f"Waiting for rate limit {scope}: at most {rate.max} starts per {rate.per_ms} ms{per}",
                    rate.paced,
                )
            room_in_ms = int(values[0]) if values else 0
            if rate.paced and room_in_ms > 0:
                # The window is full now: no worker of the queue takes before it has room (§3.3, step 2). Not held
                # (Redis briefly away): a take too early is refused by the log, and holds it then.
                try:
                    await hold_takes(room_in_ms)
                except Exception as error:  # noqa: BLE001 - the start is recorded; the run goes on
                    self.log.debug("queue's rate limiter not held", err=error)
        slot: SlotLimit | None = tool.admitted_slot
        if slot is None:
            return None
        digest = limit_key_digest(scoped_key(slot, args, principal))
        slots, waiting = self.keys.tool_limit("slots", tool.name, digest)
        waiting_by = self.keys.slot_waiters_by(tool.name, digest)
        waiter = f"{queue_of_bull_name(job.queue.name)} {job_id}"
        keys = {"slots": slots, "waiting": waiting, "waitingBy": waiting_by}
        # A limit shared across principals keeps a line fair between them (§3.5).
        take = {
            "holder": job_id,
            "limit": slot.limit,
            "leaseMs": self.lease_ms,
            "waiter": waiter,
            "mode": "take",
            "principal": principal if slot.across_principals else "",
        }
        code, values = await self.store.call("slotTake", keys, take)
        if code != RESULT.OK:
            return LimitWait(
                "slot",
                min(int(values[0]), self.lease_ms),
                f"Waiting for a slot: tool {tool.name} runs at most {slot.limit} at once per {', '.join(slot.key)}",
            )

        async def renew() -> None:
            while True:
                stop_if_cancelled()
                await asyncio.sleep(max(0.05, self.lease_ms / 3000))
                try:
                    await self.store.call("slotTake", keys, {**take, "mode": "renew"})
                except Exception as error:  # noqa: BLE001 - the lease ends by itself; the next renewal tries again
                    self.log.debug("slot lease not renewed", err=error)

        renewal = asyncio.ensure_future(renew())

        async def release() -> None:
            renewal.cancel()
            _, answered = await self.store.call("slotRelease", keys, {"holder": job_id, "limit": slot.limit, "waiter": waiter})
            # A waiter whose job is gone (cancelled or ended while it waited) leaves the line, and the next is woken in
            # its place, for a few rounds; one whose job is there but not delayed (its refused run has not made its
            # delayed move yet, or it was woken already) stays in line: its look after the move, or its take, uses the
            # room (as the Node worker does, §3.5 step 4).
            tried: set[str] = set()
            next_waiters = [str(w) for w in answered]
            for _ in range(WAKE_ROUNDS):
                fresh = [w for w in next_waiters if w not in tried]
                if not fresh:
                    return
                tried.update(fresh)
                gone = []
                for w in fresh:
                    pool, _, waiting_id = w.partition(" ")
                    if not waiting_id or await promote(pool, waiting_id) == "gone":
                        gone.append(w)
                if not gone:
                    return
                await self.store.redis.zrem(waiting, *gone)
                await self.store.redis.hdel(waiting_by, *gone)
                _, answered = await self.store.call("slotRelease", keys, {"holder": "", "limit": slot.limit, "waiter": ""})
                next_waiters = [str(w) for w in answered]

        entry.release = release
        return None

    async def room_now(self, tool: Any, args: dict[str, Any], job: Any, principal: str) -> bool:
        """After a slot waiter's delayed move: is there room already (its releaser's promotion found it active)? Without
        room the waiter is put back in line if that releaser dropped it, so the next release wakes it (§3.5 step 3)."""
        slot: SlotLimit | None = tool.admitted_slot
        if slot is None:
            return False
        waiter = f"{queue_of_bull_name(job.queue.name)} {job.id}"
        digest = limit_key_digest(scoped_key(slot, args, principal))
        slots, waiting = self.keys.tool_limit("slots", tool.name, digest)
        code, _ = await self.store.call(
            "slotTake",
            {"slots": slots, "waiting": waiting, "waitingBy": self.keys.slot_waiters_by(tool.name, digest)},
            {
                "holder": str(job.id),
                "limit": slot.limit,
                "leaseMs": self.lease_ms,
                "waiter": waiter,
                "mode": "peek",
                "principal": principal if slot.across_principals else "",
            },
        )
        return code == RESULT.OK

    async def hold(self, tool: Any, args: dict[str, Any], principal: str, ms: int) -> None:
        """A back-off (§3.4) of a tool with its own rate limit holds it for every tool that shares it."""
        rate: RateLimit | None = tool.admitted_rate
        if rate is None:
            return
        _, hold = self.keys.tool_limit("rate", rate.scope, limit_key_digest(scoped_key(rate, args, principal)))
        await self.store.call("rateHold", {"hold": hold}, {"ms": max(1, int(ms))})

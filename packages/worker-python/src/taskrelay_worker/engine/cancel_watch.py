"""Cancels reaching running tools (PROTOCOL.md §7, §10.4), as the Node worker's ``engine/cancel-watch.ts``: the cancel
channel, a periodic sweep of the running tasks (a cancel published while the subscriber was away, a task ended
elsewhere, a job lock that is another's), and bullmq's failed lock renewals."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from redis.asyncio import Redis

from ..protocol import CANCEL, message_problem
from ..stop import stop_if_cancelled
from ..store import TERMINAL
from .running_jobs import RunEntry


class CancelWatch:
    """The cancel side of ``TaskrelayWorker`` (a part of it)."""

    def _on_lock_renewal_failed(self, job_ids: Any, *_: Any) -> None:
        # bullmq names job ids, not tokens: the failed renewal may be an earlier run's of a job this process runs
        # again. Only a lock that is no longer this run's aborts it.
        for job_id in job_ids or []:
            entry = self.running.get(str(job_id))
            if entry is not None:
                asyncio.ensure_future(self._check_lock(str(job_id), entry))

    async def _check_lock(self, job_id: str, entry: RunEntry) -> None:
        assert self._redis is not None
        try:
            lock_key = (
                self.keys.bull_job_lock(entry.queue, job_id)
                if entry.shard is None
                else self.keys.for_shard(entry.shard).bull_job_lock_here(entry.queue, job_id)
            )
            holder = await self._redis.get(lock_key)
        except Exception:  # noqa: BLE001 - Redis away: the sweep and the next renewal decide
            return
        if holder != entry.token and self.running.get(job_id) is entry:
            self._abort(job_id, CANCEL.LOCK_LOST)

    def _cancel_channels(self) -> list[str]:
        """The channels cancels come on: the home cancel channel in the single layout; in the sharded layout the cancel
        channel of each shard of the tools this worker consumes (§1.2, §7), where the gateway SPUBLISHes them."""
        if self.keys.layout != "sharded":
            return [self.keys.cancel_channel]
        return sorted({shard.keys.cancel_channel for shard in self._shards})

    async def _cancel_listener(self) -> None:
        channels = self._cancel_channels()
        if not channels:
            return  # no tool shard consumed: no cancel can be for this worker; the sweep still runs
        if self.keys.layout != "sharded":
            return await self._listen_for_cancels(lambda: self._subscriber, channels, sharded=False)
        if not self.config.redis.cluster_nodes:
            return await self._listen_for_cancels(lambda: self._subscriber, channels, sharded=True)
        # On a cluster a shard channel lives on the node that owns its slot: one subscriber per channel, its node looked
        # up again on every (re)subscribe, so a slot that moved is followed.
        await asyncio.gather(*(self._listen_for_cancels(self._channel_node_client(c), [c], sharded=True) for c in channels))

    def _channel_node_client(self, channel: str) -> Callable[[], Redis]:
        def connect() -> Redis:
            node = self._redis.get_node_from_key(channel)  # type: ignore[union-attr]
            return Redis(host=node.host, port=node.port, decode_responses=True, socket_connect_timeout=5)

        return connect

    async def _listen_for_cancels(self, connect: Callable[[], Redis | None], channels: list[str], *, sharded: bool) -> None:
        """SUBSCRIBE (single layout) or SSUBSCRIBE (sharded layout) to ``channels``; each cancel aborts its run and the
        running batch children of a cancelled parent."""
        while True:
            client = connect()
            assert client is not None
            own = client is not self._subscriber
            pubsub = client.pubsub()
            try:
                if sharded:
                    for channel in channels:  # one at a time: a single SSUBSCRIBE may name one slot only
                        await pubsub.ssubscribe(channel)
                else:
                    await pubsub.subscribe(*channels)
                # A message missed while the subscriber was away is found by re-reading the running tasks.
                await self._sweep_once()
                while True:
                    stop_if_cancelled()
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None or message.get("type") not in ("message", "smessage"):
                        continue
                    try:
                        request = json.loads(message["data"])
                    except (ValueError, TypeError):
                        continue
                    # The manifest's `cancelRequest` shape (messages.ts `CancelRequestSchema`).
                    if message_problem("cancelRequest", request) is not None:
                        continue
                    task_id, reason = request["taskId"], request["reason"]
                    if task_id in self.running:
                        self._abort(task_id, reason)
                    # A cancelled parent's running children stop with it (§26.7), as the Node worker's do.
                    for child_id, entry in list(self.running.items()):
                        if entry.parent_id == task_id:
                            self._abort(child_id, reason)
            except asyncio.CancelledError:
                await pubsub.aclose()
                if own:
                    await client.aclose()
                raise
            except Exception as error:  # noqa: BLE001 - Redis gone: subscribe again
                self.log.debug("cancel subscriber lost; subscribing again", err=error)
                try:
                    await pubsub.aclose()
                    if own:
                        await client.aclose()
                except Exception:  # noqa: BLE001
                    pass
                await asyncio.sleep(0.5)

    async def _cancel_sweep(self) -> None:
        while True:
            stop_if_cancelled()
            await asyncio.sleep(self.config.cancel_sweep_ms / 1000)
            try:
                await self._sweep_once()
            except Exception as error:  # noqa: BLE001
                self.log.debug("cancel sweep failed", err=error)

    async def _sweep_once(self) -> None:
        """Aborts runs whose task ended elsewhere (§7.5) or whose job lock is another's (§10.4)."""
        assert self._redis is not None
        for task_id, entry in list(self.running.items()):
            if entry.signal.aborted or entry.settling:
                continue
            # A batch child has no task of its own: its parent's end ends it (§26.7).
            status, reason = await self._redis.hmget(self.keys.task(entry.parent_id or task_id), "status", "cancelReason")
            lock = await self._redis.get(self.keys.bull_job_lock(entry.queue, task_id))
            if entry.settling or self.running.get(task_id) is not entry:
                continue  # it began writing its own end (or ended) during the reads
            if entry.parent_id is not None:
                if status is None or status in TERMINAL:
                    self._abort(task_id, CANCEL.CLIENT_CANCELLED)
            elif status in TERMINAL:
                self._abort(task_id, reason or (CANCEL.TIMEOUT if status == "failed" else CANCEL.LOCK_LOST))
            elif status is not None and lock is not None and lock != entry.token:
                self._abort(task_id, CANCEL.LOCK_LOST)

"""The worker's catalog and heartbeat (PROTOCOL.md §3.1), as the Node worker's ``engine/catalog-heartbeat.ts``: what it
serves, written with a TTL of three heartbeats and renewed at each."""

from __future__ import annotations

import asyncio
import json

from ..stop import stop_if_cancelled
from .end_write import now_ms

#: A worker whose heartbeat is older than this leaves the workers' index.
PRUNE_DEAD_WORKERS_AFTER_MS = 3_600_000


class CatalogHeartbeat:
    """The catalog side of ``TaskrelayWorker`` (a part of it)."""

    async def _publish_catalog(self) -> None:
        assert self._redis is not None
        now = now_ms()
        ttl = 3 * self.config.heartbeat_ms
        descriptors = [t.descriptor() for t in self.tools.values()]
        catalog = {
            "workerId": self.worker_id,
            "queue": self.pool,
            "queueName": self.config.queue,
            "tools": descriptors,
            "heartbeatAt": now,
        }
        pool = {"pool": self.pool, "queueName": self.config.queue, "tools": descriptors, "lastSeenAt": now}
        # One slot on a Cluster (the prefix's hash tag), but redis-py's cluster pipeline takes no MULTI.
        async with self._redis.pipeline(transaction=not self.config.redis.cluster_nodes) as tx:
            tx.set(self.keys.worker_catalog(self.worker_id), json.dumps(catalog), px=ttl)
            tx.zadd(self.keys.workers, {self.worker_id: now + ttl})
            tx.hset(self.keys.pools, self.pool, json.dumps(pool))
            tx.zremrangebyscore(self.keys.workers, "-inf", now - PRUNE_DEAD_WORKERS_AFTER_MS)
            await tx.execute()

    async def _heartbeat(self) -> None:
        while True:
            stop_if_cancelled()
            await asyncio.sleep(self.config.heartbeat_ms / 1000)
            try:
                await self._publish_catalog()
            except Exception as error:  # noqa: BLE001
                self.log.warn("heartbeat failed", err=error)

    async def _leave_catalog(self) -> None:
        """Removes this worker's catalog, as it stops."""
        try:
            assert self._redis is not None
            async with self._redis.pipeline(transaction=not self.config.redis.cluster_nodes) as tx:
                tx.delete(self.keys.worker_catalog(self.worker_id))
                tx.zrem(self.keys.workers, self.worker_id)
                await tx.execute()
        except Exception as error:  # noqa: BLE001
            self.log.warn("could not remove the catalog", err=error)

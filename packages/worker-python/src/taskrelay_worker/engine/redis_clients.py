"""The worker's Redis clients: one server by URL, a Cluster by its seed nodes, or the master the Sentinels name."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from redis.asyncio import Redis

from ..config import RedisTarget
from .bullmq_adapter import bull_connection


def make_client(target: RedisTarget, *, blocking: bool = False) -> Any:
    """A Redis client for ``target``: one server by URL, a Cluster by its seed nodes, or the master the Sentinels name.
    ``blocking``: no read timeout (BullMQ's blocking wait, see ``bull_connection``)."""
    timeout = None if blocking else 5
    if target.cluster_nodes:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.cluster_nodes],
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=5,
        )
    if target.sentinels:
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(list(target.sentinels), socket_timeout=5, socket_connect_timeout=5)
        return sentinel.master_for(
            target.sentinel_name or "", decode_responses=True, socket_timeout=timeout, socket_connect_timeout=5
        )
    return Redis.from_url(str(target.url), decode_responses=True, socket_timeout=timeout, socket_connect_timeout=5)


def bull_options(target: RedisTarget) -> Any:
    """bullmq's ``connection`` for ``target``: options for one server by URL (bullmq makes its own connections), or a
    client of its own for a Cluster or the Sentinels' master (bullmq takes those as they are)."""
    if target.url is not None:
        return bull_connection(target.url)
    return make_client(target, blocking=True)


def redacted(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url

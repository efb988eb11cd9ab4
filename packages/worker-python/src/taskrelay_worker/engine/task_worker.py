"""The worker (PROTOCOL.md §5, §7, §10, §21, §29), as the Node worker's ``engine/task-worker.ts``: one BullMQ ``Worker``
per tool queue under one process-wide slot limit, started and drained here; each part of its work is a module of this
package named after its Node sibling (``job_run``, ``child_run``, ``run_envelope``, ``cancel_watch``,
``catalog_heartbeat``, ``end_write``, ``first_run_start``, ``tool_limits``, ``tool_versions``, ``running_jobs``), and
every use of bullmq's internals is in ``bullmq_adapter``. §29 lists where it does not reach the Node worker yet."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time

import bullmq
from redis.asyncio import Redis

from ..config import Config
from ..batch_parent import BatchParent
from ..keys import Keys, tool_pool, tool_queue
from ..limits import ToolLimits
from ..log import Logger
from ..metrics import WorkerMetrics
from ..output import OutputLimits
from ..placement import ShardPlacement, ToolShard, tool_shards
from ..protocol import CANCEL, GENERATION
from ..store import TaskStore
from ..tools import ToolDefinition
from ..tracing import traced
from ..waitpoints import WaitpointOpener
from .batch_queues import BatchQueues
from .bullmq_adapter import BULLMQ_MAX_STALLED, GatedWorker, bullmq_mismatch
from .cancel_watch import CancelWatch
from .catalog_heartbeat import CatalogHeartbeat
from .child_run import ChildRun
from .end_write import EndWrites, bull_lock_ms
from .first_run_start import FirstRunStart
from .job_end import JobEnd
from .job_run import JobRun
from .redis_clients import bull_options, make_client, redacted
from .run_envelope import RunEnvelope
from .running_jobs import RunEntry, RunningJobs
from .tool_limits import RunLimits
from .tool_versions import ToolVersions


class StartError(Exception):
    """The worker cannot start (Redis unreachable, another scripts generation): one line, exit code 1."""


class TaskrelayWorker(
    RunEnvelope,
    JobRun,
    JobEnd,
    FirstRunStart,
    ChildRun,
    EndWrites,
    RunLimits,
    ToolVersions,
    BatchQueues,
    CancelWatch,
    CatalogHeartbeat,
    RunningJobs,
):
    def __init__(self, config: Config, tools: list[ToolDefinition], log: Logger) -> None:
        self.config = config
        self.tools = {t.name: t for t in tools}
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.log = log.child(workerId=self.worker_id)
        self.keys = Keys(config.prefix, config.key_layout)
        self.pool = tool_pool(config.queue, [(t.name, t.version) for t in tools])
        self.queues = {name: tool_queue(config.queue, name) for name in self.tools}
        self.running: dict[str, RunEntry] = {}
        self.metrics = WorkerMetrics()  # Node's names, types and labels (metrics.py); served by __main__
        self.metrics.watch_slots(lambda: len(self.running), config.concurrency)
        self.closing = False
        self._bull: list[GatedWorker] = []
        self._bull_runs: list[asyncio.Task] = []
        self._background: list[asyncio.Task] = []
        self._redis: Redis | None = None
        self._output_limits = OutputLimits()
        self._subscriber: Redis | None = None
        self.store: TaskStore | None = None
        self.limits: ToolLimits | None = None
        self.waitpoints: WaitpointOpener | None = None
        #: Queues of batch parents this worker's children woke (§26.4), one per queue, closed with the worker.
        self._parent_queues: dict[tuple[str, str], bullmq.Queue] = {}
        #: The BullMQ queues consumed: one per tool, or one per shard of each in the sharded layout (§1.1).
        self._shards: list[ToolShard] = []
        #: The batch engine behind ``ctx.fan_out`` (§26, batch_parent.py).
        self.batches: BatchParent | None = None

    # Start ---------------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        mismatch = bullmq_mismatch()
        if mismatch is not None:
            raise StartError(mismatch)
        await self._connect()
        await self._apply_tool_limits()
        self._open_tool_queues()
        self._background.append(asyncio.ensure_future(self._cancel_listener()))
        self._background.append(asyncio.ensure_future(self._cancel_sweep()))
        await self._publish_catalog()
        self._background.append(asyncio.ensure_future(self._heartbeat()))
        self._bull_runs = [asyncio.ensure_future(worker.run()) for worker in self._bull]
        self.log.info(
            "worker ready",
            queue=self.config.queue,
            pool=self.pool,
            tools=list(self.tools),
            concurrency=self.config.concurrency,
            generation=GENERATION,
            language="python",
        )

    async def _connect(self) -> None:
        """Redis, the store and what reads it; refuses a deployment whose gateways run other scripts."""
        cfg = self.config
        self._redis = make_client(cfg.redis)
        # Pub/sub of the single layout is classic SUBSCRIBE (PROTOCOL.md §1.1): on a Cluster any node forwards every
        # PUBLISH, so the subscriber talks to one seed node. The sharded layout's cancels are SSUBSCRIBEd per tool
        # shard, on a Cluster at the node owning each channel's slot (cancel_watch.py).
        first = cfg.redis.cluster_nodes[0] if cfg.redis.cluster_nodes else None
        self._subscriber = (
            Redis(host=first[0], port=first[1], decode_responses=True, socket_connect_timeout=5)
            if first is not None
            else make_client(cfg.redis)
        )
        try:
            await self._redis.ping()
        except Exception as error:  # noqa: BLE001 - any failure here is "cannot reach Redis"
            await self._close_redis()
            raise StartError(f"Redis is unreachable at {redacted(cfg.redis.describe())}: {error}") from None
        self.store = TaskStore(self._redis, self.keys)
        self._output_limits = OutputLimits(
            inline_result_bytes=cfg.inline_result_bytes,
            max_output_bytes=cfg.max_output_bytes,
            blob_ttl_ms=cfg.blob_ttl_ms,
            max_task_bytes=cfg.max_task_bytes,
            max_principal_bytes=cfg.max_principal_bytes,
        )
        self.limits = ToolLimits(self.store, self.keys, cfg.lock_duration_ms, self.log)
        self.waitpoints = WaitpointOpener(self._redis, self.keys, self.store, cfg.waitpoint_secret)
        placement = ShardPlacement(self._redis, self.keys) if self.keys.layout == "sharded" else None
        self.batches = BatchParent(self.store, self.keys, cfg.queue, self.tools, self._queue_of, placement)
        known = await self.store.known_generations()
        if known and GENERATION not in known:
            await self._close_redis()
            raise StartError(
                f"this worker runs task-store scripts generation {GENERATION}, but the deployment's gateways run "
                f"{', '.join(sorted(known))}: install the taskrelay-worker built with your gateway's version"
            )
        if not known:
            self.log.warn("no gateway has announced its scripts generation yet; starting on this build's", generation=GENERATION)
        self._shards = await tool_shards(
            placement, self.keys, {name: (queue, self.tools[name].shards) for name, queue in self.queues.items()}
        )

    def _open_tool_queues(self) -> None:
        """One gated BullMQ Worker per tool queue (per shard of it in the sharded layout, §1.1), sharing the process's
        slots (§3.2); not running yet."""
        cfg = self.config
        gate = asyncio.Semaphore(cfg.concurrency)
        lock_ms = cfg.lock_duration_ms
        for shard in self._shards:
            name, queue = shard.tool, shard.queue
            worker = GatedWorker(
                shard.keys.queue_name(queue),
                traced(self.process, self.worker_id),  # each run in its span, as Node's (tracing.py)
                {
                    "connection": bull_options(cfg.redis),
                    "prefix": shard.keys.bull_prefix,
                    "concurrency": cfg.concurrency,
                    # Lock 2L/3, renewed every L/3, stalled check every L/6: a dead worker's job is re-queued within
                    # 5L/6 (§10.5), as the Node worker does.
                    "lockDuration": bull_lock_ms(lock_ms),
                    "lockRenewTime": max(50, round(lock_ms / 3)),
                    "stalledInterval": max(50, round(lock_ms / 6)),
                    "maxStalledCount": BULLMQ_MAX_STALLED,
                    "name": self.worker_id,
                    "autorun": False,
                },
                gate,
                lambda job_id: entry.token if (entry := self.running.get(job_id)) is not None else None,
            )
            worker.on("error", lambda error, *_: self.log.warn("BullMQ worker error", err=error))
            worker.on("lockRenewalFailed", self._on_lock_renewal_failed)
            self._bull.append(worker)
            self.log.debug("consuming tool queue", tool=name, queue=queue, shard=shard.keys.code)

    async def _apply_tool_limits(self) -> None:
        """BullMQ's global concurrency and rate limit of each tool's queue (§3.3): the newest worker to start decides."""
        # Across N shards each gets its part, rounded up, as the Node worker splits them (docs/SCALING.md).
        for shard in self._shards:
            tool = self.tools[shard.tool]
            queue = bullmq.Queue(
                shard.keys.queue_name(shard.queue),
                {"connection": bull_options(self.config.redis), "prefix": shard.keys.bull_prefix},
            )
            try:
                if tool.concurrency is not None:
                    await queue.setGlobalConcurrency(shard.split(tool.concurrency))
                else:
                    await queue.removeGlobalConcurrency()
                if tool.rate_limit is not None:
                    await queue.setGlobalRateLimit(shard.split(tool.rate_limit[0]), tool.rate_limit[1])
                else:
                    await queue.removeGlobalRateLimit()
            finally:
                await queue.close()

    # Drain and close (§21.1) -----------------------------------------------------------------------------------------

    async def close(self) -> None:
        """SIGTERM: take no more jobs; let running tools finish within ``WORKER_SHUTDOWN_GRACE_MS``; then cancel them
        with ``WORKER_SHUTDOWN`` (their jobs go back for another worker, no attempt used); then leave the catalog."""
        if self.closing:
            return
        self.closing = True
        self.log.info("worker draining", running=len(self.running), graceMs=self.config.shutdown_grace_ms)
        closes = [asyncio.ensure_future(worker.close()) for worker in self._bull]
        deadline = time.monotonic() + self.config.shutdown_grace_ms / 1000
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task_id in list(self.running):
            self._abort(task_id, CANCEL.WORKER_SHUTDOWN)
        try:
            await asyncio.wait_for(asyncio.gather(*closes, return_exceptions=True), timeout=30)
        except asyncio.TimeoutError:
            self.log.warn("BullMQ workers did not close in 30 s")
        for task in [*self._background, *self._bull_runs]:
            task.cancel()
        await asyncio.gather(*self._background, *self._bull_runs, return_exceptions=True)
        await self._leave_catalog()
        await self._close_queues()
        await self._close_redis()
        self.log.info("worker stopped")

    async def _close_redis(self) -> None:
        for client in (self._redis, self._subscriber):
            if client is not None:
                try:
                    await client.aclose()
                except Exception:  # noqa: BLE001
                    pass

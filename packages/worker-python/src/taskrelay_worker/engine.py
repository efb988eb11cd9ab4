"""The worker engine (PROTOCOL.md §5, §7, §10, §21, §29): one BullMQ ``Worker`` per tool queue under one process-wide
slot limit, the run of a job and what ``settle`` decides, cancels, the catalog heartbeat, hand-back and drain. It
follows the Node engine (packages/worker/src/engine) step for step; §29 lists where it does not reach it yet."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from importlib import metadata, resources
from typing import Any
from urllib.parse import unquote, urlparse

import bullmq
from bullmq.custom_errors import DelayedError, UnrecoverableError
from bullmq.lock_manager import LockManager
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from .config import Config, ConfigError, RedisTarget
from .context import RunSignal, Suspension, ToolContext
from .fan_out import BatchParent, priority_level_of
from .errors import NonRetryableError, RetryAfterError, SuspendedError, TaskCancelledError, TaskrelayError, serialize_error
from .keys import Keys, parse_batch_child_id, queue_of_bull_name, tool_pool, tool_queue
from .placement import ShardPlacement, ToolShard, tool_shards
from .limits import LimitWait, ToolLimits
from .log import Logger
from .log_keeper import TaskLogKeeper
from .metrics import WorkerMetrics
from .waitpoints import WaitpointOpener
from .protocol import BULLMQ_PAIR, GENERATION, message_problem
from .output import OutputLimits, RunOutput, StoredBytesLimitError
from .store import MAX_STORED_CHILD_RESULT_CHARS, TERMINAL, JobLock, TaskRecord, TaskStore
from .tools import ToolDefinition, to_tool_result
from .tracing import traced

#: setTimeout's ceiling in the Node worker: a longer timeout counts as none.
MAX_TIMER_MS = 2_147_483_647
DEFAULT_QUEUE_TIMEOUT_MS = 3_600_000
#: Stalls are counted per tool (``max_stalls``, §10.6), never by BullMQ.
BULLMQ_MAX_STALLED = 1_000_000_000
PRUNE_DEAD_WORKERS_AFTER_MS = 3_600_000
#: What a task whose run went back says until its next run starts (§5.7); the Node worker says the same.
HANDED_BACK_MESSAGE = "Waiting to be resumed: its worker stopped and put its run back in the queue"
#: The key of the data a job gets when its stored data is not JSON: ``{UNREADABLE_JOB_DATA: reason}`` (issue 48 F5).
UNREADABLE_JOB_DATA = "taskrelay.unreadableJobData"
#: How long a job left to a worker of its task's tool version waits before any worker may take it again (§12.11).
VERSION_DEFER_MS = 250


def bull_connection(url: str) -> dict[str, Any]:
    """bullmq's connection options for ``url``, with no socket timeout. redis-py 8 reads a reply for at most 5 s by
    default, so BullMQ's blocking wait for a job (``BZPOPMIN`` for up to 10 s) timed out, reconnected and backed off
    (up to 20 s): an idle worker then took new jobs only at its next wait, seconds late. bullmq passes these options to
    ``redis.Redis`` as they are."""
    parsed = urlparse(url)
    options: dict[str, Any] = {
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 6379,
        "db": int(parsed.path.lstrip("/") or 0),
        "username": unquote(parsed.username) if parsed.username else None,
        "password": unquote(parsed.password) if parsed.password else None,
        "socket_timeout": None,
        "socket_connect_timeout": 5,
    }
    if parsed.scheme == "rediss":
        options["ssl"] = True
    return options


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


class StartError(Exception):
    """The worker cannot start (Redis unreachable, another scripts generation): one line, exit code 1."""


def _now_ms() -> int:
    return int(time.time() * 1000)


#: What a cluster raises during a failover (PROTOCOL.md §10.10), beside the connection and timeout errors: the names
#: redis-py defines (looked up, so an older redis-py without one still imports).
_FAILOVER_ERRORS: tuple[type[BaseException], ...] = tuple(
    error
    for name in ("ClusterError", "ClusterDownError", "TryAgainError", "MasterDownError", "ReadOnlyError", "SlotNotCoveredError")
    if isinstance(error := getattr(redis_errors, name, None), type)
)
#: The same answers as a plain ResponseError (from a script or a pipeline): the first word of the reply.
_FAILOVER_REPLIES = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY", "UNBLOCKED", "MOVED", "ASK")


def bull_lock_ms(lock_duration_ms: int) -> int:
    """BullMQ's lock for a worker lock duration L (PROTOCOL.md §10.5): 2L/3, as the worker sets it."""
    return max(100, round(lock_duration_ms * 2 / 3))


async def write_through_outage(write: Any, window_ms: int, log: Logger, what: str) -> Any:
    """Runs ``write()`` (a coroutine factory), and again after a Redis-lost failure (a cluster's failover) with backoff
    (100 ms doubling to 1 s) until it answers or ``window_ms`` since the first failure passed: as long as the job's lock
    may still be this run's (PROTOCOL.md §10.10). Each try names the lock, so a late one is refused, never written over
    another run's outcome. Then the last error is raised (the job is handed back, or returns when its lock expires)."""
    failed_at: int | None = None
    retries = 0
    delay_ms = 100
    while True:
        try:
            outcome = await write()
        except Exception as error:
            if not is_redis_loss(error):
                raise
            now = _now_ms()
            failed_at = now if failed_at is None else failed_at
            if now - failed_at + delay_ms > window_ms:
                log.error(
                    f"{what} lost: Redis unreachable for as long as this run could hold the job lock; "
                    "the job returns to the queue and runs again",
                    err=error, retries=retries, pausedMs=now - failed_at, windowMs=window_ms, reason="REDIS_UNAVAILABLE",
                )
                raise
            if retries == 0:
                log.warn(
                    f"{what} write failed: Redis unreachable; retrying while this run may still hold the job lock",
                    err=error, windowMs=window_ms,
                )
            retries += 1
            await asyncio.sleep(delay_ms / 1000)
            delay_ms = min(delay_ms * 2, 1000)
            continue
        if failed_at is not None:
            log.info(f"{what} written after Redis answered again", retries=retries, pausedMs=_now_ms() - failed_at)
        return outcome


def is_redis_loss(error: BaseException) -> bool:
    """Redis could not be reached or could not serve yet (a failover), as opposed to an error it answered with."""
    if isinstance(error, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, *_FAILOVER_ERRORS)):
        return True
    return isinstance(error, redis_errors.ResponseError) and str(error).split(" ", 1)[0] in _FAILOVER_REPLIES


@dataclass
class RunEntry:
    signal: RunSignal
    token: str
    queue: str
    parent_id: str | None = None
    run_task: asyncio.Task | None = None
    grace: asyncio.TimerHandle | None = None
    aborted_at: float | None = None
    #: Gives back the run's slot of a per-key limit (§3.5); called as the run ends, however it ends.
    release: Any = None
    #: Whose keyed limits the run counts in (§3.5): the task's principal, or a batch child's owner.
    principal: str = ""
    #: The tool has returned and the run writes its own end: the cancel sweep leaves it alone, or it would take the
    #: terminal status the run itself just wrote for another's (``LOCK_LOST``, issue 48 F6).
    settling: bool = False


class DrainingLocks(LockManager):
    """bullmq's lock manager, kept renewing until the worker's last running job is done (issue 48 P1). bullmq 3.4.4's
    fetch loop ends as soon as ``close()`` cancels its pending fetch, and closes the lock manager as it ends, while the
    jobs in flight still run: their locks lapsed halfway through the drain's grace, and the hand-back that followed
    found no lock (``moveJobFromActiveToWait`` answered -2), stranding the task until another worker's stall check.
    ``close()``'s own teardown waits for the running jobs before it closes the manager, as Node's does; only the loop's
    early close is held back here. A forced close does not wait."""

    async def close(self) -> None:
        # bullmq untracks a job when its processJob ends and signals nothing: a short poll is the one hook there is.
        while self.tracked_jobs and not self.closed and not getattr(self.worker, "forceClosing", False):
            await asyncio.sleep(0.05)
        await super().close()


class GatedWorker(bullmq.Worker):
    """A BullMQ Worker that takes a job only with a slot of the process (§3.2): ``WORKER_CONCURRENCY`` bounds the
    whole process, whatever number of tool queues it consumes. BullMQ (Python, like Node OSS) has no worker of several
    queues, so the gate is ours: a job holds its slot from ``moveToActive`` until ``processJob`` is done with it."""

    def __init__(
        self, name: str, processor: Any, opts: dict, gate: asyncio.Semaphore, current_token: Any = None
    ) -> None:
        self._gate = gate
        #: The token of the run of a job id now running in this process, if any (TaskrelayWorker.running).
        self._current_token = current_token or (lambda job_id: None)
        super().__init__(name, processor, opts)
        self.lockManager = DrainingLocks(
            self,
            lock_renew_time=self.opts["lockRenewTime"],
            lock_duration=self.opts["lockDuration"],
            worker_id=self.id,
            worker_name=self.workerName,
        )

    async def moveToActive(self, token: str):  # noqa: N802 - BullMQ's name
        if self._gate.locked():
            # Every slot is busy: put back the marker this worker may have taken, so an idle worker of another
            # process takes the job, and wait for a slot holding no job.
            try:
                await self.client.zadd(self.keys["marker"], {"0": 0})
            except Exception:  # noqa: BLE001 - a lost wake-up costs one block timeout, nothing more
                pass
        await self._gate.acquire()
        if self.closing:
            # A fetch that waited for a slot through the start of a drain: its job would have no fetch loop left to
            # run it, and would sit active until its lock lapsed.
            self._gate.release()
            return None
        try:
            job = await super().moveToActive(token)
        except BaseException:
            self._gate.release()
            raise
        if job is None:
            self._gate.release()
        return job

    async def nextJobFromJobData(self, job_data: Any = None, job_id: Any = None, *args: Any, **kwargs: Any):  # noqa: N802
        # bullmq parses the stored data here, outside any processor: data that is not JSON left the job active and
        # unprocessed, taken again at each stall check and never failed (issue 48 F5). It reaches the processor as
        # data naming why, and the run fails its task with that reason (the Node worker's createJob does the same).
        if job_data:
            raw = job_data.get("data", "{}")
            try:
                json.loads(raw)
            except (TypeError, ValueError) as error:
                reason = f"its stored data is not valid JSON ({error})"
                job_data = {**job_data, "data": json.dumps({UNREADABLE_JOB_DATA: reason})}
        return await super().nextJobFromJobData(job_data, job_id, *args, **kwargs)

    async def processJob(self, job: Any, token: str):  # noqa: N802
        try:
            return await super().processJob(job, token)
        finally:
            self._gate.release()
            # bullmq tracks locks by job id: a run handed back here and taken again here at once (its marker woke
            # this worker) was just untracked by the end of the old run. Track the new run's lock again, or it would
            # not be renewed and another worker would take the job over.
            current = self._current_token(str(job.id))
            if current is not None and current != token:
                self.lockManager.track_job(str(job.id), current, int(time.time() * 1000))


class TaskrelayWorker:
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
        #: The batch engine behind ``ctx.fan_out`` (§26, fan_out.py).
        self.batches: BatchParent | None = None

    # Start ---------------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        installed = metadata.version("bullmq")
        if installed != BULLMQ_PAIR["python"]:
            raise StartError(
                f"bullmq {installed} is installed, but this worker's scripts pair with bullmq {BULLMQ_PAIR['python']} "
                f"(Node bullmq {BULLMQ_PAIR['node']}): pip install bullmq=={BULLMQ_PAIR['python']}"
            )
        cfg = self.config
        self._redis = make_client(cfg.redis)
        # Pub/sub stays classic SUBSCRIBE (PROTOCOL.md §1.1): on a Cluster any node forwards every PUBLISH, so the
        # subscriber talks to one seed node.
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
            raise StartError(f"Redis is unreachable at {_redacted(cfg.redis.describe())}: {error}") from None
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
        self.batches = BatchParent(self.store, self.keys, cfg.queue, self.tools, self._queue_of)
        known = await self.store.known_generations()
        if known and GENERATION not in known:
            await self._close_redis()
            raise StartError(
                f"this worker runs task-store scripts generation {GENERATION}, but the deployment's gateways run "
                f"{', '.join(sorted(known))}: install the taskrelay-worker built with your gateway's version"
            )
        if not known:
            self.log.warn("no gateway has announced its scripts generation yet; starting on this build's", generation=GENERATION)
        placement = ShardPlacement(self._redis, self.keys) if self.keys.layout == "sharded" else None
        self._shards = await tool_shards(
            placement, self.keys, {name: (queue, self.tools[name].shards) for name, queue in self.queues.items()}
        )
        await self._apply_tool_limits()
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
                    "lockDuration": max(100, round(lock_ms * 2 / 3)),
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
        self._background.append(asyncio.ensure_future(self._cancel_listener()))
        self._background.append(asyncio.ensure_future(self._cancel_sweep()))
        await self._publish_catalog()
        self._background.append(asyncio.ensure_future(self._heartbeat()))
        self._bull_runs = [asyncio.ensure_future(worker.run()) for worker in self._bull]
        self.log.info(
            "worker ready",
            queue=cfg.queue,
            pool=self.pool,
            tools=list(self.tools),
            concurrency=cfg.concurrency,
            generation=GENERATION,
            language="python",
        )

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

    # Catalog heartbeat (§3.1) ----------------------------------------------------------------------------------------

    async def _publish_catalog(self) -> None:
        assert self._redis is not None
        now = _now_ms()
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
            await asyncio.sleep(self.config.heartbeat_ms / 1000)
            try:
                await self._publish_catalog()
            except Exception as error:  # noqa: BLE001
                self.log.warn("heartbeat failed", err=error)

    # Cancels (§7) ------------------------------------------------------------------------------------------------

    def _abort(self, task_id: str, reason: str) -> None:
        entry = self.running.get(task_id)
        if entry is None or entry.signal.aborted:
            return
        entry.signal.abort(reason)
        entry.aborted_at = time.monotonic()
        self.log.info("tool signal aborted", taskId=task_id, reason=reason)

        def past_grace() -> None:
            if entry.run_task is not None and not entry.run_task.done():
                self.log.warn(
                    "tool still running after its cancellation; its asyncio task is cancelled",
                    taskId=task_id,
                    reason=reason,
                    abortGraceMs=self.config.abort_grace_ms,
                )
                entry.run_task.cancel()

        entry.grace = asyncio.get_running_loop().call_later(self.config.abort_grace_ms / 1000, past_grace)

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
            holder = await self._redis.get(self.keys.bull_job_lock(entry.queue, job_id))
        except Exception:  # noqa: BLE001 - Redis away: the sweep and the next renewal decide
            return
        if holder != entry.token and self.running.get(job_id) is entry:
            self._abort(job_id, "LOCK_LOST")

    async def _cancel_listener(self) -> None:
        assert self._subscriber is not None
        while True:
            pubsub = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self.keys.cancel_channel)
                # A message missed while the subscriber was away is found by re-reading the running tasks.
                await self._sweep_once()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None or message.get("type") != "message":
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
                raise
            except Exception as error:  # noqa: BLE001 - Redis gone: subscribe again
                self.log.debug("cancel subscriber lost; subscribing again", err=error)
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001
                    pass
                await asyncio.sleep(0.5)

    async def _cancel_sweep(self) -> None:
        while True:
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
                    self._abort(task_id, "CLIENT_CANCELLED")
            elif status in TERMINAL:
                self._abort(task_id, reason or ("TIMEOUT" if status == "failed" else "LOCK_LOST"))
            elif status is not None and lock is not None and lock != entry.token:
                self._abort(task_id, "LOCK_LOST")

    # The run of a job (§5, §21.2) ------------------------------------------------------------------------------------

    async def process(self, job: Any, token: str) -> Any:
        task_id = str(job.id)
        data = job.data if isinstance(job.data, dict) else {}
        attempt = max(1, int(getattr(job, "attemptsStarted", 0) or 0) or job.attemptsMade + 1)
        log = self.log.child(taskId=task_id, jobId=task_id, tool=job.name, attempt=attempt)
        if isinstance(data.get("principal"), str):
            log.bind(principal=data["principal"])
        queue = queue_of_bull_name(job.queue.name)
        entry = RunEntry(signal=RunSignal(), token=token, queue=queue)
        self.running[task_id] = entry
        started = self.metrics.run_started(job)
        try:
            if (isinstance(data.get("child"), int) and not isinstance(data.get("child"), bool)) or parse_batch_child_id(task_id):
                return await self._run_child(job, token, data, attempt, entry, log)
            return await self._run(job, token, task_id, data, attempt, entry, log)
        except (DelayedError, UnrecoverableError):
            raise
        except Exception as error:
            if is_redis_loss(error):
                self.metrics.redis_errors.labels("commands").inc()
                log.warn("Redis unreachable while recording the run; handing the job back", err=error)
                return await self.hand_back(job, token, log, "LOCK_LOST")
            raise
        finally:
            self.metrics.run_ended(job.name, started, entry.aborted_at, entry.signal.reason)
            if entry.grace is not None:
                entry.grace.cancel()
            if entry.release is not None:
                try:
                    await entry.release()
                except Exception as error:  # noqa: BLE001 - its lease ends it
                    log.warn("could not give back the run's limit slot; its lease ends it", err=error)
            if self.running.get(task_id) is entry:
                del self.running[task_id]

    async def _run(
        self, job: Any, token: str, task_id: str, data: dict, attempt: int, entry: RunEntry, log: Logger
    ) -> Any:
        assert self.store is not None
        if self.closing:
            return await self.hand_back(job, token, log)
        lock = JobLock(entry.queue, token)
        timeout_hint = data.get("timeoutMs") if isinstance(data.get("timeoutMs"), int) else None
        queue_timeout_ms = data.get("queueTimeoutMs") if isinstance(data.get("queueTimeoutMs"), int) else None
        queue_timeout_ms = queue_timeout_ms or DEFAULT_QUEUE_TIMEOUT_MS
        deadline_at = _now_ms() + min(timeout_hint or MAX_TIMER_MS, MAX_TIMER_MS) + self.config.lock_duration_ms + queue_timeout_ms
        principal = data.get("principal") if isinstance(data.get("principal"), str) else None
        first = self._first_run(job, task_id, data, principal, queue_timeout_ms)
        if first is not None and principal is not None:
            # Sent before anything else of the run is written, and not awaited before its tool (§21.2.1).
            started = self.store.start_pipelined(task_id, lock, attempt, deadline_at, principal, first.version or "")
            start = asyncio.ensure_future(self._read_start(started, task_id, log))
            # What a task that never ran holds: no state, steps or questions, and the job's principal.
            record = TaskRecord(task_id=task_id, status="working", principal=principal, tool=first.name, fields={})
            entry.principal = principal
            try:
                return await self._run_started(job, token, task_id, data, attempt, entry, log, lock, record, start)
            finally:
                # The job leaves this run only once its start is answered: bullmq's next move of the job goes on
                # another connection and must not overtake it.
                await start
        # The run records the tool version it runs, and does not start a task another version ran (§12.11).
        versioned = self.tools.get(data.get("tool")) if isinstance(data.get("tool"), str) else None
        lock_lost, task, other = await self.store.start_run(
            task_id, lock, attempt, deadline_at, principal, versioned.version if versioned else "", versioned is not None
        )
        if not lock_lost and other is not None and versioned is not None:
            policy = await self._version_change(job, token, task_id, lock, versioned, other, log)
            lock_lost, task, _ = await self.store.start_run(
                task_id, lock, attempt, deadline_at, principal, versioned.version, False, policy == "restart"
            )
        if lock_lost:
            log.warn("job lock already lost at start; tool not run")
            raise DelayedError()
        if task is not None and task.principal != principal:
            await self._redis.zrem(self.keys.for_task(task_id).fair_share(lock.queue, task.principal), task_id)  # type: ignore[union-attr]
        if task is None or task.status in TERMINAL:
            log.info("task is missing or already terminal; tool not run", status=task.status if task else "missing")
            if task is not None and task.status == "cancelled":
                await self._stop_batch(task_id, log)
            return None
        if principal != task.principal:
            log.bind(principal=task.principal)
        entry.principal = task.principal
        return await self._run_started(job, token, task_id, data, attempt, entry, log, lock, task, None)

    def _first_run(
        self, job: Any, task_id: str, data: dict, principal: str | None, queue_timeout_ms: int
    ) -> ToolDefinition | None:
        """The tool of a first run, whose start is pipelined (§21.2.1), or None when this run awaits its start before
        its tool as every other does: bullmq's first fetch of the job, data naming its principal and a tool served here
        without per-key or shared limits, and the job younger than half its queue timeout."""
        if int(getattr(job, "attemptsStarted", 0) or 0) != 1 or principal is None or data.get("taskId") != task_id:
            return None
        tool = self.tools.get(data.get("tool")) if isinstance(data.get("tool"), str) else None
        if tool is None or tool.admitted_slot is not None or tool.admitted_rate is not None:
            return None
        delay = int((getattr(job, "opts", None) or {}).get("delay") or 0)
        if _now_ms() - int(getattr(job, "timestamp", 0) or 0) - delay > queue_timeout_ms / 2:
            return None
        return tool

    async def _read_start(self, started: asyncio.Future, task_id: str, log: Logger) -> TaskRecord | None:
        """A first run's start answered: the task as it started, or None when the run must stop, its signal aborted
        at once (one round trip after the run began). Never raises."""
        try:
            lock_lost, task, _ = await started
        except Exception as error:  # noqa: BLE001 - as at a start before the tool: the job is handed back
            log.warn("Redis unreachable while recording the start; the run stops", err=error)
            self._abort(task_id, "LOCK_LOST")
            return None
        if lock_lost:
            self._abort(task_id, "LOCK_LOST")
            return None
        if task is None or task.status in TERMINAL:
            # Cancelled (or ended, or deleted) before this run began, and the cancel's remove did not reach the job.
            reason = "LOCK_LOST"
            if task is not None and task.status == "cancelled":
                reason = task.cancel_reason or "CLIENT_CANCELLED"
            elif task is not None and task.status == "failed" and '"TIMEOUT"' in task.fields.get("error", ""):
                reason = "TIMEOUT"
            status = task.status if task is not None else "missing"
            log.info("task ended before its run recorded its start; aborting tool", status=status)
            self._abort(task_id, reason)
            return None
        return task

    async def _run_started(
        self,
        job: Any,
        token: str,
        task_id: str,
        data: dict,
        attempt: int,
        entry: RunEntry,
        log: Logger,
        lock: JobLock,
        task: TaskRecord,
        start: asyncio.Future | None,
    ) -> Any:
        assert self.store is not None
        timeout_hint = data.get("timeoutMs") if isinstance(data.get("timeoutMs"), int) else None
        queue_timeout_ms = data.get("queueTimeoutMs") if isinstance(data.get("queueTimeoutMs"), int) else None
        queue_timeout_ms = queue_timeout_ms or DEFAULT_QUEUE_TIMEOUT_MS
        tool_name, arguments = data.get("tool"), data.get("arguments")
        # The manifest's `jobData` shape (messages.ts `JobDataSchema`), and the job's own id as its taskId.
        problem = message_problem("jobData", data)
        if data.get("taskId") != task_id or problem is not None:
            unreadable = data.get(UNREADABLE_JOB_DATA)
            message = (
                f"Invalid job data: {unreadable}"
                if isinstance(unreadable, str)
                else f"Invalid job data: {problem or 'its taskId is not the job id'}"
            )
            await self._fail_task(task_id, lock, message, {"code": "INTERNAL", "message": message}, log)
            raise UnrecoverableError(message)
        tool = self.tools.get(tool_name)
        if tool is None:
            message = f"Tool {tool_name} is not served by worker {self.worker_id} (queue {lock.queue})"
            await self._fail_task(task_id, lock, message, {"code": "TOOL_NOT_FOUND", "message": message}, log)
            raise UnrecoverableError(message)
        if job.stalledCounter > tool.max_stalls:
            message = (
                f"The worker running this task stopped responding {job.stalledCounter} times (crashed or lost its "
                f"lock); giving up (maxStalls {tool.max_stalls})"
            )
            await self._fail_task(task_id, lock, message, {"code": "JOB_LOST", "message": message}, log)
            raise UnrecoverableError(message)
        try:
            args = tool.parse_arguments(arguments)
        except NonRetryableError as error:
            await self._fail_task(task_id, lock, str(error), {"code": "INVALID_ARGUMENTS", "message": str(error)}, log)
            raise UnrecoverableError(str(error)) from None

        # A per-key or shared limit (§3.5) may send the run back to wait, holding no slot.
        wait = await self._admit(tool, arguments, job, entry)
        if wait is not None:
            until = _now_ms() + wait.wait_ms
            held, _ = await self.store.suspend(task_id, lock, until + queue_timeout_ms, status_message=wait.message)
            if held == "lock_lost":
                self._lost_while_writing(log, "limit wait")
            if held == "gone":
                log.info("task ended meanwhile; no limit wait")
                return None
            return await self._delay_for_limit(job, token, tool, arguments, wait, entry.principal, log)

        timeout_ms = min((t for t in (timeout_hint, tool.timeout_ms) if t is not None), default=None)
        # The tool's log lines are also kept with its task (§30.4); the engine's own lines are not.
        keeper = TaskLogKeeper(self.store, task_id, attempt, log)
        ctx = ToolContext(
            task_id=task_id,
            tool=tool.name,
            attempt=attempt,
            signal=entry.signal,
            store=self.store,
            lock=lock,
            log=keeper.wrap(log),
            record=task,
            progress_interval_ms=self.config.progress_interval_ms,
            input_timeout_ms=tool.input_timeout_ms,
            queue_timeout_ms=queue_timeout_ms,
            on_lock_lost=lambda: self._abort(task_id, "LOCK_LOST"),
            waitpoints=self.waitpoints,
            start=start,
            batch=None if self.batches is None else self.batches.for_run(data.get("maxOpen"), data.get("priority")),
            on_progress=self.metrics.progress,
        )
        ctx.attach_output(RunOutput(self.store, self._output_limits, task_id, task.principal, lock, task_id, log))
        timeout_message = f"Tool {tool.name} timed out after {timeout_ms or 0} ms"
        timeout_write: asyncio.Task | None = None

        def on_timeout() -> None:
            nonlocal timeout_write
            if entry.signal.aborted or ctx.suspension is not None:
                return
            log.info("tool timed out; aborting it", reason="TIMEOUT", timeoutMs=timeout_ms)
            self._abort(task_id, "TIMEOUT")
            ctx.close()
            timeout_write = asyncio.ensure_future(
                self._fail_task(task_id, lock, timeout_message, {"code": "TIMEOUT", "message": timeout_message}, log)
            )

        loop = asyncio.get_running_loop()
        timer = None if timeout_ms is None else loop.call_later(min(timeout_ms, MAX_TIMER_MS) / 1000, on_timeout)
        log.info("tool started", timeoutMs=timeout_ms)
        ok, value, error = await self._run_tool(entry, tool, args, ctx, timer)
        entry.settling = True
        await keeper.flush()
        reason = entry.signal.reason

        # settle (§21.3): the abort reason first, then the suspension, then the outcome.
        if reason == "LOCK_LOST":
            ctx.close()
            log.warn("run ended after losing the job lock; nothing recorded", returned=ok)
            return await self.hand_back(job, token, log, "LOCK_LOST")
        if reason == "TIMEOUT":
            ctx.close()
            if timeout_write is not None:
                await timeout_write
            raise UnrecoverableError(timeout_message)
        if reason == "CLIENT_CANCELLED":
            ctx.close()
            if ok:
                log.info("tool returned after its task was cancelled; result discarded")
            await self._ensure_cancelled(task_id, lock, log)
            # A parent cancelled during its run (releasing, say) has no later run to stop its children: this one does.
            await self._stop_batch(task_id, log)
            return None
        if reason == "GATEWAY_SHUTDOWN":
            ctx.close()
            log.info("tool stopped: the gateway holding its call shut down", reason=reason)
            return None
        if ctx.suspension is not None:
            await ctx.flush()
            ctx.close()
            if ok or not isinstance(error, SuspendedError):
                log.warn("tool went on after its run suspended; what it returned or raised is discarded")
            return await self._suspend_job(job, token, task_id, ctx.suspension, log)
        if reason == "WORKER_SHUTDOWN" and not ok:
            ctx.close()
            # Until its next run starts (whose start clears it), the task says it waits, not its last progress (§5.7).
            try:
                await self.store.suspend(
                    task_id, lock, _now_ms() + queue_timeout_ms, status_message=HANDED_BACK_MESSAGE
                )
            except Exception as error:  # noqa: BLE001 - a failed write costs only the message
                log.debug("could not say that the task waits to be resumed", err=error)
            return await self.hand_back(job, token, log, "WORKER_SHUTDOWN")
        if ok:
            try:
                result = await ctx.finish_result(to_tool_result(tool, value))
            except StoredBytesLimitError as bad:
                ok, error = False, NonRetryableError(str(bad))
            except NonRetryableError as bad:
                ok, error = False, bad
            else:
                await ctx.flush()
                ctx.close()
                written, status, lost = await self._write_end(task_id, "completed", {"result": result}, lock, log)
                if written:
                    log.info("task completed")
                elif lost:
                    self._lost_while_writing(log, "result")
                else:
                    log.info("task already terminal; result discarded", status=status or "missing")
                return None
        await ctx.flush()
        ctx.close()
        if isinstance(error, RetryAfterError):
            self.metrics.back_offs.labels(tool.name).inc()
            until = _now_ms() + int(error.retry_after * 1000)
            iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(until / 1000)) + f".{until % 1000:03d}Z"
            held, _ = await self.store.suspend(
                task_id, lock, until + queue_timeout_ms, status_message=f"Backing off until {iso}: {error}"
            )
            if held == "lock_lost":
                self._lost_while_writing(log, "back-off")
            if held == "gone":
                log.info("task ended meanwhile; no back-off")
                return None
            log.info("upstream asked to retry later; the run ends, holding no slot", retryAfterMs=until - _now_ms())
            await self._hold(tool, arguments, entry.principal, int(error.retry_after * 1000), log)
            return await self._suspend_job(job, token, task_id, Suspension("time", until), log)
        assert error is not None
        attempts = int(job.opts.get("attempts") or 1)
        non_retryable = isinstance(error, (NonRetryableError, UnrecoverableError, SuspendedError)) or (
            isinstance(error, TaskrelayError) and error.code == "PROTOCOL_ERROR"
        )
        if non_retryable or job.attemptsMade + 1 >= attempts:
            serialized = serialize_error(error)
            await self._fail_task(task_id, lock, serialized["message"], serialized, log, error)
            raise UnrecoverableError(serialized["message"])
        log.warn("tool failed; the job will be retried", err=error, attempts=attempts, attemptsMade=job.attemptsMade + 1)
        raise error if isinstance(error, Exception) else RuntimeError(str(error))

    async def _run_child(self, job: Any, token: str, data: dict, attempt: int, entry: RunEntry, log: Logger) -> Any:
        """One batch child (§26.3): runs while its parent is live and its outcome unrecorded, records it once under
        its job lock, moves the parent's progress and wakes the parent when a window or the batch is done."""
        assert self.store is not None
        if self.closing:
            return await self.hand_back(job, token, log)
        parent_id, index, tool_name = data.get("taskId"), data.get("child"), data.get("tool")
        arguments = data.get("arguments")
        unreadable: str | None = None
        if not isinstance(parent_id, str) or not isinstance(index, int) or not isinstance(tool_name, str) or not isinstance(arguments, dict):
            # Data that cannot be read (issue 48 F5, §5.8) fails this child, recorded once; its id names it (§26.2).
            why = data.get(UNREADABLE_JOB_DATA)
            unreadable = f"Invalid job data: {why if isinstance(why, str) else 'it needs taskId, child, tool and an arguments object'}"
            ids = parse_batch_child_id(str(job.id))
            if ids is None:
                raise UnrecoverableError(unreadable)
            (parent_id, index), tool_name, arguments = ids, job.name, {}
        entry.parent_id = parent_id
        log.bind(parentId=parent_id, child=index)
        lock = JobLock(entry.queue, token)
        start, owner, parent_pool = await self.store.start_child(parent_id, index, lock)
        owner = owner if start == "run" else (data.get("principal") or "")
        entry.principal = owner
        try:
            await self._redis.zrem(self.keys.for_task(str(job.id)).fair_share(lock.queue, owner), str(job.id))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - the fair share prunes what it misses
            pass
        if start == "lock_lost":
            log.warn("child job lock already lost at start; tool not run")
            raise DelayedError()
        if start != "run":
            log.info("batch child not run (parent ended, batch stopped, or recorded)", outcome=start)
            return None

        async def record(outcome: dict) -> None:
            store = self.store
            assert store is not None
            written = await write_through_outage(
                lambda: store.record_child(parent_id, index, owner, lock, outcome),  # type: ignore[arg-type]
                bull_lock_ms(self.config.lock_duration_ms),
                log,
                "child outcome",
            )
            if written["outcome"] == "lock_lost":
                self._lost_while_writing(log, "child outcome")
            if written["outcome"] != "recorded":
                log.info("child outcome not recorded (already recorded, or the batch is gone)", outcome=written["outcome"])
                return
            self.metrics.batch_children.labels(tool_name, outcome["status"]).inc()
            done, size, failed_count = written["done"], written["size"], written["failed"]
            message = f"{done} of {size} children done ({failed_count} failed)"
            try:
                await self.store.record_progress(parent_id, done, size, message, None)  # type: ignore[union-attr]
            except Exception as error:  # noqa: BLE001
                log.debug("batch progress write failed", err=error)
            promoted = written["wake"] and await self._promote(parent_pool, parent_id, log)
            # The parent should run and this record did not promote it (its run is live, queued, or lost with its
            # worker until a takeover): the child releases the next window itself (§26.3 step 4, fan_out.py).
            if not promoted and (written["wake"] or written["below"]) and self.batches is not None:
                try:
                    level = priority_level_of((job.opts or {}).get("priority") or 0)
                    await self.batches.release_from_child(parent_id, data.get("maxOpen"), level, log)  # type: ignore[arg-type]
                except Exception as error:  # noqa: BLE001 - the parent's next run releases it
                    log.warn("could not release the next window for a parent that is not waiting", err=error, parentId=parent_id)

        def failed(code: str, message: str) -> dict:
            return {
                "status": "failed",
                "result": {"content": [{"type": "text", "text": message}], "isError": True},
                "error": {"code": code, "message": message},
            }

        if unreadable is not None:
            log.warn(unreadable)
            return await record(failed("INTERNAL", unreadable))
        tool = self.tools.get(tool_name)
        if tool is None:
            return await record(failed("TOOL_NOT_FOUND", f"Tool {tool_name} is not served by this worker (queue {lock.queue})"))
        if job.stalledCounter > tool.max_stalls:
            return await record(failed("JOB_LOST", f"The worker running this child stopped responding {job.stalledCounter} times; giving up"))
        try:
            args = tool.parse_arguments(arguments)
        except NonRetryableError as error:
            return await record(failed("INVALID_ARGUMENTS", str(error)))
        wait = await self._admit(tool, arguments, job, entry)
        if wait is not None:
            return await self._delay_for_limit(job, token, tool, arguments, wait, entry.principal, log)
        timeout_ms = data.get("timeoutMs") if isinstance(data.get("timeoutMs"), int) else tool.timeout_ms
        ctx = ToolContext(
            task_id=str(job.id),
            tool=tool.name,
            attempt=attempt,
            signal=entry.signal,
            store=_NoProgressStore(self.store),  # type: ignore[arg-type]
            lock=lock,
            log=log,
            record=_child_record(str(job.id), tool.name),
            progress_interval_ms=self.config.progress_interval_ms,
            input_timeout_ms=tool.input_timeout_ms,
            queue_timeout_ms=DEFAULT_QUEUE_TIMEOUT_MS,
            on_lock_lost=lambda: self._abort(str(job.id), "LOCK_LOST"),
        )
        # A child's output, artifacts and large result are its parent task's (§26.1, §34).
        ctx.attach_output(RunOutput(self.store, self._output_limits, parent_id, owner, lock, str(job.id), log))
        loop = asyncio.get_running_loop()
        timer = None if timeout_ms is None else loop.call_later(timeout_ms / 1000, self._abort, str(job.id), "TIMEOUT")
        log.info("batch child started")
        ok, value, error = await self._run_tool(entry, tool, args, ctx, timer)
        ctx.close()
        reason = entry.signal.reason
        if reason == "LOCK_LOST" or (reason == "WORKER_SHUTDOWN" and not ok):
            return await self.hand_back(job, token, log, reason)
        if reason == "TIMEOUT":
            return await record(failed("TIMEOUT", f"Tool {tool.name} timed out after {timeout_ms or 0} ms"))
        if reason in ("CLIENT_CANCELLED", "GATEWAY_SHUTDOWN") or isinstance(error, SuspendedError):
            log.info("batch child stopped with its batch")
            return None
        if ok:
            try:
                result = await ctx.finish_result(to_tool_result(tool, value), MAX_STORED_CHILD_RESULT_CHARS - 1_024)
                return await record({"status": "completed", "result": result})
            except StoredBytesLimitError as bad:
                return await record(failed("NON_RETRYABLE", str(bad)))
            except NonRetryableError as bad:
                return await record({**failed("NON_RETRYABLE", str(bad)), "error": serialize_error(bad)})
        if isinstance(error, RetryAfterError):
            await self._hold(tool, arguments, entry.principal, int(error.retry_after * 1000), log)
            try:
                await job.moveToDelayed(_now_ms() + int(error.retry_after * 1000), token)
                log.info("batch child backs off; it runs again after the wait", retryAfterMs=int(error.retry_after * 1000))
            except Exception as moved:  # noqa: BLE001
                log.info("batch child not delayed (its lock is gone); it returns to the queue", err=moved)
            raise DelayedError()
        assert error is not None
        attempts = int(job.opts.get("attempts") or 1)
        if isinstance(error, (NonRetryableError, UnrecoverableError)) or job.attemptsMade + 1 >= attempts:
            serialized = serialize_error(error)
            return await record({**failed(serialized["code"], serialized["message"]), "error": serialized})
        log.warn("batch child failed; it will be retried", err=error, attemptsMade=job.attemptsMade + 1)
        raise error if isinstance(error, Exception) else RuntimeError(str(error))

    async def _admit(self, tool: ToolDefinition, arguments: dict, job: Any, entry: RunEntry) -> LimitWait | None:
        """The tool's own limits (§3.5): None when the run may start, else why and how long it waits."""
        if self.limits is None or (tool.admitted_slot is None and tool.admitted_rate is None):
            return None

        async def promote(pool: str, job_id: str) -> str:
            """"woken", "there" (not delayed: still running, or woken already) or "gone" (no job, or it ended)."""
            if await self._promote(pool, job_id, self.log):
                return "woken"
            try:
                state = await self._queue_of(pool, job_id).getJobState(job_id)
            except Exception:  # noqa: BLE001 - unreadable counts as gone: the line must move on
                return "gone"
            return "gone" if state in ("unknown", "completed", "failed") else "there"

        return await self.limits.admit(tool, arguments, job, entry, promote)

    async def _delay_for_limit(
        self, job: Any, token: str, tool: ToolDefinition, arguments: dict, wait: LimitWait, principal: str, log: Logger
    ) -> Any:
        """The refused run's job waits in the delayed set (no attempt used, no slot held); a slot waiter that slipped
        past its releaser's promotion promotes itself (§3.5 step 3)."""
        self.metrics.limit_waits.labels(tool.name, wait.limit).inc()
        try:
            await job.moveToDelayed(_now_ms() + wait.wait_ms, token)
        except Exception as moved:  # noqa: BLE001
            log.info("waiting job not delayed (its lock is gone); it returns to the queue", err=moved)
            raise DelayedError() from None
        if wait.limit == "slot" and self.limits is not None:
            try:
                if await self.limits.room_now(tool, arguments, job, principal):
                    await job.promote()
            except Exception as error:  # noqa: BLE001 - the delay's end brings it back
                log.debug("could not re-check the slot after waiting", err=error)
        log.info("run waits for its tool's limit, holding no slot", limit=wait.limit, waitMs=wait.wait_ms)
        raise DelayedError()

    async def _hold(self, tool: ToolDefinition, arguments: dict, principal: str, ms: int, log: Logger) -> None:
        """A back-off of a tool with its own rate limit holds it for every tool that shares it (§3.4, §3.5)."""
        if self.limits is None or tool.admitted_rate is None:
            return
        try:
            await self.limits.hold(tool, arguments, principal, ms)
        except Exception as error:  # noqa: BLE001
            log.warn("could not hold the shared rate limit", err=error)

    def _queue_of(self, pool: str, job_id: str) -> Any:
        """A queue this worker wakes jobs in (batch parents, limit waiters), one per pool and shard of the job, closed
        with the worker."""
        keys = self.keys.for_task(job_id)
        queue = self._parent_queues.get((pool, keys.bull_prefix))
        if queue is None:
            queue = bullmq.Queue(keys.queue_name(pool), {"connection": bull_options(self.config.redis), "prefix": keys.bull_prefix})
            self._parent_queues[(pool, keys.bull_prefix)] = queue
        return queue

    async def _promote(self, pool: str, job_id: str, log: Logger) -> bool:
        """Wakes a batch parent's delayed job in its queue (§26.4)."""
        try:
            await self._queue_of(pool, job_id).backend.promote(job_id)
            log.debug("job promoted", jobId=job_id)
            return True
        except Exception as error:  # noqa: BLE001 - not delayed (still running, or woken already): its poll finds it
            log.debug("job not promoted", jobId=job_id, err=error)
            return False

    async def _run_tool(
        self, entry: RunEntry, tool: ToolDefinition, args: Any, ctx: ToolContext, timer: asyncio.TimerHandle | None
    ) -> tuple[bool, Any, BaseException | None]:
        """Runs the handler as an asyncio task of its own (its cancel grace cancels it, §29.1), for a task and a batch
        child alike: (returned, its value, what it raised; a task cancelled after the grace raised the cancel)."""
        entry.run_task = asyncio.ensure_future(tool.run(args, ctx))
        await asyncio.wait({entry.run_task})
        if timer is not None:
            timer.cancel()
        if entry.run_task.cancelled():
            return False, None, TaskCancelledError(entry.signal.reason or "WORKER_SHUTDOWN")
        if entry.run_task.exception() is not None:
            return False, None, entry.run_task.exception()
        return True, entry.run_task.result(), None

    async def _version_change(
        self, job: Any, token: str, task_id: str, lock: JobLock, tool: ToolDefinition, recorded: str, log: Logger
    ) -> str:
        """The task last ran another version of the tool (§12.11): left to a live worker of that version for at most
        the lock duration from the first deferral; then the tool's ``on_version_change`` decides."""
        if await self._live_worker_serves(tool.name, recorded) and await self._within_window(task_id):
            try:
                await job.moveToDelayed(_now_ms() + VERSION_DEFER_MS, token)
                log.info(
                    "task last ran another tool version, which a live worker serves: left to it",
                    **{"from": recorded, "to": tool.version},
                )
            except Exception as error:  # noqa: BLE001
                log.info("job not deferred (its lock is gone); it is with, or returns to, the queue", err=error)
            raise DelayedError()
        policy = tool.on_version_change
        if policy == "fail":
            message = (
                f"Task {task_id} started on tool {tool.name} version {recorded}; this worker runs version "
                f"{tool.version} (onVersionChange: fail)"
            )
            await self._fail_task(task_id, lock, message, {"code": "VERSION_CHANGED", "message": message}, log)
            raise UnrecoverableError(message)
        log.warn(
            "task last ran another tool version: restarting it from the top (state, steps and answers cleared)"
            if policy == "restart"
            else "task last ran another tool version: resuming it with its state, steps and answers",
            **{"from": recorded, "to": tool.version, "onVersionChange": policy},
        )
        return policy

    async def _live_worker_serves(self, tool: str, version: str) -> bool:
        assert self._redis is not None
        ids = await self._redis.zrangebyscore(self.keys.workers, _now_ms(), "+inf")
        if not ids:
            return False
        for raw in await self._redis.mget([self.keys.worker_catalog(i) for i in ids]):
            try:
                catalog = json.loads(raw) if raw else None
            except ValueError:
                continue
            if not isinstance(catalog, dict):
                continue
            queue_name = catalog.get("queueName") or str(catalog.get("queue", "")).rsplit(".", 1)[0]
            if queue_name != self.config.queue:
                continue
            if any(
                isinstance(t, dict) and t.get("name") == tool and t.get("version") == version
                for t in catalog.get("tools", [])
            ):
                return True
        return False

    async def _within_window(self, task_id: str) -> bool:
        assert self._redis is not None
        key = self.keys.version_wait(task_id)
        now = _now_ms()
        window = self.config.lock_duration_ms
        await self._redis.set(key, str(now), px=window * 2, nx=True)
        first = await self._redis.get(key)
        return first is None or now - int(first) < window

    async def _suspend_job(self, job: Any, token: str, task_id: str, suspension: Suspension, log: Logger) -> Any:
        """The job waits in BullMQ's delayed set, holding no slot, until its answer or time (§12); no attempt used."""
        until = suspension.until + self.config.lock_duration_ms if suspension.kind == "input" else suspension.until
        try:
            await job.moveToDelayed(until, token)
        except Exception as error:  # noqa: BLE001
            log.info("suspended job not delayed (its lock is gone); it is with, or returns to, the queue", err=error)
            raise DelayedError() from None
        if suspension.kind == "input":
            try:
                task = await self.store.get(task_id)  # type: ignore[union-attr]
                # Every question answered (or the task ended) while suspending: nobody else will promote it.
                if task is None or task.status != "input_required":
                    await job.promote()
                    log.info("answered (or ended) while suspending; job promoted", inputRequest=suspension.n)
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the gateway's promote, or the delay, brings it back
                log.warn("could not re-check the task after suspending", err=error)
            log.info("run suspended until the input request is answered", inputRequest=suspension.n, until=until)
        elif suspension.waitpoint is not None:
            try:
                # Called (or ended) while the run was suspending: its promotion was refused, so promote here (§32.3).
                record = await self.store.read_waitpoint(task_id, suspension.waitpoint)  # type: ignore[union-attr]
                if record is None or record.get("state") != "waiting":
                    await job.promote()
                    log.info("waitpoint called (or ended) while suspending; job promoted", waitpoint=suspension.waitpoint)
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the waitpoint's timeout brings the job back
                log.warn("could not re-check the waitpoint after suspending", err=error)
            log.info("run suspended until its waitpoint is called", waitpoint=suspension.waitpoint, until=until)
        elif suspension.batch and self.batches is not None:
            try:
                # Its children may all have finished while it suspended, their promotions refused (it was active).
                if await self.batches.should_wake(task_id):
                    await job.promote()
                    log.info("batch children done while suspending; job promoted")
                    raise DelayedError()
            except DelayedError:
                raise
            except Exception as error:  # noqa: BLE001 - the poll brings the job back
                log.warn("could not re-check the batch after suspending; the poll brings the job back", err=error)
            log.debug("run suspended while its batch children run", until=until)
        else:
            log.info("run suspended", until=until)
        raise DelayedError()

    async def hand_back(self, job: Any, token: str, log: Logger, reason: str = "WORKER_SHUTDOWN") -> Any:
        """Puts the job back at the front of its queue without using an attempt (§5.7), and wakes idle workers."""
        keys = job.queue.keys
        source = _bullmq_command("moveJobFromActiveToWait-9.lua")
        script = job.queue.client.register_script(source)
        try:
            result = await script(
                keys=[keys[k] for k in ("active", "wait", "stalled", "paused", "meta", "limiter", "prioritized", "marker", "events")],
                args=[str(job.id), token, f"{keys['']}{job.id}"],
            )
            if isinstance(result, int) and result < 0:
                raise RuntimeError(f"moveJobFromActiveToWait answered {result}")
        except Exception as error:  # noqa: BLE001
            log.info("job not put back (its lock is gone); it is with, or returns to, the queue", err=error, reason=reason)
            raise DelayedError() from None
        log.info("job put back, at the front of its queue, for another worker", reason=reason)
        try:
            await job.queue.client.zadd(keys["marker"], {"0": 0})
        except Exception as error:  # noqa: BLE001
            log.debug("could not wake idle workers", err=error)
        raise DelayedError()

    async def _fail_task(
        self, task_id: str, lock: JobLock, message: str, error: dict, log: Logger, cause: BaseException | None = None
    ) -> None:
        assert self.store is not None
        fields: dict[str, Any] = {"statusMessage": message, "error": error}
        if error.get("code") != "PROTOCOL_ERROR":
            fields["result"] = {"content": [{"type": "text", "text": message}], "isError": True}
        written, status, lost = await self._write_end(task_id, "failed", fields, lock, log)
        if written:
            log.info("task failed", code=error.get("code"), statusMessage=message, **({"err": cause} if cause else {}))
        elif lost:
            self._lost_while_writing(log, "failure")
        else:
            log.info("task already terminal; failure lost", status=status or "missing", statusMessage=message)

    async def _stop_batch(self, task_id: str, log: Logger) -> None:
        """A cancelled parent's run removes its queued children and aborts its running ones (§26.7); no batch, no-op."""
        if self.batches is None:
            return
        try:
            await self.batches.stop_children(task_id)
        except Exception as error:  # noqa: BLE001 - the children's start check and the sweep stop them anyway
            log.warn("could not stop the batch children of a cancelled task", err=error)

    async def _ensure_cancelled(self, task_id: str, lock: JobLock, log: Logger) -> None:
        assert self.store is not None
        written, status, lost = await self._write_end(
            task_id, "cancelled", {"cancelReason": "CLIENT_CANCELLED", "statusMessage": "Cancelled"}, lock, log
        )
        if written:
            log.info("task was not terminal; marked cancelled")
        elif lost:
            self._lost_while_writing(log, "cancel")
        else:
            log.info("tool stopped; task already terminal", status=status or "missing")

    async def _write_end(self, task_id: str, to: str, fields: dict, lock: JobLock, log: Logger) -> Any:
        """A terminal write, through a Redis outage while the job's lock may still be this run's (§10.10)."""
        assert self.store is not None
        store = self.store
        what = {"completed": "result", "failed": "failure", "cancelled": "cancel"}.get(to, to)
        return await write_through_outage(
            lambda: store.transition(task_id, to, fields, lock), bull_lock_ms(self.config.lock_duration_ms), log, what
        )

    def _lost_while_writing(self, log: Logger, what: str) -> None:
        log.warn(f"{what} refused: this worker no longer holds the job; another run owns the task", reason="LOCK_LOST")
        raise DelayedError()

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
            self._abort(task_id, "WORKER_SHUTDOWN")
        try:
            await asyncio.wait_for(asyncio.gather(*closes, return_exceptions=True), timeout=30)
        except asyncio.TimeoutError:
            self.log.warn("BullMQ workers did not close in 30 s")
        for task in [*self._background, *self._bull_runs]:
            task.cancel()
        await asyncio.gather(*self._background, *self._bull_runs, return_exceptions=True)
        try:
            assert self._redis is not None
            async with self._redis.pipeline(transaction=not self.config.redis.cluster_nodes) as tx:
                tx.delete(self.keys.worker_catalog(self.worker_id))
                tx.zrem(self.keys.workers, self.worker_id)
                await tx.execute()
        except Exception as error:  # noqa: BLE001
            self.log.warn("could not remove the catalog", err=error)
        for queue in self._parent_queues.values():
            try:
                await queue.close()
            except Exception:  # noqa: BLE001
                pass
        await self._close_redis()
        self.log.info("worker stopped")

    async def _close_redis(self) -> None:
        for client in (self._redis, self._subscriber):
            if client is not None:
                try:
                    await client.aclose()
                except Exception:  # noqa: BLE001
                    pass


class _NoProgressStore:
    """A child reports no progress of its own: its parent's is the children's count (§26.3)."""

    def __init__(self, store: TaskStore) -> None:
        self._store = store

    async def record_progress(self, *_: Any) -> str:
        return "accepted"

    async def record_log(self, *_: Any) -> str:
        return "unrouted"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _child_record(job_id: str, tool: str) -> Any:
    from .store import TaskRecord

    return TaskRecord(task_id=job_id, status="working", principal="", tool=tool, fields={})


def _bullmq_command(file: str) -> str:
    """One of bullmq's own (resolved) Lua commands, from the installed package: never a copy of ours."""
    return (resources.files("bullmq") / "commands" / file).read_text(encoding="utf-8")


def _redacted(url: str) -> str:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


__all__ = ["ConfigError", "StartError", "TaskrelayWorker"]

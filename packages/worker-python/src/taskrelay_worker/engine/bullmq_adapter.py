"""Every use this worker makes of bullmq-Python's internals, in one place (issue 47 item 5), each named for the bullmq
behaviour it relies on; ``tests/test_bullmq_adapter.py`` holds one test per behaviour, so a bullmq upgrade that breaks
one fails there by name. bullmq is pinned (``BULLMQ_PAIR``, checked at start): these overrides are written against
bullmq 3.4.4's ``Worker`` (``moveToActive``, ``nextJobFromJobData`` and its ``limit_until``, ``processJob``,
``lockManager``, ``closing``/``forceClosing``), its ``LockManager`` (``tracked_jobs``, ``track_job``, ``closed``,
``close``), its queue keys (``keys[...]``, the ``limiter`` key written as its ``Queue.rateLimit`` does) and its own
Lua command ``moveJobFromActiveToWait-9``.

Hand-written: bullmq has no extension points for any of these; each is the smallest override that does the job."""

from __future__ import annotations

import asyncio
import json
import time
from importlib import metadata, resources
from typing import Any
from urllib.parse import unquote, urlparse

import bullmq
from bullmq.lock_manager import LockManager

from ..protocol import BULLMQ_PAIR

#: Stalls are counted per tool (``max_stalls``, §10.6), never by BullMQ.
BULLMQ_MAX_STALLED = 1_000_000_000
#: The key of the data a job gets when its stored data is not JSON: ``{UNREADABLE_JOB_DATA: reason}`` (issue 48 F5).
UNREADABLE_JOB_DATA = "taskrelay.unreadableJobData"
#: The keys ``moveJobFromActiveToWait-9`` takes, in its order (the ``-9`` of its name is their count).
MOVE_TO_WAIT_KEYS = ("active", "wait", "stalled", "paused", "meta", "limiter", "prioritized", "marker", "events")


def bullmq_mismatch() -> str | None:
    """Why the installed bullmq cannot run with this worker's scripts, or None when it is the paired version."""
    installed = metadata.version("bullmq")
    if installed == BULLMQ_PAIR["python"]:
        return None
    return (
        f"bullmq {installed} is installed, but this worker's scripts pair with bullmq {BULLMQ_PAIR['python']} "
        f"(Node bullmq {BULLMQ_PAIR['node']}): pip install bullmq=={BULLMQ_PAIR['python']}"
    )


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


def bullmq_command(file: str) -> str:
    """One of bullmq's own (resolved) Lua commands, from the installed package: never a copy of ours."""
    return (resources.files("bullmq") / "commands" / file).read_text(encoding="utf-8")


#: The lock manager renewing the lock of a job's run, set on the job by the GatedWorker running it, while it runs.
_RUN_LOCKS = "_taskrelay_run_locks"


async def move_to_wait(job: Any, token: str) -> None:
    """bullmq's own ``moveJobFromActiveToWait-9`` (which bullmq-Python does not expose): the job goes back to the front
    of its queue, holding its attempts, if ``token`` still holds its lock; raises otherwise (the command answers < 0).
    The run's lock is no longer renewed first: bullmq's lock manager renews every lock it tracks on its own timer, and
    tracks a job until its processJob ends, so a renewal that reached Redis just after the move found no lock, and the
    Worker said ``could not renew lock for job …`` of a job back in its queue as meant (1 of 300 hand-backs with a
    50-ms renewal; a drain's hand-backs at its grace's end). Node's ``moveToWait`` does the same."""
    locks = getattr(job, _RUN_LOCKS, None)
    if locks is not None:
        tracked = locks.tracked_jobs.get(str(job.id))
        if tracked is not None and tracked.get("token") == token:
            locks.untrack_job(str(job.id))
    keys = job.queue.keys
    script = job.queue.client.register_script(bullmq_command("moveJobFromActiveToWait-9.lua"))
    result = await script(keys=[keys[k] for k in MOVE_TO_WAIT_KEYS], args=[str(job.id), token, f"{keys['']}{job.id}"])
    if isinstance(result, int) and result < 0:
        raise RuntimeError(f"moveJobFromActiveToWait answered {result}")


#: 2**53 - 1, the count bullmq's ``Queue.rateLimit`` writes: more than any queue's ``max``.
LIMITER_HELD = 9007199254740991


async def hold_takes(job: Any, ms: int) -> None:
    """Holds the takes of ``job``'s queue for ``ms`` (PROTOCOL.md §3.3): the ``limiter`` key as bullmq's
    ``Queue.rateLimit`` writes it (a count of at least the queue's ``max``, with that TTL), for the queue the job came
    from (its shard's, in the sharded layout), over the connection its Worker already holds; and the queue's marker due
    when the hold ends (bullmq's delayed-job marker, member "1", never moved later). bullmq-Python's Worker keeps no
    timer of a rate limit: it blocks on the marker, and without this one it would sleep until its block timeout."""
    hold_ms = max(1, int(ms))
    keys = job.queue.keys
    # One round trip; no transaction (a cluster client's pipeline may not take one): each write stands alone.
    pipe = job.queue.client.pipeline(transaction=False)
    pipe.set(keys["limiter"], LIMITER_HELD, px=hold_ms)
    pipe.zadd(keys["marker"], {"1": int(time.time() * 1000) + hold_ms}, lt=True)
    await pipe.execute()


async def wake_idle_workers(client: Any, keys: dict) -> None:
    """Sets the queue's marker (bullmq's "a job is waiting"): an idle worker blocked on it wakes and fetches."""
    await client.zadd(keys["marker"], {"0": 0})


async def promote(queue: bullmq.Queue, job_id: str) -> None:
    """Moves a delayed job to its queue's wait list now (bullmq's ``promote`` command, through the queue's backend)."""
    await queue.backend.promote(job_id)


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
                await wake_idle_workers(self.client, self.keys)
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

    async def nextJobFromJobData(  # noqa: N802
        self, job_data: Any = None, job_id: Any = None, limit_until: Any = 0, delay_until: Any = 0, token: Any = None
    ):
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
        elif limit_until and int(limit_until) > 0:
            # The take found the queue rate-limited for ``limit_until`` ms (BullMQ's limiter, the pacer of §3.3).
            # Node's Worker sleeps that long and takes again; bullmq-Python keeps the value unused and blocks on the
            # marker for its drain delay (5 s). Blocking until the limit ends does what Node's does.
            delay_until = max(int(delay_until or 0), int(time.time() * 1000) + int(limit_until))
        return await super().nextJobFromJobData(job_data, job_id, limit_until, delay_until, token)

    async def processJob(self, job: Any, token: str):  # noqa: N802
        setattr(job, _RUN_LOCKS, self.lockManager)
        try:
            return await super().processJob(job, token)
        finally:
            setattr(job, _RUN_LOCKS, None)
            self._gate.release()
            # bullmq tracks locks by job id: a run handed back here and taken again here at once (its marker woke
            # this worker) was just untracked by the end of the old run. Track the new run's lock again, or it would
            # not be renewed and another worker would take the job over.
            current = self._current_token(str(job.id))
            if current is not None and current != token:
                self.lockManager.track_job(str(job.id), current, int(time.time() * 1000))

"""The queues this worker wakes jobs in that it does not consume (batch parents §26.4, limit waiters §3.5), as the
Node worker's ``engine/batch-queues.ts``: one bullmq Queue per pool, opened when first needed, closed with the worker."""

from __future__ import annotations

from typing import Any

import bullmq

from ..keys import Keys
from ..log import Logger
from .bullmq_adapter import promote
from .redis_clients import bull_options


class BatchQueues:
    """The woken queues of ``TaskrelayWorker`` (a part of it)."""

    _parent_queues: dict[tuple[str, str], bullmq.Queue]

    def _queue_of(self, pool: str, job_id: str, keys: Keys | None = None) -> Any:
        """A queue this worker wakes jobs in (batch parents, limit waiters) or adds a batch's children to, one per pool
        and shard, closed with the worker: the shard of the job id, or of ``keys`` when given (a batch child's shard,
        which its id does not name, §26.10)."""
        keys = keys if keys is not None else self.keys.for_task(job_id)
        queue = self._parent_queues.get((pool, keys.bull_prefix))
        if queue is None:
            queue = bullmq.Queue(keys.queue_name(pool), {"connection": bull_options(self.config.redis), "prefix": keys.bull_prefix})
            self._parent_queues[(pool, keys.bull_prefix)] = queue
        return queue

    async def _promote(self, pool: str, job_id: str, log: Logger) -> bool:
        """Wakes a batch parent's delayed job in its queue (§26.4)."""
        try:
            await promote(self._queue_of(pool, job_id), job_id)
            log.debug("job promoted", jobId=job_id)
            return True
        except Exception as error:  # noqa: BLE001 - not delayed (still running, or woken already): its poll finds it
            log.debug("job not promoted", jobId=job_id, err=error)
            return False

    async def _stop_batch(self, task_id: str, log: Logger) -> None:
        """A cancelled parent's run removes its queued children and aborts its running ones (§26.7); no batch, no-op."""
        if self.batches is None:
            return
        try:
            await self.batches.stop_children(task_id)
        except Exception as error:  # noqa: BLE001 - the children's start check and the sweep stop them anyway
            log.warn("could not stop the batch children of a cancelled task", err=error)

    async def _close_queues(self) -> None:
        for queue in self._parent_queues.values():
            try:
                await queue.close()
            except Exception:  # noqa: BLE001
                pass

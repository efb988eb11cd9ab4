"""A run's terminal write through a Redis Cluster failover (PROTOCOL.md §10.10), as the Node worker does it: what a
cluster raises meanwhile counts as Redis lost, and the write is tried again while the job's lock may still be the
run's, then given up with a line naming what was lost."""

import asyncio
import io
import json
from types import SimpleNamespace

import pytest
from redis import exceptions as redis_errors

from taskrelay_worker.engine import TaskrelayWorker, is_redis_loss
from taskrelay_worker.log import Logger
from taskrelay_worker.store import JobLock


def test_failover_errors_are_redis_loss_and_answers_are_not():
    lost = [
        redis_errors.ConnectionError("Connection closed by server."),
        redis_errors.TimeoutError("Timeout reading from socket"),
        redis_errors.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis_errors.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        redis_errors.ClusterError("TTL exhausted."),
        redis_errors.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis_errors.ResponseError("CLUSTERDOWN Hash slot not served"),
        redis_errors.ResponseError("MOVED 3999 127.0.0.1:6381"),
        redis_errors.ResponseError("UNBLOCKED force unblock from blocking operation"),
    ]
    for error in lost:
        assert is_redis_loss(error), repr(error)
    assert not is_redis_loss(redis_errors.ResponseError("ERR wrong number of arguments"))
    assert not is_redis_loss(redis_errors.ResponseError("NOSCRIPT No matching script"))
    assert not is_redis_loss(ValueError("boom"))


class FlakyStore:
    """A store whose transition fails with a failover error `failures` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries = 0

    async def transition(self, task_id, to, fields, lock):  # noqa: ANN001 - the store's signature
        self.tries += 1
        if self.tries <= self.failures:
            raise redis_errors.ClusterDownError("CLUSTERDOWN The cluster is down")
        return True, to, False


def write_end(store: FlakyStore, lock_duration_ms: int) -> tuple[object, list[dict]]:
    out = io.StringIO()
    fake = SimpleNamespace(store=store, config=SimpleNamespace(lock_duration_ms=lock_duration_ms))
    log = Logger("info", stream=out)
    try:
        result: object = asyncio.run(
            TaskrelayWorker._write_end(fake, "t1", "completed", {"result": {}}, JobLock("q", "tok"), log)  # type: ignore[arg-type]
        )
    except Exception as error:  # noqa: BLE001 - the test reads it
        result = error
    return result, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_result_write_is_tried_again_through_a_failover_and_says_so():
    store = FlakyStore(failures=3)
    result, lines = write_end(store, lock_duration_ms=30_000)
    assert result == (True, "completed", False)
    assert store.tries == 4
    assert [line["msg"] for line in lines] == [
        "result write failed: Redis unreachable; retrying while this run may still hold the job lock",
        "result written after Redis answered again",
    ]
    assert lines[1]["retries"] == 3


def test_a_result_write_is_given_up_once_the_lock_cannot_be_the_runs_naming_the_loss():
    store = FlakyStore(failures=1_000)
    result, lines = write_end(store, lock_duration_ms=600)
    assert isinstance(result, redis_errors.ClusterDownError)
    assert store.tries >= 2
    assert lines[-1]["msg"] == (
        "result lost: Redis unreachable for as long as this run could hold the job lock; "
        "the job returns to the queue and runs again"
    )
    assert lines[-1]["reason"] == "REDIS_UNAVAILABLE"


@pytest.mark.parametrize("failures", [0])
def test_a_write_that_answers_at_once_logs_nothing(failures):
    result, lines = write_end(FlakyStore(failures), lock_duration_ms=30_000)
    assert result == (True, "completed", False)
    assert lines == []

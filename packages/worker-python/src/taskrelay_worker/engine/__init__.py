"""The worker engine, one module per part as the Node worker's ``packages/worker/src/engine`` (PROTOCOL.md §29):
``task_worker`` starts and drains it; the rest are its parts, named after their Node siblings."""

from ..config import ConfigError
from .bullmq_adapter import bull_connection
from .end_write import bull_lock_ms, is_redis_loss, write_through_outage
from .redis_clients import bull_options, make_client
from .task_worker import StartError, TaskrelayWorker

__all__ = [
    "ConfigError",
    "StartError",
    "TaskrelayWorker",
    "bull_connection",
    "bull_lock_ms",
    "bull_options",
    "is_redis_loss",
    "make_client",
    "write_through_outage",
]

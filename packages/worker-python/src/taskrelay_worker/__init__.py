"""taskrelay workers in Python: tools served from the same BullMQ queues, task store and protocol as the Node
workers (docs/PYTHON.md)."""

from .context import ToolContext
from .errors import NonRetryableError, RetryAfterError, SuspendedError, TaskCancelledError, TaskrelayError
from .tools import ToolDefinition, define_tool, tool
from .waitpoints import Waitpoint

__all__ = [
    "NonRetryableError",
    "RetryAfterError",
    "SuspendedError",
    "TaskCancelledError",
    "TaskrelayError",
    "ToolContext",
    "ToolDefinition",
    "Waitpoint",
    "define_tool",
    "tool",
]

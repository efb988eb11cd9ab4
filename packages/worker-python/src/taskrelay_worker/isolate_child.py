"""The child of an isolated run (PROTOCOL.md §31, §29.5): ``python -m taskrelay_worker.isolate_child``, started by the
worker for one run. It reads ``start`` from stdin, loads the tool's module, bounds its own memory, runs the handler
with a ``ChildContext`` and writes its end. Messages go to the worker on the process's original stdout; what the tool
prints goes to stderr. Nothing here talks to Redis: every write is the worker's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from .errors import SuspendedError
from .isolate_context import ChildContext
from .isolate_messages import encode, to_wire_error
from .protocol import ERROR

#: Set in the environment of an isolated run's child: the worker refuses to start there (§31.4).
ISOLATED_CHILD_ENV = "TASKRELAY_ISOLATED_CHILD"


class _Channel:
    """The child's side of the pipe pair: lines out (written at once, so a handler that never yields still reports)
    and the worker's messages in."""

    def __init__(self, out_fd: int) -> None:
        self._out = out_fd
        self.closed = False

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        if self.closed:
            return
        try:
            while data:
                written = os.write(self._out, data)
                data = data[written:]
        except (BrokenPipeError, OSError):
            # The worker is gone (SIGKILLed): nobody to report to; the run's job is taken over (§10.5).
            self.closed = True
            os._exit(0)


def _load_tool(module: str, name: str) -> Any:
    from .__main__ import load_tools

    tool = next((t for t in load_tools(module) if t.name == name), None)
    if tool is None:
        from .errors import NonRetryableError

        raise NonRetryableError(f"Tool {name} is isolated, but its module {module} defines no tool of that name")
    return tool


def _bound_memory(max_memory_mb: Any) -> None:
    """The run's memory bound (§29.5): the address space the child has now (the interpreter and the tool's module),
    plus ``max_memory_mb``. An allocation past it raises ``MemoryError`` in the handler."""
    if not isinstance(max_memory_mb, int) or isinstance(max_memory_mb, bool):
        return
    import resource

    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + max_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


async def _main(channel: _Channel) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    first = await reader.readline()
    start = json.loads(first)["start"]
    try:
        tool = _load_tool(start["module"], start["tool"])
    except BaseException as error:  # noqa: BLE001 - the worker fails the run with it
        channel.send({"t": "end", "settled": {"ok": False, "error": to_wire_error(error)}})
        return
    ctx = ChildContext(start, channel)

    async def listen() -> None:
        while True:
            line = await reader.readline()
            if not line:
                # The worker is gone: nobody to report to (§31.3).
                os._exit(0)
            try:
                ctx.receive(json.loads(line))
            except ValueError:
                continue

    listener = asyncio.ensure_future(listen())
    settled: dict[str, Any]
    try:
        args = tool.parse_arguments(start["input"])
        _bound_memory(start.get("maxMemoryMb"))
        from .isolate import IsolatedHandler

        handler = tool.run.handler if isinstance(tool.run, IsolatedHandler) else tool.run
        value = await handler(args, ctx)
        if hasattr(value, "model_dump") and callable(value.model_dump):
            value = value.model_dump(mode="json")
        settled = {"ok": True, "value": value}
    except (Exception, SuspendedError) as error:  # noqa: BLE001 - every end crosses to the worker
        settled = {"ok": False, "error": to_wire_error(error)}
    listener.cancel()
    try:
        channel.send({"t": "end", "settled": settled})
    except (TypeError, ValueError) as error:
        channel.send({"t": "end", "settled": {"ok": False, "error": {"name": "NonRetryableError", "message": f"Tool {tool.name} returned a value that is not JSON: {error}", "code": ERROR.NON_RETRYABLE}}})


def main() -> None:
    os.environ[ISOLATED_CHILD_ENV] = "1"
    # Messages go on the original stdout; anything else written to fd 1 (a print in the tool) goes to stderr.
    channel = _Channel(os.dup(1))
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    asyncio.run(_main(channel))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

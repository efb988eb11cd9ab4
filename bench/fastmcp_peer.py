"""The second peer of ``pnpm bench --sdk --fastmcp`` (issue 37): FastMCP with its background tasks on Docket.

A FastMCP 4.x server over Streamable HTTP serving the same no-op as the benchmark's workers (``bench_noop``), declared
``task=True``: FastMCP's tasks extension (``fastmcp_tasks.TasksExtension``, SEP-2663, the 2026-07-28 tasks) runs a
task call through Docket on the bench's own Redis, with Docket's worker inside this process (FastMCP starts it in the
extension's lifespan). A call without a task runs the tool at once, without Docket.

FastMCP 4 serves tasks on the 2026-07-28 era only: its ``tasks/get`` / ``tasks/update`` / ``tasks/cancel`` exist
there and nowhere else, so a 2025-11-25 client (SDK 1.32.2's ``callToolStream``) gets plain calls from it.

Environment: PORT (default 3200), BENCH_DOCKET_URL (default ``memory://``; the bench passes its Redis with a db of
its own), BENCH_DOCKET_NAME (Docket's queue name, the prefix of its keys), BENCH_POLL_INTERVAL_MS (the
``pollIntervalMs`` suggested to clients; FastMCP's default is 5000, the bench sets taskrelay's 50 for a young task),
BENCH_DOCKET_CONCURRENCY (Docket's worker slots, default 64 like the taskrelay worker's). GET /healthz answers 200.

Run from the bench's own virtualenv (``.venv-bench``, bench/fastmcp-requirements.txt), never the worker's ``.venv``.
"""

import os
from datetime import timedelta

from fastmcp import FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from starlette.requests import Request
from starlette.responses import JSONResponse

port = int(os.environ.get("PORT", "3200"))
poll_interval = timedelta(milliseconds=int(os.environ.get("BENCH_POLL_INTERVAL_MS", "50")))

mcp = FastMCP("fastmcp-peer")
mcp.add_extension(
    TasksExtension(
        url=os.environ.get("BENCH_DOCKET_URL", "memory://"),
        name=os.environ.get("BENCH_DOCKET_NAME", "bench-fastmcp"),
        concurrency=int(os.environ.get("BENCH_DOCKET_CONCURRENCY", "64")),
    )
)


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=poll_interval))
async def bench_noop() -> str:
    """Does nothing and returns at once."""
    return "ok"


@mcp.custom_route("/healthz", methods=["GET"])
async def healthz(_request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=port, path="/mcp", log_level="warning", show_banner=False)

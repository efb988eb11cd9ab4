"""Isolated tools for test_isolate.py: each run is a child process (PROTOCOL.md §31, §29.5)."""

import os

from taskrelay_worker import tool


@tool(name="iso_echo", description="Reports progress, logs, returns its pid.", isolate=True)
async def iso_echo(args, ctx):
    ctx.log.info("in the child", child=os.getpid())
    await ctx.progress(1, 2, "half")
    await ctx.state.set({"seen": True})
    print("a print goes to stderr")
    return {"pid": os.getpid(), "state": ctx.state.get(), "task": ctx.task_id}


@tool(name="iso_hog", description="Allocates past its bound.", isolate=True, max_memory_mb=96)
async def iso_hog(args, ctx):
    held = [bytearray(16 * 1024 * 1024) for _ in range(64)]
    return {"held": len(held)}


@tool(name="iso_crash", description="Exits without a result.", isolate=True)
async def iso_crash(args, ctx):
    os._exit(3)


@tool(name="iso_spin", description="Spins without yielding.", isolate=True, kill_grace_ms=200)
async def iso_spin(args, ctx):
    await ctx.progress(1, None, str(os.getpid()))
    while True:
        pass


@tool(name="iso_ask", description="Asks; the question crosses to the worker.", isolate=True)
async def iso_ask(args, ctx):
    return await ctx.elicit("Name?", {"type": "object", "properties": {"name": {"type": "string"}}})

"""Tools the benchmark serves from a Python worker (the "Python worker" rows of ``pnpm bench``): the same no-op as
bench/bench-tools.mjs's ``bench_noop``, so the row measures what is around a tool in each language."""

from taskrelay_worker import tool


@tool(name="bench_noop", description="Does nothing and returns at once.", input_schema={"type": "object"})
async def bench_noop(args, ctx):
    return "ok"

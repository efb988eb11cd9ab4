"""A CPU-bound "train" tool for taskrelay's Python worker: fits a small logistic regression on synthetic data, one
progress update per epoch, and stops at the next epoch when the task is cancelled.

    TASKRELAY_TOOLS=examples/python-worker/train.py REDIS_URL=redis://127.0.0.1:6379 python -m taskrelay_worker

Each epoch runs in a thread (``asyncio.to_thread``): the event loop stays free to renew the job's lock, receive a
cancel and write progress while the CPU works. The model so far is kept with ``ctx.state``, so a run taken over after
a crash, or handed back at a deploy, resumes from the last finished epoch instead of from zero.
"""

from __future__ import annotations

import asyncio
import math
import random

from pydantic import BaseModel, Field

from taskrelay_worker import tool


class TrainArgs(BaseModel):
    epochs: int = Field(10, ge=1, le=1000, description="Passes over the data")
    samples: int = Field(2000, ge=10, le=200_000, description="Synthetic examples to fit")
    learning_rate: float = Field(0.5, gt=0, le=10)
    seed: int = Field(7, description="Same seed, same data, same model")


def make_data(samples: int, seed: int) -> list[tuple[float, float, int]]:
    rng = random.Random(seed)
    data = []
    for _ in range(samples):
        x1, x2 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        data.append((x1, x2, 1 if 2 * x1 - x2 + rng.gauss(0, 0.3) > 0 else 0))
    return data


def epoch(weights: list[float], data: list[tuple[float, float, int]], rate: float) -> tuple[list[float], float]:
    """One pass of gradient descent: the CPU-bound part, run off the event loop."""
    w0, w1, b = weights
    g0 = g1 = gb = loss = 0.0
    for x1, x2, y in data:
        p = 1 / (1 + math.exp(-(w0 * x1 + w1 * x2 + b)))
        g0 += (p - y) * x1
        g1 += (p - y) * x2
        gb += p - y
        loss -= math.log(p if y else 1 - p + 1e-12)
    n = len(data)
    return [w0 - rate * g0 / n, w1 - rate * g1 / n, b - rate * gb / n], loss / n


@tool(
    name="train",
    description="Trains a small logistic regression on synthetic data; reports each epoch and honours cancel.",
    input_schema=TrainArgs,
    task_support="optional",
    timeout_ms=3_600_000,
    concurrency=4,
)
async def train(args: TrainArgs, ctx):
    data = make_data(args.samples, args.seed)
    saved = ctx.state.get() or {}
    weights, done = saved.get("weights", [0.0, 0.0, 0.0]), saved.get("epoch", 0)
    if done:
        await ctx.progress(done, args.epochs, f"resumed after epoch {done}")
    loss = saved.get("loss")
    for e in range(done + 1, args.epochs + 1):
        ctx.throw_if_cancelled()
        weights, loss = await asyncio.to_thread(epoch, weights, data, args.learning_rate)
        await ctx.state.set({"weights": weights, "epoch": e, "loss": loss})
        await ctx.progress(e, args.epochs, f"epoch {e}/{args.epochs}: loss {loss:.4f}")
    accuracy = sum(1 for x1, x2, y in data if (weights[0] * x1 + weights[1] * x2 + weights[2] > 0) == bool(y)) / len(data)
    return {"epochs": args.epochs, "loss": round(loss or 0.0, 6), "accuracy": round(accuracy, 4), "weights": weights}

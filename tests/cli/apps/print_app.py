"""Prints each of 20 numbers on stdout, and after each says so on stderr."""

from __future__ import annotations

import sys

import flowkit

app = flowkit.App("printer")
numbers = app.topic("numbers", value_type=int)


@app.task
async def submit() -> None:
    for n in range(20):
        await numbers.send(n)


@app.agent(numbers)
async def echo(stream: flowkit.Stream[int]) -> None:
    async for n in stream:
        print(f"number {n}", flush=True)
        print(f"printed {n}", file=sys.stderr, flush=True)

"""Declares an agent over a topic that is never declared, and writes the wrong type."""

from __future__ import annotations

from collections.abc import AsyncIterator

import flowkit

app = flowkit.App("problems")
names = app.topic("names", value_type=str)


@app.agent("nowhere")
async def lost(stream: flowkit.Stream[str]) -> None:
    async for _ in stream:
        pass


@app.agent(names, sink=["counts"])
async def count(stream: flowkit.Stream[str]) -> AsyncIterator[int]:
    async for name in stream:
        yield len(name)


lengths = app.topic("lengths", value_type=str)


@app.agent(names, name="measure", sink=[lengths])
async def measure(stream: flowkit.Stream[str]) -> AsyncIterator[int]:
    async for name in stream:
        yield len(name)

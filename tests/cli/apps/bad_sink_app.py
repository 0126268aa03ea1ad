"""Declares an agent whose sink is a number: refused where it is declared (line 11)."""

from collections.abc import AsyncIterator

import flowkit

app = flowkit.App("bad-sink")
numbers = app.topic("numbers", value_type=int)


@app.agent(numbers, sink=42)
async def double(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
    async for n in stream:
        yield n * 2

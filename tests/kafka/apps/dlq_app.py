"""An app whose agent rejects odd numbers: a dead-letter source for the dlq CLI tests."""

from __future__ import annotations

import flowkit

app = flowkit.App("dlqtest")
numbers = app.topic("dlq-numbers", value_type=int)


@app.agent(numbers)
async def evens_only(stream: flowkit.Stream[int]) -> None:
    async for n in stream:
        if n % 2:
            raise ValueError(f"{n} is odd")

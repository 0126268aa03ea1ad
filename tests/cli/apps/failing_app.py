"""An agent with a bug: it fails on every record. The failure guard stops the worker."""

import flowkit

app = flowkit.App("failing")
numbers = app.topic("numbers", value_type=int)


@app.task
async def submit() -> None:
    for n in range(1500):
        await numbers.send(n)


@app.agent(numbers)
async def total(stream: flowkit.Stream[int]) -> None:
    async for n in stream:
        raise ZeroDivisionError(f"{n} / 0")

"""An agent that echoes to a topic's name instead of the topic: the worker stops on it."""

import flowkit

app = flowkit.App("echo-name")
numbers = app.topic("numbers", value_type=int)
evens = app.topic("evens", value_type=int)


@app.task
async def submit() -> None:
    await numbers.send(2)


@app.agent(numbers)
async def copy(stream: flowkit.Stream[int]) -> None:
    async for _ in stream.echo("evens"):  # type: ignore[arg-type]
        pass

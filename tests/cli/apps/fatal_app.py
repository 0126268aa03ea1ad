"""An agent that raises something flowkit cannot handle: the worker stops on it."""

import flowkit


class Meltdown(BaseException):
    """Not an Exception: no error policy catches it."""


app = flowkit.App("fatal")
numbers = app.topic("numbers", value_type=int)


@app.task
async def submit() -> None:
    await numbers.send(1)


@app.agent(numbers)
async def explode(stream: flowkit.Stream[int]) -> None:
    async for _ in stream:
        raise Meltdown("the reactor is on fire")

"""An agent with a bug on some records: a third of them divide by zero."""

import flowkit

app = flowkit.App("flaky")
numbers = app.topic("numbers", value_type=int)


@app.task
async def submit() -> None:
    for n in range(1, 13):
        await numbers.send(n)


def share(n: int) -> float:
    return 100 / (n % 3)  # the bug: n % 3 is 0 for every third number


@app.agent(numbers, per_record=True)
def divide(n: int) -> None:
    print(n, share(n))

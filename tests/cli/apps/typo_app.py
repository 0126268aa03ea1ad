"""An agent writes ``big_orders`` while another reads ``big-orders``: a misspelt name."""

from __future__ import annotations

from collections.abc import AsyncIterator

import flowkit

app = flowkit.App("typo")
orders = app.topic("orders", value_type=int, external=True)
written = app.topic("big_orders", value_type=int)
read = app.topic("big-orders", value_type=int)


@app.agent(orders, sink=[written])
async def find_big(stream: flowkit.Stream[int]) -> AsyncIterator[int]:
    async for amount in stream:
        if amount >= 100:
            yield amount


@app.agent(read)
async def alert(stream: flowkit.Stream[int]) -> None:
    async for amount in stream:
        print("big order", amount)


audit = app.topic("audit-log", value_type=int)  # written by name, below: not warned of


@app.agent(orders, name="route")
async def route(stream: flowkit.Stream[int]) -> AsyncIterator[flowkit.Output]:
    async for amount in stream:
        yield flowkit.Output(amount, to="audit-log")

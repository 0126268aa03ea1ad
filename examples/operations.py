"""Operations: a shop's orders, counted and summed, to watch from the web page and the CLI.

Run it with the web endpoint, then open http://127.0.0.1:9100/ :

    flowkit worker examples.operations:app --web-port 9100

A task produces about 500 orders a second. The ``tally`` agent counts orders per
customer in a table, sums revenue per customer in one-minute windows, counts big orders
in the app's own metric ``shop_big_orders_total`` (by country), and forwards big orders
to the ``big-orders`` topic, which the ``audit`` agent reads.

    curl -s localhost:9100/tables/orders_per_customer/c7
    curl -s localhost:9100/metrics | grep -E 'shop_big_orders|flowkit_consumer_lag'
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import flowkit

COUNTRIES = ["de", "fr", "nl", "pl", "se"]


class Order(flowkit.Record):
    id: int
    customer: str
    country: str
    total: float


app = flowkit.App("shop", partitions=4)
orders = app.topic("orders", value_type=Order, key_type=str)
big_orders = app.topic("big-orders", value_type=Order, key_type=str)
orders_per_customer = app.table("orders_per_customer", default=int)
revenue = app.table("revenue_per_minute", default=float).tumbling(60.0, expires=3600.0)
big = app.metrics.counter("shop_big_orders", "Orders over 500, by country", ["country"])


@app.task
async def shoppers() -> None:
    """About 500 orders a second from 50 customers, with the wall clock's timestamps."""
    rng = random.Random(3)
    n = 0
    while True:
        for _ in range(50):
            n += 1
            customer = f"c{rng.randint(1, 50)}"
            order = Order(n, customer, rng.choice(COUNTRIES), round(rng.uniform(5, 900), 2))
            await orders.send(order, key=customer)
        await asyncio.sleep(0.1)


@app.agent(orders, sink=[big_orders])
async def tally(stream: flowkit.Stream[Order]) -> AsyncIterator[Order]:
    """Count and sum per customer; pass big orders on."""
    async for order in stream:
        orders_per_customer[order.customer] += 1
        revenue[order.customer] += order.total
        if order.total > 500:
            big.labels(order.country).inc()
            yield order


@app.agent(big_orders)
async def audit(stream: flowkit.Stream[Order]) -> None:
    """Read the big orders (a second agent, so the page has a pipeline to draw)."""
    async for _ in stream:
        pass

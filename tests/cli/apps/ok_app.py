"""A valid app, a factory for it, and attributes that are not apps."""

from __future__ import annotations

from collections.abc import AsyncIterator

import flowkit


class Order(flowkit.Record):
    id: str
    amount: int


def make_app() -> flowkit.App:
    shop = flowkit.App("shop")
    orders = shop.topic("orders", value_type=Order, partitions=3)
    big = shop.topic("orders.big-ones", value_type=Order)

    @shop.agent(orders, sink=[big])
    async def pick_big(stream: flowkit.Stream[Order]) -> AsyncIterator[Order]:
        async for order in stream:
            if order.amount > 100:
                yield order

    @shop.timer(5.0)
    async def heartbeat() -> None:
        pass

    return shop


app = make_app()
not_an_app = 42
nested = type("Nested", (), {"app": app})


def needs_arguments(name: str) -> flowkit.App:
    return flowkit.App(name)


async def async_factory() -> flowkit.App:
    return flowkit.App("never")


def returns_a_string() -> str:
    return "shop"


def raises() -> flowkit.App:
    raise RuntimeError("no config file")


remote = flowkit.App("remote", broker="kafka://127.0.0.1:9")  # nothing listens there
remote.topic("events")
bad_broker = flowkit.App("bad-broker", broker="amqp://localhost")

"""Kafka allows a header whose value is null; every transport must carry one and every
path that re-sends a record's headers (a dead letter above all) must survive one."""

from __future__ import annotations

import pytest

import flowkit
from tests.conftest import EVERY_BROKER, DriverFactory


class Order(flowkit.Record):
    id: int
    amount: float


@pytest.mark.parametrize("make_driver", EVERY_BROKER, indirect=True)
async def test_a_malformed_record_with_a_null_header_is_dead_lettered(
    make_driver: DriverFactory,
) -> None:
    app = flowkit.App("nullh")
    orders = app.topic("orders", value_type=Order, partitions=1)
    seen: list[int] = []

    @app.agent(orders)
    async def handle(stream: flowkit.Stream[Order]) -> None:
        async for order in stream:
            seen.append(order.id)

    async with make_driver(app) as driver:
        await driver.send_raw(orders, b"not json", key=b"k", headers=(("x", None),))
        await driver.send(orders, Order(id=1, amount=2.0), headers=(("x", None),))
        await driver.run_until_idle()
        (letter,) = await driver.dead_letters()
        assert seen == [1]
    assert letter.value == b"not json"
    headers = dict(letter.headers)
    assert headers["x"] is None
    assert headers["flowkit.error.type"] == b"DecodeError"
    assert headers["flowkit.source.offset"] == b"0"

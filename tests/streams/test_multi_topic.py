"""Agents over several topics: one stream of both, each value of its own type."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import flowkit
from tests.conftest import DriverFactory


class Order(flowkit.Record):
    id: str
    amount: int


class Refund(flowkit.Record):
    order_id: str
    amount: int


def make_app() -> tuple[flowkit.App, flowkit.Topic[Order], flowkit.Topic[Refund]]:
    app = flowkit.App("multi", partitions=4)
    orders = app.topic("orders", value_type=Order)
    refunds = app.topic("refunds", value_type=Refund)
    return app, orders, refunds


async def test_one_agent_reads_two_topics_with_their_types(make_driver: DriverFactory) -> None:
    app, orders, refunds = make_app()
    out = app.topic("ledger", value_type=str)
    balance = app.table("balance", default=int)

    @app.agent([orders, refunds], sink=[out])
    async def ledger(stream: flowkit.Stream[Order | Refund]) -> AsyncIterator[str]:
        async for event in stream.events():
            value = event.value
            if isinstance(value, Order):
                balance[value.id] += value.amount
            else:
                balance[value.order_id] -= value.amount
            assert stream.current is not None and stream.current.topic == event.topic
            yield f"{event.topic}:{type(value).__name__}"

    async with make_driver(app) as driver:
        for i in range(8):
            await driver.send(orders, Order(f"o{i}", 100), key=f"o{i}")
        for i in range(0, 8, 2):
            await driver.send(refunds, Refund(f"o{i}", 30), key=f"o{i}")
        await driver.run_until_idle()
        got = sorted(await driver.values(out))
        assert got == sorted(["orders:Order"] * 8 + ["refunds:Refund"] * 4)
        store = driver.store(balance)
        assert {k: store[k] for k in store} == {
            f"o{i}": 70 if i % 2 == 0 else 100 for i in range(8)
        }


def test_graph_shows_every_topic_an_agent_reads() -> None:
    app, orders, _ = make_app()

    @app.agent([orders, "refunds"])
    async def both(stream: flowkit.Stream[Order | Refund]) -> None:
        async for _ in stream:
            pass

    edges = {(e.source, e.target, e.kind) for e in app.graph().edges}
    assert ("topic:orders", "agent:both", "reads") in edges
    assert ("topic:refunds", "agent:both", "reads") in edges
    assert app.graph().check() == []


def test_check_names_undeclared_and_not_co_partitioned_topics() -> None:
    app, orders, _ = make_app()
    narrow = app.topic("narrow", value_type=Refund, partitions=2)
    totals = app.table("totals", default=int)

    @app.agent([orders, narrow, "nowhere"])
    async def mixed(stream: flowkit.Stream[Order | Refund]) -> None:
        async for value in stream:
            totals[getattr(value, "id", "")] += 1

    problems = app.graph().check()
    assert any("'nowhere', which is never declared" in p for p in problems)
    assert any("reads 'narrow' (2 partitions) and uses table 'totals'" in p for p in problems)
    assert not any("reads 'orders'" in p for p in problems)


def test_a_topic_read_twice_is_a_definition_error() -> None:
    app, orders, _ = make_app()
    with pytest.raises(flowkit.DefinitionError, match="reads a topic twice"):

        @app.agent([orders, "orders"])
        async def twice(stream: flowkit.Stream[Order]) -> None:
            pass
